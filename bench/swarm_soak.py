"""The soak's sampler, inside the swarm bench's master process: once a second (at a random point of
it), now - last_seen of every admitted rank still running (the server's own clock and snapshot), into
a histogram of 10 ms bins; and every LOST event the server raises (with nobody killed during a soak,
each one is false).

SWARM_SOAK_S sets the soak's length (default 600 s, the issue's ten minutes).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from typing import Any

SOAK_S = float(os.environ.get("SWARM_SOAK_S", "600"))
BIN_S = 0.01


def percentile(histogram: Counter[int], fraction: float) -> float | None:
    """The value below which `fraction` of the samples lie (the upper edge of its bin)."""
    total = sum(histogram.values())
    if not total:
        return None
    seen = 0
    for bin_index in sorted(histogram):
        seen += histogram[bin_index]
        if seen >= fraction * total:
            return (bin_index + 1) * BIN_S
    return None


class BeatSampler:
    """Samples the beat ages of a ControlServer in a thread of its own (one more thread in the
    master: only in the soak run, whose thread count is not a row)."""

    def __init__(self, server: Any, every_s: float = 1.0) -> None:
        self.server, self.every_s = server, every_s
        self.ages: Counter[int] = Counter()
        self.samples = 0
        self.oldest = 0.0
        self.lost = 0
        self.first_lost: dict[str, Any] | None = None
        self._done = threading.Event()
        put = server.events.put

        def counting_put(event: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(event.kind, "value", None) == "lost":
                self.lost += 1
                if self.first_lost is None:
                    self.first_lost = {"host": event.host, "rank": event.rank, "at": time.monotonic(),
                                       "detail": str(getattr(event, "detail", ""))[:200]}  # fmt: skip
            put(event, *args, **kwargs)

        server.events.put = counting_put
        self._thread = threading.Thread(target=self._run, name="beat-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # One sample in each second, at a random point of it: the swarm's beats all come at one phase
        # of the second (they started together), and a fixed period would always see the same phase.
        slot = time.monotonic()
        while not self._done.wait(max(0.0, slot + random.uniform(0, self.every_s) - time.monotonic())):
            slot += self.every_s
            table = self.server.table()  # the lists, as the supervisor reads them
            now = time.monotonic()
            for rank in table.ranks:
                if table.exited[rank]:
                    continue
                age = now - table.last_seen[rank]
                self.ages[int(age / BIN_S)] += 1
                self.oldest = max(self.oldest, age)
            self.samples += 1
            self._done.wait(max(0.0, slot - time.monotonic()))  # the rest of this second

    @property
    def stopped(self) -> bool:
        return self._done.is_set()

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self._thread.join(5)
        return {
            "beat_age_p99_s": percentile(self.ages, 0.99),
            "beat_age_p50_s": percentile(self.ages, 0.5),
            "beat_age_max_s": self.oldest,
            "samples": self.samples,
            "ages": sum(self.ages.values()),
            "false_losses": self.lost,
            "first_lost": self.first_lost,
        }
