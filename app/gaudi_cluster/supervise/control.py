"""The master's side of the job control channel: one connection per node (client in `channel`).

Each node's relay (`rank.relay`) holds one TCP connection for all the ranks of its node (an agent
started by hand may still hold one of its own); it carries newline-delimited JSON both ways. It is
how the master learns within a second that a rank exited or a node vanished (the connection closes,
or heartbeats stop on a network partition), and how it stops this job's ranks on every node without
ssh or pkill: one message per node a second, not one per rank.
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

import enum
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from gaudi_cluster.supervise.admission import Gate, Handshake, Refused, Seat
from gaudi_cluster.supervise.ranks import RankTable
from gaudi_cluster.supervise.serving import Connection, SelectorServer
from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.view.jobview import AgentState, RankSnapshot
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import encode

log = logging.getLogger("gaudi_cluster.supervise.control")
# Rendered once: the same beat goes to every node, only its seal differs.
_MASTER_BEAT = encode(messages.render(messages.Beat())).rstrip(b"\n")


class EventKind(enum.Enum):
    HELLO = "hello"  # a rank's agent was admitted (pid)
    EXIT = "exit"  # a rank ended (code, signal, tail, stop_reason)
    LOST = "lost"  # a rank's connection closed or its heartbeats stopped (reason)


@dataclass(frozen=True)
class ControlEvent:
    kind: EventKind
    host: str
    rank: int
    pid: int = 0
    code: int = 1
    signal: int | None = None
    tail: tuple[str, ...] = ()
    stop_reason: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class RankLines:
    """Lines a rank printed, as its node's relay carried them (the direct launcher's ranks)."""

    host: str
    rank: int
    lines: tuple[str, ...]


class _Agent(Connection):
    """A peer of the control port: its handshake until it is seated, then its session and the state
    of its rank (a rank's own connection) or of its node's ranks (a node relay's)."""

    def __init__(self, sock: socket.socket, peer: str, handshake: Handshake, deadline: float) -> None:
        super().__init__(sock, peer)
        self.deadline = deadline
        self.handshake: Handshake | None = handshake
        self.session: protocol.Session | None = None
        self.agent: AgentState | None = None
        self.node: str | None = None  # set for a node relay ...
        self.ranks: dict[int, AgentState] = {}  # ... with the ranks it seated

    def who(self) -> str:
        if self.node is not None:
            return f"{self.peer} (relay of node {self.node})"
        return self.peer if self.agent is None else f"{self.peer} (rank {self.agent.rank})"

    def states(self) -> list[AgentState]:
        return list(self.ranks.values()) if self.node is not None else [self.agent] if self.agent else []


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
        # The ranks' output, for the supervisor's console and rank logs: put in the order it came,
        # ahead of the exit that follows it. Its reader marks each batch done once routed, so that
        # the end of an attempt can wait for the lines in flight, not just for an empty queue.
        self.output: queue.Queue[RankLines] = queue.Queue()
        self.gate = Gate(job_id, token, expected, nodes, addresses)
        self._clock = clock
        self.ranks = RankTable()  # read by other threads (the supervisor, status, metrics)
        # Only the loop's thread touches the connections.
        self._by_rank: dict[int, _Agent] = {}
        self._sessions: set[_Agent] = set()  # every seated connection (a rank's or a relay's)
        self._relays: dict[str, _Agent] = {}  # node -> its relay's connection
        # After the stop: the relays told and not yet heard from (nor gone), and the nodes each relay
        # reaped (or left clean before the stop); the loop's thread writes them, reaped_by_relays
        # waits on them.
        self._reap_told = threading.Event()
        self._reap_pending: set[str] = set()
        self._reaped: set[str] = set()
        self._silent_nodes: set[str] = set()  # a rank of theirs was lost to silence: no answer to wait for
        self._reap_news = threading.Condition()
        self._pending: dict[int, _Agent] = {}  # handshakes under way, oldest (first deadline) first
        self._beat_every = protocol.beat_every(heartbeat_timeout_s)
        # Ticks of a quarter of the beat interval: a handshake's deadline is enforced within 0.25 s.
        super().__init__(bind, port, protocol.BEAT_INTERVAL_S / 4, "control")

    # --- what other threads call ----------------------------------------------------------------

    def agents(self) -> list[AgentState]:
        """A snapshot of every agent's state (copies)."""
        return self.ranks.snapshot()

    def table(self) -> RankSnapshot:
        """Every seated rank's fields now, as flat lists (what the supervisor reads each second)."""
        return self.ranks.table()

    def running(self) -> list[int]:
        """The connected ranks not yet accounted for (no copy of their states)."""
        return self.ranks.running()

    def work_histories(self) -> dict[int, WorkHistory]:
        """Every rank's work time per step so far (for the final report): bounded copies."""
        return self.ranks.work_histories()

    def mark_exited(self, rank: int) -> None:
        """The supervisor has accounted for this rank (its exit or loss): report nothing more of it."""
        self.ranks.mark_exited(rank)

    def stop_all(self, grace_s: float) -> None:
        """Ask every connected agent to stop its rank (SIGTERM, then SIGKILL after grace_s); returns
        at once, the loop sends. Each node's relay then reaps its node (see reaped_by_relays)."""

        def send() -> None:
            with self._reap_news:  # a node cut off (silent) cannot answer; its own agents end its ranks
                self._reap_pending.update(set(self._relays) - self._silent_nodes)
            self._send_all(messages.Stop(grace=grace_s))
            self._reap_told.set()

        self.call(send)

    def reaped_by_relays(self, timeout_s: float) -> frozenset[str]:
        """After stop_all: the nodes whose relay has reaped them (`reaped`), once every relay told has
        answered or left, or at timeout_s. The rest (no relay, a relay gone or silent) are the
        caller's to reap. Nothing when no stop was sent."""
        deadline = time.monotonic() + timeout_s
        if not self._reap_told.wait(timeout_s):
            return frozenset()
        with self._reap_news:
            while self._reap_pending and (left := deadline - time.monotonic()) > 0:
                self._reap_news.wait(left)
            return frozenset(self._reaped)

    def unstage_on_relays(self, timeout_s: float = 5.0) -> frozenset[str]:
        """Tell every node's relay to remove its node's private file (call it once every rank has
        checked in: each agent has read it by then); the nodes told. A node without a relay, or
        every node if the loop does not answer within timeout_s, is left to the caller."""
        told: Future[frozenset[str]] = Future()

        def send() -> None:
            try:
                # A copy: a relay whose write fails is forgotten (taken out of _relays) as it is sent to.
                for conn in list(self._relays.values()):
                    self._send(conn, messages.Unstage())
            finally:  # a relay whose write failed is closed by now: not told
                told.set_result(frozenset(node for node, conn in self._relays.items() if not conn.closed))

        self.call(send)
        try:
            return told.result(timeout_s)
        except FutureTimeout:
            return frozenset()

    # --- the loop's thread ----------------------------------------------------------------------

    def _tick(self, ticks: int) -> None:
        self._expire_handshakes()
        if ticks % 4 == 0:
            self._beat(ticks // 4)

    def _accept_failed(self, code: str) -> None:
        self.gate.refuse("the listener", f"accept failed ({code})")

    def _connected(self, sock: socket.socket, peer: str) -> _Agent | None:
        if not self.gate.take_slot(peer, len(self.ranks)):
            sock.close()
            self.gate.refuse(peer, "too many unauthenticated connections from this address")
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = self.gate.handshake(peer, self._seated)
        conn = _Agent(sock, peer, handshake, self._clock() + protocol.HANDSHAKE_TIMEOUT_S)
        self._pending[id(conn)] = conn
        self._send(conn, handshake.challenge)
        return conn

    def _seated(self, rank_or_node: int | str) -> bool:
        if isinstance(rank_or_node, str):
            return rank_or_node in self._relays
        return rank_or_node in self.ranks

    def _line(self, conn: Connection, line: bytes) -> None:
        """One line of a peer: a step of its handshake, or (authentic and next in order, and well
        formed) a message of its session; anything else is dropped and logged, the connection kept."""
        assert isinstance(conn, _Agent)
        if conn.handshake is not None:
            self._handshake_step(conn, conn.handshake, line)
            return
        assert conn.session is not None
        allowed = messages.FROM_RELAY_SESSION if conn.node is not None else messages.FROM_AGENT_SESSION
        try:
            message = messages.parse_line(conn.session.open(line), allowed)
        except protocol.Unsealed as error:
            why = f"ignored a message without a valid session MAC ({error})"
            self.gate.refuse(conn.who(), f"dropped a message: {why}")
            return
        except messages.BadMessage as error:
            self.gate.refuse(conn.who(), f"dropped a message: {error}")
            return
        except Exception as error:  # a check's own slip costs the line, as a bad line does
            self.gate.refuse(conn.who(), f"dropped a message: unreadable ({type(error).__name__})")
            return
        try:
            if conn.node is not None:
                self._record_for_node(conn, message)
            else:
                assert conn.agent is not None
                self._record(conn.agent, message)
        except Exception as error:
            # Past here the line was authentic and well formed: whatever it still breaks costs that
            # line, not the connection (a relay's holds every rank of its node).
            failed = f"applying its {message.TYPE.value} failed ({type(error).__name__}: {error})"
            self.gate.refuse(conn.who(), f"dropped a message: {failed}")

    def _handshake_step(self, conn: _Agent, handshake: Handshake, line: bytes) -> None:
        try:
            answer = handshake.receive_line(line)
            if isinstance(answer, Seat):
                self._seat(conn, answer)
            else:
                self._send(conn, answer)
        except Refused as refused:
            self._send(conn, messages.Refused(str(refused)))
            self.gate.refuse(conn.peer, str(refused))
            self._close(conn)
        except Exception as error:  # whatever a hostile peer makes of the handshake, its slot comes back
            self.gate.refuse(conn.peer, f"handshake failed: {type(error).__name__}")
            self._close(conn)

    def _seat(self, conn: _Agent, seat: Seat) -> None:
        if seat.is_node:
            if seat.node in self._relays:
                raise Refused(f"the relay of node {seat.node!r} is already connected")
            self._end_handshake(conn)
            conn.session, conn.node = seat.session, seat.node
            self._relays[seat.node] = conn
            with self._reap_news:  # a relay started after one that left the node clean: not clean now
                self._reaped.discard(seat.node)
            self._sessions.add(conn)
            return
        agent = AgentState(
            host=seat.host, rank=seat.rank, pid=seat.pid, last_seen=self._clock(), local_rank=seat.local_rank
        )
        if not self.ranks.seat(agent):
            raise Refused(f"rank {seat.rank} is already connected")
        self._end_handshake(conn)
        conn.session, conn.agent = seat.session, agent
        self._by_rank[seat.rank] = conn
        self._sessions.add(conn)
        self.events.put(ControlEvent(EventKind.HELLO, agent.host, agent.rank, pid=agent.pid))

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
        self._forget(conn, why)

    def _close(self, conn: Connection) -> None:
        if isinstance(conn, _Agent):
            self._end_handshake(conn)
        super()._close(conn)

    def _forget(self, conn: _Agent, why: str) -> None:
        self._sessions.discard(conn)
        if conn.node is not None and self._relays.get(conn.node) is conn:
            del self._relays[conn.node]
            self._reap_heard(conn.node)
        for agent in conn.states():  # a relay's: its ranks that had not exited yet
            self._unseat(conn, agent, f"connection closed ({why})")
        conn.ranks.clear()

    def _unseat(self, conn: _Agent, agent: AgentState, reason: str) -> None:
        """A rank's agent is gone from its connection: a loss, unless its exit was accounted for."""
        if self._by_rank.get(agent.rank) is conn:
            del self._by_rank[agent.rank]
        if not self.ranks.unseat(agent) and not self._stopping.is_set():
            self.events.put(ControlEvent(EventKind.LOST, agent.host, agent.rank, reason=reason))

    # --- writing --------------------------------------------------------------------------------

    def _send(self, conn: _Agent, message: messages.Message) -> None:
        if not conn.closed:
            fields = messages.render(message)
            self._write(conn, conn.session.seal(fields) if conn.session is not None else encode(fields))

    def _send_all(self, message: messages.Message) -> None:
        for conn in list(self._sessions):
            self._send(conn, message)

    # --- what the agents say, and their silence -------------------------------------------------

    def _record(self, agent: AgentState, message: messages.Message) -> None:
        if isinstance(message, messages.Beat):
            self.ranks.heard([agent], self._clock(), message)
        elif isinstance(message, messages.Exit):
            self._exited(agent, message)

    def _exited(self, agent: AgentState, message: messages.Exit) -> None:
        self.ranks.exited(agent, self._clock())
        tail = protocol.trimmed_tail(message.tail)
        event = ControlEvent(
            EventKind.EXIT, agent.host, agent.rank, code=message.code, signal=message.signal, tail=tail,
            stop_reason=message.stop_reason,
        )  # fmt: skip
        self.events.put(event)

    def _record_for_node(self, conn: _Agent, message: messages.Message) -> None:
        """A relay's message: a rank joining, the node's summary, a rank's output lines, a rank's exit
        or its agent gone."""
        now = self._clock()
        if isinstance(message, messages.Join):
            self._join(conn, message)
            return
        if isinstance(message, messages.Summary):
            self.ranks.heard_summary(conn.ranks, now, message)
            return
        if isinstance(message, messages.Output):
            if message.rank is not None and (agent := conn.ranks.get(message.rank)) is not None:
                self.output.put(RankLines(agent.host, agent.rank, message.lines))
            return
        if isinstance(message, messages.Reaped):
            assert conn.node is not None
            self._reap_heard(conn.node, reaped=True)
            return
        self.ranks.heard(conn.ranks.values(), now)
        if not isinstance(message, messages.Exit | messages.Gone) or message.rank is None:
            self.gate.refuse(conn.who(), "dropped a message: a relay's exit names no rank")
            return
        if (agent := conn.ranks.get(message.rank)) is None:
            return
        if isinstance(message, messages.Exit):
            self._exited(agent, message)
        else:  # gone: its agent left the relay without an exit
            del conn.ranks[agent.rank]
            self._unseat(conn, agent, f"connection closed ({message.reason[:200]})")

    def _reap_heard(self, node: str, reaped: bool = False) -> None:
        with self._reap_news:
            if reaped:  # after the stop, or before it: a relay that ended with its node clean
                self._reaped.add(node)
            self._reap_pending.discard(node)
            self._reap_news.notify_all()

    def _join(self, conn: _Agent, message: messages.Join) -> None:
        assert conn.node is not None
        rank, host = message.rank, message.host
        why = self.gate.check_join(conn.node, rank, host)
        if why is None and self._seated(rank):
            why = f"rank {rank} is already connected"
        if why is not None:
            self.gate.refuse(conn.who(), why)
            self._send(conn, messages.Refused(why, rank))
            return
        agent = AgentState(
            host=host, rank=rank, pid=message.pid, last_seen=self._clock(), local_rank=message.local_rank
        )
        self.ranks.seat(agent)
        conn.ranks[rank] = agent
        self._by_rank[rank] = conn
        self._send(conn, messages.Seated(rank))
        self.events.put(ControlEvent(EventKind.HELLO, host, rank, pid=agent.pid))

    def _expire_handshakes(self) -> None:
        now = self._clock()
        expired = []
        for conn in self._pending.values():  # in order of their deadlines
            if conn.deadline > now:
                break
            expired.append(conn)
        for conn in expired:  # a handshake has one deadline, however slowly its bytes trickle in
            self._ended(conn, "timed out")

    def _beat(self, second: int) -> None:
        """Every second: the silent ranks are lost; every few seconds, the master's beat to the others."""
        live, lost = self.ranks.silent(self._clock(), self.heartbeat_timeout_s)
        if second % self._beat_every == 0:
            beating = {conn for rank in live if (conn := self._by_rank.get(rank)) is not None}
            beating.update(self._relays.values())  # a relay still joining its ranks hears the master too
            for conn in beating:
                if not conn.closed and conn.session is not None:
                    self._write(conn, conn.session.seal_line(_MASTER_BEAT))
        for agent, silent_for in lost:
            if (conn := self._by_rank.get(agent.rank)) is not None and conn.node is not None:
                self._silent_nodes.add(conn.node)
            reason = f"no heartbeat for {silent_for:.0f}s (network partition or frozen node)"
            self.events.put(ControlEvent(EventKind.LOST, agent.host, agent.rank, reason=reason))
