"""How long each optimizer step took *this rank's own work*, so that the master can name a slow rank.

In data-parallel training every rank's wall-clock step is the same: the fast ranks wait for the slow
one inside the collectives. So a rank's work time is its step's wall time minus the time it spent
blocked in synchronous torch.distributed collectives; the slow rank is the one that waits least.
On CPU (gloo) collectives block in the call, so this is exact; on HPU/CUDA they are asynchronous and a
rank's wait surfaces at its next synchronisation, inside the work time: there it is an approximation.
"""

from __future__ import annotations

import collections
import functools
import os
import time
from collections.abc import Callable
from typing import Any

# The collectives DeepSpeed and the Trainer call through torch.distributed (module attributes,
# looked up at call time, so wrapping them here reaches every caller).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all_single",
)
RECENT = 8  # step times kept in the progress file (the agent forwards new ones every second)


class StepTimer:
    def __init__(self) -> None:
        self.blocked = 0.0
        self.last_end: float | None = None
        self.recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=RECENT)

    def install(self) -> None:
        """Wrap the synchronous collectives of torch.distributed once per process."""
        import torch.distributed as dist

        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None and not getattr(original, "_gaudi_cluster_timed", False):
                setattr(dist, name, self._timed(original))

    def _timed(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(collective)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("async_op"):
                return collective(*args, **kwargs)
            started = time.perf_counter()
            try:
                return collective(*args, **kwargs)
            finally:
                self.blocked += time.perf_counter() - started

        timed._gaudi_cluster_timed = True  # type: ignore[attr-defined]
        return timed

    def begin(self) -> None:
        self.last_end = time.perf_counter()
        self.blocked = 0.0

    def step_done(self, step: int) -> float | None:
        """This rank's work time for the step that just ended (None for the first one seen)."""
        now = time.perf_counter()
        work = None if self.last_end is None else max(0.0, now - self.last_end - self.blocked)
        self.last_end, self.blocked = now, 0.0
        if work is not None:
            self.recent.append((step, round(work, 4)))
        return work


def slow_down_if_asked(rank: int) -> None:
    """Fault injection for straggler drills: GAUDI_CLUSTER_SLOW_RANK=N makes rank N spend
    GAUDI_CLUSTER_SLOW_MS (default 300) extra milliseconds in every step, as a slow card would."""
    chosen = os.environ.get("GAUDI_CLUSTER_SLOW_RANK", "").strip()
    if chosen.isdigit() and int(chosen) == rank:
        time.sleep(float(os.environ.get("GAUDI_CLUSTER_SLOW_MS", "300")) / 1000)
