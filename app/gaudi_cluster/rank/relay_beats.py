"""What a node relay tells the master of its ranks every 1–2 s: one `summary`, at a per-node cost. Pure.

Each agent beats its relay every second (`agent_beat`); the relay keeps, per rank, its newest fields
and its recent work times, and works out what the master would: the median work per step
(`work_window`) and the newest timed step. The master gets flat lists of every rank's step, progress
age and newest timed step (it applies them by slice), a median or a steady field only once it
changed, and the work times for the report merged into buckets every protocol.WORK_FLUSH_S (the
master's own per-rank bookkeeping of every pair was most of its CPU at 8,000 ranks).
"""

from __future__ import annotations

from typing import Any

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.messages import Beat, Summary
from gaudi_cluster.wire.work_window import RECENT_WORK, window_median

_STEADY = ("max_steps", "samples_per_step", "last_line")
_UNSENT = object()


class NodeBeats:
    def __init__(self) -> None:
        self._latest: dict[int, dict[str, Any]] = {}  # rank -> its newest beat's fields
        self._sent: dict[int, dict[str, Any]] = {}  # rank -> the steady fields and median the master has
        self._recent: dict[int, tuple[tuple[int, float], ...]] = {}  # rank -> its last RECENT_WORK pairs
        self._work: dict[int, list[tuple[int, float]]] = {}  # rank -> pairs not yet sent for the report
        self._flushed: float | None = None  # the first work times go at once, then every WORK_FLUSH_S

    def record(self, rank: int, beat: Beat) -> None:
        """An agent's beat (None: a field it does not know)."""
        latest = self._latest.setdefault(rank, {})
        for field in (*_STEADY, "step", "progress_age"):
            if (value := getattr(beat, field)) is not None:
                latest[field] = value
        if beat.work:
            self._recent[rank] = (self._recent.get(rank, ()) + beat.work)[-RECENT_WORK:]
            self._work.setdefault(rank, []).extend(beat.work)

    def forget(self, rank: int) -> None:
        for kept in (self._latest, self._sent, self._recent, self._work):
            kept.pop(rank, None)

    def message(self, ranks: list[int], now: float, flush: bool = False) -> Summary:
        """The `summary` for these ranks now; flush: their work times go now (a rank that exits),
        else every WORK_FLUSH_S."""
        ranks = ranks[: protocol.MAX_RANKS_PER_NODE]
        steps, ages, timed, medians, steady = [], [], [], [], []
        for rank in ranks:
            latest, sent, recent = (
                self._latest.get(rank, {}),
                self._sent.setdefault(rank, {}),
                self._recent.get(rank),
            )
            steps.append(latest.get("step"))
            ages.append(latest.pop("progress_age", None))  # a rank not heard since: its age runs on
            timed.append(recent[-1][0] if recent else None)
            median = None  # unchanged (a median never goes back to None: the master starts there)
            if recent and sent.get("median_of") is not recent:  # a new pair: its median may have moved
                sent["median_of"] = recent
                if (new := window_median(recent)) != sent.get("median"):
                    median = sent["median"] = new
            medians.append(median)
            changed = {f: latest[f] for f in _STEADY if f in latest and sent.get(f, _UNSENT) != latest[f]}
            if changed:
                sent.update(changed)
                steady.append(Beat(rank=rank, **changed))
        work = ()
        due = self._flushed is None or now - self._flushed >= protocol.WORK_FLUSH_S
        if flush or (due and any(rank in self._work for rank in ranks)):
            if not flush:
                self._flushed = now
            most = max(4, min(protocol.WORK_BUCKETS, protocol.WORK_BUCKETS_PER_NODE // max(1, len(ranks))))
            work = tuple(
                (rank, buckets(pairs, most)) for rank in ranks if (pairs := self._work.pop(rank, None))
            )
        changed = tuple(medians) if any(m is not None for m in medians) else ()
        return Summary(tuple(ranks), tuple(steps), tuple(ages), tuple(timed), changed, tuple(steady), work)


def buckets(pairs: list[tuple[int, float]], most: int) -> tuple[tuple[int, float, int], ...]:
    """(first step, seconds summed, steps) of these pairs in aligned buckets of a power-of-two width,
    the narrowest that gives at most `most` of them (width 1: the pairs themselves)."""
    width = 1
    while len({step // width for step, _ in pairs}) > most:
        width *= 2
    merged: dict[int, list[float]] = {}
    for step, seconds in pairs:
        bucket = merged.setdefault(step // width, [0.0, 0])
        bucket[0] += seconds
        bucket[1] += 1
    return tuple((key * width, total, int(count)) for key, (total, count) in sorted(merged.items()))
