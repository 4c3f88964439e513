"""What the master knows of each rank, shared between the control server's loop and the threads that
read it (the supervisor, status, metrics): one lock around a table of AgentStates.

The loop changes the states as beats, exits and losses arrive; readers get copies or plain lists,
never the live objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.view.jobview import AgentState, median_work
from gaudi_cluster.wire.messages import Beat

RECENT_WORK = 16  # the live view's window (jobview.WINDOW) after the warm-up, with room


class RankTable:
    def __init__(self) -> None:
        self._agents: dict[int, AgentState] = {}
        self._finished_work: dict[int, WorkHistory] = {}  # ranks whose connection is gone
        self._lock = threading.Lock()

    # --- readers (any thread) -------------------------------------------------------------------

    def snapshot(self) -> list[AgentState]:
        """Every connected rank's state (copies: the live ones change under the lock)."""
        with self._lock:
            return [agent.copy() for agent in self._agents.values()]

    def running(self) -> list[int]:
        """The connected ranks not yet accounted for (no copy of their states)."""
        with self._lock:
            return [rank for rank, agent in self._agents.items() if not agent.exited]

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
                self._agents[rank].exited = True

    def seat(self, agent: AgentState) -> bool:
        """Add a rank just admitted; False when that rank holds a seat already."""
        with self._lock:
            if agent.rank in self._agents:
                return False
            self._agents[agent.rank] = agent
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
        rank's beat when it carries one."""
        with self._lock:
            for agent in agents:
                agent.last_seen = now
                if beat is not None:
                    _apply_beat(agent, beat, now)

    def heard_node(self, agents: dict[int, AgentState], now: float, beats: Iterable[Beat]) -> None:
        """A relay's `beats`: every rank of its node heard from, each entry applied to its rank."""
        with self._lock:
            for agent in agents.values():
                agent.last_seen = now
            for beat in beats:
                if beat.rank is not None and (agent := agents.get(beat.rank)) is not None:
                    _apply_beat(agent, beat, now)

    def exited(self, agent: AgentState, now: float) -> None:
        with self._lock:
            agent.last_seen, agent.exited = now, True

    def silent(self, now: float, timeout_s: float) -> tuple[list[int], list[tuple[AgentState, float]]]:
        """The ranks still running, and those silent past timeout_s (marked exited: reported once)."""
        live: list[int] = []
        lost: list[tuple[AgentState, float]] = []
        with self._lock:
            for agent in self._agents.values():
                if agent.exited:
                    continue
                live.append(agent.rank)
                silent_for = now - agent.last_seen
                if silent_for > timeout_s:
                    agent.exited = True
                    lost.append((agent, silent_for))
        return live, lost


def _apply_beat(agent: AgentState, beat: Beat, now: float) -> None:
    """One rank's beat (from its agent, or its entry in its relay's beats): a field left out (None)
    is unchanged since the last one."""
    if beat.step is not None:
        agent.step = beat.step
    if beat.progress_age is not None:
        agent.progress_age, agent.progress_received = beat.progress_age, now
    if beat.max_steps is not None:
        agent.max_steps = beat.max_steps
    if beat.samples_per_step is not None:
        agent.samples_per_step = beat.samples_per_step
    agent.last_line = beat.last_line or agent.last_line
    if pairs := beat.work:
        agent.recent_work = (agent.recent_work + pairs)[-RECENT_WORK:]
        agent.work_history.extend(pairs)  # bounded by the history itself
        median_work(agent)  # once here, for every reader of the copies
