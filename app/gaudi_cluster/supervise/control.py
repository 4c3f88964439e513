"""The master's side of the job control channel: one connection per rank agent (client in `channel`).

One TCP connection per rank carries newline-delimited JSON both ways. It is how the master learns
within a second that a rank exited or a node vanished (the connection closes, or heartbeats stop on
a network partition), and how it stops this job's ranks on every node without ssh or pkill.
Nothing is accepted before the mutual handshake of `protocol`; the master admits only the (rank,
host, node) seats it launched, each once, from that node's addresses, and every later message must
carry the connection's session MAC. Before the handshake a connection holds one of a bounded set of
slots: each planned node's address has room for its own ranks, strangers share a small pool, so a
flood from elsewhere can never shut the job's agents out; every handshake has one deadline.

One thread serves every connection (`serving`): thousands of ranks cost sockets, not threads.
Nothing it does blocks: each connection's handshake is a small state machine fed by the lines it
receives (`admission.Handshake`), and what a peer does not read waits in its connection's buffer.
The messages are listed in docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.supervise.admission import Gate, Handshake, Refused, Seat
from gaudi_cluster.supervise.serving import Connection, SelectorServer
from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.view.jobview import AgentState
from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.channel import decode, encode

log = logging.getLogger("gaudi_cluster.supervise.control")

RECENT_WORK = 64


class EventKind(enum.Enum):
    HELLO = "hello"  # a rank's agent was admitted (detail: pid)
    EXIT = "exit"  # a rank ended (detail: code, signal, tail, stop_reason)
    LOST = "lost"  # a rank's connection closed or its heartbeats stopped (detail: reason)


@dataclass(frozen=True)
class ControlEvent:
    kind: EventKind
    host: str
    rank: int
    detail: dict[str, Any] = field(default_factory=dict)


class _Agent(Connection):
    """A peer of the control port: its handshake until it is seated, then its session and rank state."""

    def __init__(self, sock: socket.socket, peer: str, handshake: Handshake, deadline: float) -> None:
        super().__init__(sock, peer)
        self.deadline = deadline
        self.handshake: Handshake | None = handshake
        self.session: protocol.Session | None = None
        self.agent: AgentState | None = None

    def who(self) -> str:
        return self.peer if self.agent is None else f"{self.peer} (rank {self.agent.rank})"


class ControlServer(SelectorServer):
    """Accepts the rank agents of one job attempt and turns what happens to them into ControlEvents."""

    def __init__(
        self,
        bind: str,
        port: int,
        job_id: str,
        heartbeat_timeout_s: float,
        token: str,
        expected: Mapping[int, str],
        clock: Callable[[], float] = time.monotonic,
        nodes: Mapping[int, str] | None = None,
        addresses: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """token: the attempt's secret; expected, nodes, addresses: the seats and where they may
        connect from (see admission.Gate)."""
        self.job_id = job_id
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.events: queue.Queue[ControlEvent] = queue.Queue()
        self.gate = Gate(job_id, token, expected, nodes, addresses)
        self._clock = clock
        # Rank states are read by other threads (the supervisor, status, metrics): changed under the lock.
        self._agents: dict[int, AgentState] = {}
        self._finished_work: dict[int, WorkHistory] = {}
        self._lock = threading.Lock()
        # Only the loop's thread touches the connections.
        self._by_rank: dict[int, _Agent] = {}
        self._pending: dict[int, _Agent] = {}  # handshakes under way, oldest (first deadline) first
        # Ticks of a quarter of the beat interval: a handshake's deadline is enforced within 0.25 s.
        super().__init__(bind, port, protocol.BEAT_INTERVAL_S / 4, "control")

    # --- what other threads call ----------------------------------------------------------------

    def agents(self) -> list[AgentState]:
        """A snapshot of every agent's state (copies: the live ones change under the lock)."""
        with self._lock:
            return [dataclasses.replace(agent) for agent in self._agents.values()]

    def running(self) -> list[int]:
        """The connected ranks not yet accounted for (no copy of their states)."""
        with self._lock:
            return [rank for rank, agent in self._agents.items() if not agent.exited]

    def work_histories(self) -> dict[int, WorkHistory]:
        """Every rank's work time per step so far (for the final report): copies of the bounded
        histories (a few KB a rank), never lists of every step."""
        with self._lock:
            histories = {rank: agent.work_history.copy() for rank, agent in self._agents.items()}
            histories.update({rank: work.copy() for rank, work in self._finished_work.items()})
        return histories

    def mark_exited(self, rank: int) -> None:
        """The supervisor has accounted for this rank (its exit or loss): report nothing more of it."""
        with self._lock:
            if rank in self._agents:
                self._agents[rank].exited = True

    def stop_all(self, grace_s: float) -> None:
        """Ask every connected agent to stop its rank (SIGTERM, then SIGKILL after grace_s); returns
        at once, the loop sends."""
        self.call(lambda: self._send_all({"type": "stop", "grace": grace_s}))

    # --- the loop's thread ----------------------------------------------------------------------

    def _tick(self, ticks: int) -> None:
        self._expire_handshakes()
        if ticks % 4 == 0:
            self._beat()

    def _accept_failed(self, code: str) -> None:
        self.gate.refuse("the listener", f"accept failed ({code})")

    def _connected(self, sock: socket.socket, peer: str) -> _Agent | None:
        with self._lock:
            admitted = len(self._agents)
        if not self.gate.take_slot(peer, admitted):
            sock.close()
            self.gate.refuse(peer, "too many unauthenticated connections from this address")
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = self.gate.handshake(peer, self._seated)
        conn = _Agent(sock, peer, handshake, self._clock() + protocol.HANDSHAKE_TIMEOUT_S)
        self._pending[id(conn)] = conn
        self._send(conn, handshake.challenge)
        return conn

    def _seated(self, rank: int) -> bool:
        with self._lock:
            return rank in self._agents

    def _line(self, conn: Connection, line: bytes) -> None:
        assert isinstance(conn, _Agent)
        self._receive(conn, decode(line))

    def _receive(self, conn: _Agent, message: Any) -> None:
        if conn.handshake is not None:
            self._handshake_step(conn, conn.handshake, message)
            return
        assert conn.session is not None and conn.agent is not None
        why = conn.session.open(message)
        if why is not None:
            why = f"ignored a message without a valid session MAC ({why})"
        else:
            why = protocol.problem(message, protocol.SESSION_MESSAGES)
        if why is not None:
            self.gate.refuse(conn.who(), f"dropped a message: {why}")
            return
        self._record(conn.agent, message)

    def _handshake_step(self, conn: _Agent, handshake: Handshake, message: Any) -> None:
        try:
            answer = handshake.receive(message)
            if isinstance(answer, Seat):
                self._seat(conn, answer)
            else:
                self._send(conn, answer)
        except Refused as refused:
            self._send(conn, {"type": "refused", "reason": str(refused)})
            self.gate.refuse(conn.peer, str(refused))
            self._close(conn)
        except Exception as error:  # whatever a hostile peer makes of the handshake, its slot comes back
            self.gate.refuse(conn.peer, f"handshake failed: {type(error).__name__}")
            self._close(conn)

    def _seat(self, conn: _Agent, seat: Seat) -> None:
        agent = AgentState(
            host=seat.host, rank=seat.rank, pid=seat.pid, last_seen=self._clock(), local_rank=seat.local_rank
        )
        with self._lock:
            if seat.rank in self._agents:
                raise Refused(f"rank {seat.rank} is already connected")
            self._agents[seat.rank] = agent
        self._end_handshake(conn)
        conn.session, conn.agent = seat.session, agent
        self._by_rank[seat.rank] = conn
        self.events.put(ControlEvent(EventKind.HELLO, agent.host, agent.rank, {"pid": agent.pid}))

    def _end_handshake(self, conn: _Agent) -> None:
        conn.handshake = None
        if self._pending.pop(id(conn), None) is not None:
            self.gate.give_slot(conn.peer)

    def _ended(self, conn: Connection, why: str) -> None:
        """The connection is over (closed, broken, a line too long, cut for not reading)."""
        assert isinstance(conn, _Agent)
        if conn.closed:
            return
        if conn.handshake is not None:
            self.gate.refuse(conn.peer, str(conn.handshake.ended(why)))
            self._close(conn)
            return
        if why not in ("closed by the peer", "broken"):  # the peer's doing, not an agent's end
            self.gate.refuse(conn.who(), f"closed: {why}")
        self._close(conn)
        self._forget(conn)

    def _close(self, conn: Connection) -> None:
        if isinstance(conn, _Agent):
            self._end_handshake(conn)
        super()._close(conn)

    def _forget(self, conn: _Agent) -> None:
        agent = conn.agent
        if agent is None:
            return
        if self._by_rank.get(agent.rank) is conn:
            del self._by_rank[agent.rank]
        with self._lock:
            reported = agent.exited
            if self._agents.get(agent.rank) is agent:
                del self._agents[agent.rank]  # the rank may reconnect (its agent retries)
                self._finished_work[agent.rank] = agent.work_history
        if not reported and not self._stopping.is_set():
            self.events.put(
                ControlEvent(EventKind.LOST, agent.host, agent.rank, {"reason": "connection closed"})
            )

    # --- writing --------------------------------------------------------------------------------

    def _send(self, conn: _Agent, message: dict[str, Any]) -> None:
        if not conn.closed:
            self._write(conn, encode(conn.session.seal(message) if conn.session is not None else message))

    def _send_all(self, message: dict[str, Any]) -> None:
        for conn in list(self._by_rank.values()):
            self._send(conn, message)

    # --- what the agents say, and their silence -------------------------------------------------

    def _record(self, agent: AgentState, message: dict[str, Any]) -> None:
        now = self._clock()
        message_type = message["type"]
        with self._lock:
            agent.last_seen = now
            if message_type == "beat":
                agent.step = message.get("step", agent.step)
                if message.get("progress_age") is not None:
                    agent.progress_age, agent.progress_received = float(message["progress_age"]), now
                agent.max_steps = message.get("max_steps", agent.max_steps)
                agent.samples_per_step = message.get("samples_per_step", agent.samples_per_step)
                agent.last_line = message.get("last_line") or agent.last_line
                work = [(int(step), float(seconds)) for step, seconds in message.get("work", [])]
                if work:
                    agent.recent_work = (*agent.recent_work, *work)[-RECENT_WORK:]
                    agent.work_history.extend(work)  # bounded by the history itself (jobview)
            elif message_type == "exit":
                agent.exited = True
        if message_type == "exit":
            detail = {**message, "tail": protocol.trimmed_tail(message.get("tail", []))}
            self.events.put(ControlEvent(EventKind.EXIT, agent.host, agent.rank, detail))

    def _expire_handshakes(self) -> None:
        now = self._clock()
        expired = []
        for conn in self._pending.values():  # in order of their deadlines
            if conn.deadline > now:
                break
            expired.append(conn)
        for conn in expired:  # a handshake has one deadline, however slowly its bytes trickle in
            self._ended(conn, "timed out")

    def _beat(self) -> None:
        now = self._clock()
        live: list[int] = []
        lost: list[tuple[AgentState, float]] = []
        with self._lock:
            for agent in self._agents.values():
                if agent.exited:
                    continue
                live.append(agent.rank)
                silent_for = now - agent.last_seen
                if silent_for > self.heartbeat_timeout_s:
                    agent.exited = True  # report a node once, not every second
                    lost.append((agent, silent_for))
        for rank in live:
            if (conn := self._by_rank.get(rank)) is not None:
                self._send(conn, {"type": "beat"})
        for agent, silent_for in lost:
            reason = f"no heartbeat for {silent_for:.0f}s (network partition or frozen node)"
            self.events.put(ControlEvent(EventKind.LOST, agent.host, agent.rank, {"reason": reason}))
