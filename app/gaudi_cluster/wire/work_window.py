"""Runs in the master and in every node relay: a rank's typical work per step, the median of its
last WINDOW timed steps with the warm-up left out. Pure.

Both ends compute it with this one function, so a relay's summary gives the master the figure its
own per-rank bookkeeping would have given (tests/unit/test_node_summary.py holds them equal).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

WINDOW = 8
WARMUP_STEPS = 3  # first steps (graph compile, allocator, caches) say nothing about a device's speed
RECENT_WORK = 16  # the (step, seconds) pairs kept per rank: WINDOW after the warm-up, with room


def window_median(recent: Sequence[tuple[int, float]]) -> float | None:
    """The median of the last WINDOW timed steps past the warm-up; None below 3 of them."""
    tail = recent[-WINDOW:]
    if not tail or tail[0][0] <= WARMUP_STEPS:  # warm-up steps among them: leave those out
        tail = tuple((step, s) for step, s in recent if step > WARMUP_STEPS)[-WINDOW:]
    seconds = [s for _, s in tail]
    return statistics.median(seconds) if len(seconds) >= 3 else None
