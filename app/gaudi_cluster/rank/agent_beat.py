"""Runs in the rank agent: its beat, from the progress file its rank writes (train/ writes it). Pure.

Whatever the file holds (a rank's own program may write it), the beat carries only well-formed
fields, and each step's work time once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.fields import MAX_INT, is_number
from gaudi_cluster.wire.messages import Beat


def beat(
    progress: Mapping[str, Any] | None, sent_upto: int, output_age: float, now: float, last_line: str | None
) -> tuple[Beat, int]:
    """An agent's beat from its rank's progress file (None: the rank writes none) and the last step
    whose work time it carries: each step's work time is sent once."""
    line = last_line[: protocol.LAST_LINE_CHARS] if last_line is not None else None
    idle = Beat(progress_age=round(max(0.0, output_age), 3), last_line=line)
    try:
        step, stamp = int(progress["step"]), float(progress["t"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError, OverflowError):
        return idle, sent_upto
    age = round(max(0.0, now - stamp), 3) if math.isfinite(stamp) else math.inf
    if not 0 <= step <= MAX_INT or not is_number(age):  # its relay would drop the beat
        return idle, sent_upto
    assert progress is not None
    work = progress.get("work", [])
    fresh = [
        (s, float(w))
        for s, w in (pair for pair in (work if isinstance(work, list) else []) if _is_pair(pair))
        if s > sent_upto
    ][-protocol.WORK_PER_BEAT :]
    beat = Beat(
        step=step,
        max_steps=_count_or_none(progress.get("max_steps")),
        samples_per_step=_count_or_none(progress.get("samples_per_step")),
        progress_age=age,
        work=tuple(fresh),
        last_line=line,
    )
    return beat, max([sent_upto, *(s for s, _ in fresh)])


def _count_or_none(value: object) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_INT else None


def _is_pair(pair: object) -> bool:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        return False
    step, seconds = pair
    return (
        type(step) is int
        and 0 <= step <= MAX_INT
        and type(seconds) in (int, float)
        and math.isfinite(seconds)
        and 0 <= seconds <= protocol.MAX_WORK_S
    )
