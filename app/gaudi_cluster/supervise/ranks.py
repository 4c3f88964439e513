"""What the master knows of each rank, shared between the control server's loop and the threads that
read it (the supervisor, status, metrics): one lock around flat lists indexed by rank.

The hot fields (last heard, step, progress age, median work, newest timed step) are lists indexed by
rank: a relay's `summary` is applied by slice, and a reader's snapshot copies a dozen lists, not
8,000 objects. Each seated rank's AgentState stays as its seat (who holds it, its work history);
its hot fields live in the lists, and readers get copies or plain lists, never the live objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.view.jobview import AgentState, RankSnapshot
from gaudi_cluster.wire.messages import Beat, Summary
from gaudi_cluster.wire.work_window import RECENT_WORK, window_median

_LISTS = tuple(name for name in RankSnapshot.__dataclass_fields__ if name != "ranks")
_BLANK: dict[str, Any] = {"last_line": "", "exited": False, "host": "", "local_rank": 0, "pid": 0}


class RankTable:
    def __init__(self) -> None:
        self._agents: dict[int, AgentState] = {}  # the seats
        self._finished_work: dict[int, WorkHistory] = {}  # ranks whose connection is gone
        self._recent: dict[int, tuple[tuple[int, float], ...]] = {}  # a rank's own link: its last pairs
        self._lists: dict[str, list[Any]] = {name: [] for name in _LISTS}
        self._lock = threading.Lock()

    # --- readers (any thread) -------------------------------------------------------------------

    def table(self) -> RankSnapshot:
        """Every seated rank's fields now: copies of the lists (slices, under the lock)."""
        with self._lock:
            return RankSnapshot(tuple(self._agents), **{name: list(v) for name, v in self._lists.items()})

    def snapshot(self) -> list[AgentState]:
        """Every connected rank's state (copies: the live ones change under the lock); each shares
        its rank's work history, which only the loop may read."""
        agents = self.table().agents()
        with self._lock:
            for agent in agents:
                if (seat := self._agents.get(agent.rank)) is not None:
                    agent.work_history = seat.work_history
        return agents

    def running(self) -> list[int]:
        """The connected ranks not yet accounted for (no copy of their states)."""
        with self._lock:
            exited = self._lists["exited"]
            return [rank for rank in self._agents if not exited[rank]]

    def work_histories(self) -> dict[int, WorkHistory]:
        """Copies of every rank's bounded work history (a few KB a rank)."""
        with self._lock:
            histories = {rank: agent.work_history.copy() for rank, agent in self._agents.items()}
            histories.update({rank: work.copy() for rank, work in self._finished_work.items()})
        return histories

    def __len__(self) -> int:
        with self._lock:
            return len(self._agents)

    def __contains__(self, rank: int) -> bool:
        with self._lock:
            return rank in self._agents

    # --- the loop's changes ---------------------------------------------------------------------

    def mark_exited(self, rank: int) -> None:
        with self._lock:
            if rank in self._agents:
                self._agents[rank].exited = self._lists["exited"][rank] = True

    def seat(self, agent: AgentState) -> bool:
        """Add a rank just admitted; False when that rank holds a seat already."""
        with self._lock:
            if agent.rank in self._agents:
                return False
            self._agents[agent.rank] = agent
            lists, rank = self._lists, agent.rank
            if rank >= len(lists["step"]):
                for name, values in lists.items():
                    values.extend([_BLANK.get(name)] * (rank + 1 - len(values)))
            for name in _LISTS:
                lists[name][rank] = _BLANK.get(name)
            for name in ("host", "local_rank", "pid", "last_seen", "exited"):
                lists[name][rank] = getattr(agent, name)
            self._recent.pop(rank, None)
            return True

    def unseat(self, agent: AgentState) -> bool:
        """Its connection is gone (the rank may reconnect); whether its end was accounted for."""
        with self._lock:
            if self._agents.get(agent.rank) is agent:
                del self._agents[agent.rank]
                self._finished_work[agent.rank] = agent.work_history
            return agent.exited

    def heard(self, agents: Iterable[AgentState], now: float, beat: Beat | None = None) -> None:
        """A sign of life for these ranks (a relay's word is every rank of its node's), with one
        rank's beat (from its own connection) when it carries one."""
        with self._lock:
            last_seen = self._lists["last_seen"]
            for agent in agents:
                last_seen[agent.rank] = now
                if beat is not None:
                    self._apply_beat(agent, beat, now)

    def heard_summary(self, agents: Mapping[int, AgentState], now: float, summary: Summary) -> None:
        """A relay's `summary`: every rank of its node heard from, its lists applied to the ranks it
        seated (by slice when, as usual, they are those ranks in a row)."""
        lists = self._lists
        with self._lock:
            for rank in agents:
                lists["last_seen"][rank] = now
            ranks = summary.ranks
            if not ranks:
                return
            first, end = ranks[0], ranks[-1] + 1
            in_a_row = tuple(sorted(agents)) == ranks and end - first == len(ranks)
            for name, values in (
                ("step", summary.steps),
                ("timed", summary.timed),
                ("median", summary.medians),
            ):
                if not values:
                    continue
                if in_a_row and None not in values:
                    lists[name][first:end] = values
                else:
                    _put(lists[name], agents, ranks, values)
            ages = summary.ages
            if in_a_row and None not in ages:
                lists["progress_age"][first:end] = ages
                lists["progress_received"][first:end] = [now] * len(ranks)
            else:
                _put(lists["progress_age"], agents, ranks, ages)
                _put(lists["progress_received"], agents, ranks, [None if a is None else now for a in ages])
            for entry in summary.steady:
                if entry.rank in agents:
                    self._apply_steady(entry.rank, entry)
            for rank, buckets in summary.work:
                if (agent := agents.get(rank)) is not None:
                    agent.work_history.add_buckets(buckets)

    def exited(self, agent: AgentState, now: float) -> None:
        with self._lock:
            self._lists["last_seen"][agent.rank] = now
            agent.exited = self._lists["exited"][agent.rank] = True

    def silent(self, now: float, timeout_s: float) -> tuple[list[int], list[tuple[AgentState, float]]]:
        """The ranks still running, and those silent past timeout_s (marked exited: reported once)."""
        live: list[int] = []
        lost: list[tuple[AgentState, float]] = []
        with self._lock:
            exited, last_seen = self._lists["exited"], self._lists["last_seen"]
            for rank, agent in self._agents.items():
                if exited[rank]:
                    continue
                live.append(rank)
                silent_for = now - last_seen[rank]
                if silent_for > timeout_s:
                    agent.exited = exited[rank] = True
                    lost.append((agent, silent_for))
        return live, lost

    # --- under the lock -------------------------------------------------------------------------

    def _apply_beat(self, agent: AgentState, beat: Beat, now: float) -> None:
        """One rank's beat from its own connection: a field left out (None) is unchanged."""
        lists, rank = self._lists, agent.rank
        if beat.step is not None:
            lists["step"][rank] = beat.step
        if beat.progress_age is not None:
            lists["progress_age"][rank], lists["progress_received"][rank] = beat.progress_age, now
        self._apply_steady(rank, beat)
        if pairs := beat.work:
            recent = self._recent[rank] = (self._recent.get(rank, ()) + pairs)[-RECENT_WORK:]
            lists["median"][rank], lists["timed"][rank] = window_median(recent), recent[-1][0]
            agent.work_history.extend(pairs)  # bounded by the history itself

    def _apply_steady(self, rank: int, beat: Beat) -> None:
        lists = self._lists
        if beat.max_steps is not None:
            lists["max_steps"][rank] = beat.max_steps
        if beat.samples_per_step is not None:
            lists["samples_per_step"][rank] = beat.samples_per_step
        if beat.last_line:
            lists["last_line"][rank] = beat.last_line


def _put(
    values: list[Any], agents: Mapping[int, AgentState], ranks: Iterable[int], new: Iterable[object]
) -> None:
    """Each known value (None: unchanged) to its rank, if the relay seated it."""
    for rank, value in zip(ranks, new, strict=True):
        if value is not None and rank in agents:
            values[rank] = value
