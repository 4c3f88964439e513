"""What a node relay tells the master of its ranks each second: one `beats` message, deltas only. Pure.

Each agent beats its relay every second (`agent_beat`); the relay keeps, per rank, the work times
not yet sent and the newest of the other fields, and sends a field again only once it changed.
`progress_age` changes with every beat and always goes: it is how the master sees a stuck rank.
"""

from __future__ import annotations

from typing import Any

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.messages import Beat, Beats

_STEADY = ("step", "max_steps", "samples_per_step", "last_line")
_UNSENT = object()


class NodeBeats:
    def __init__(self) -> None:
        self._latest: dict[int, dict[str, Any]] = {}  # rank -> its newest beat's fields
        self._sent: dict[int, dict[str, Any]] = {}  # rank -> the fields the master has
        self._work: dict[int, list[tuple[int, float]]] = {}  # rank -> work pairs not yet sent

    def record(self, rank: int, beat: Beat) -> None:
        """An agent's beat (None: a field it does not know)."""
        latest = self._latest.setdefault(rank, {})
        for field in (*_STEADY, "progress_age"):
            if (value := getattr(beat, field)) is not None:
                latest[field] = value
        work = self._work.setdefault(rank, [])
        work.extend(beat.work)
        del work[: -protocol.WORK_PER_BEAT]  # the newest steps, as a single agent's beat would carry

    def forget(self, rank: int) -> None:
        for kept in (self._latest, self._sent, self._work):
            kept.pop(rank, None)

    def message(self, ranks: list[int]) -> Beats:
        """The `beats` for these ranks now: for each, what changed since the last message."""
        entries = []
        for rank in ranks[: protocol.MAX_RANKS_PER_NODE]:
            latest, sent = self._latest.get(rank, {}), self._sent.setdefault(rank, {})
            entry: dict[str, Any] = {"rank": rank}
            for field in _STEADY:
                if field in latest and sent.get(field, _UNSENT) != latest[field]:
                    entry[field] = sent[field] = latest[field]
            if "progress_age" in latest:
                entry["progress_age"] = latest["progress_age"]
            if work := self._work.pop(rank, []):
                entry["work"] = tuple(work)
            entries.append(Beat(**entry))
        return Beats(tuple(entries))
