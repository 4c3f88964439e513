"""The master's side of the job control channel: one connection per rank agent (client in `channel`).

One TCP connection per rank carries newline-delimited JSON both ways. It is how the master learns
within a second that a rank exited or a node vanished (the connection closes, or heartbeats stop on
a network partition), and how it stops this job's ranks on every node without ssh or pkill.
Nothing is accepted before the mutual handshake of `protocol`; the master admits only the (rank,
host, node) seats it launched, each once, from that node's addresses, and every later message must
carry the connection's session MAC. Before the handshake a connection holds one of a bounded set of
slots: each planned node's address has room for its own ranks, strangers share a small pool, so a
flood from elsewhere can never shut the job's agents out; every handshake has one deadline.
The messages are listed in docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.supervise.admission import Gate, Refused, Seat
from gaudi_cluster.view.jobview import AgentState
from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.channel import Channel

log = logging.getLogger("gaudi_cluster.supervise.control")

RECENT_WORK = 64
MAX_WORK_HISTORY = 50_000  # per rank: the report's plot of a long job keeps its first 50k steps


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


class ControlServer:
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
        self._agents: dict[int, AgentState] = {}
        self._channels: dict[int, Channel] = {}  # rank -> its agent's connection, beside its state
        self._finished_work: dict[int, list[tuple[int, float]]] = {}
        self._pending: dict[int, tuple[Channel, float]] = {}  # handshakes under way: their deadline
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener = socket.create_server((bind, port), reuse_port=False, backlog=1024)
        self.port = self._listener.getsockname()[1]
        self._threads = [
            threading.Thread(target=self._accept_loop, name="control-accept", daemon=True),
            threading.Thread(target=self._beat_loop, name="control-beat", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def agents(self) -> list[AgentState]:
        """A snapshot of every agent's state (copies: the live ones change under the lock)."""
        with self._lock:
            return [dataclasses.replace(agent) for agent in self._agents.values()]

    def work_histories(self) -> dict[int, list[tuple[int, float]]]:
        """Every rank's work time per step so far (for the final report)."""
        with self._lock:
            histories = {rank: list(agent.work_history) for rank, agent in self._agents.items()}
            histories.update({rank: list(work) for rank, work in self._finished_work.items()})
        return histories

    def mark_exited(self, rank: int) -> None:
        """The supervisor has accounted for this rank (its exit or loss): report nothing more of it."""
        with self._lock:
            if rank in self._agents:
                self._agents[rank].exited = True

    def stop_all(self, grace_s: float) -> None:
        """Ask every connected agent to stop its rank (SIGTERM, then SIGKILL after grace_s)."""
        with self._lock:
            channels = list(self._channels.values())
        for channel in channels:
            channel.send({"type": "stop", "grace": grace_s})

    def close(self) -> None:
        self._stopping.set()
        # shutdown() wakes the thread blocked in accept(); close() alone would keep the port bound
        # until then, and a restarted job could not listen on it again.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            channels = list(self._channels.values())
        for channel in channels:
            channel.close()

    # --- threads --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError as error:
                if self._stopping.is_set() or error.errno in (errno.EBADF, errno.EINVAL):
                    return  # closed: the attempt is over
                if error.errno in _TRANSIENT_ACCEPT_ERRORS:
                    # Out of descriptors: serve what is connected and try again shortly, never give up.
                    self.gate.refuse(
                        "the listener", f"accept failed ({errno.errorcode.get(error.errno or 0)})"
                    )
                    time.sleep(0.05)
                continue
            peer = str(address[0])
            with self._lock:
                admitted = len(self._agents)
            if not self.gate.take_slot(peer, admitted):
                sock.close()
                self.gate.refuse(peer, "too many unauthenticated connections from this address")
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel = Channel(sock)
            with self._lock:
                self._pending[id(channel)] = (channel, self._clock() + protocol.HANDSHAKE_TIMEOUT_S)
            threading.Thread(
                target=self._serve, args=(channel, peer), name="control-agent", daemon=True
            ).start()

    def _serve(self, channel: Channel, peer: str) -> None:
        agent: AgentState | None = None
        try:
            agent = self._seat(channel, self.gate.admit(channel, peer, self._seated))
        except Refused as refused:
            channel.send({"type": "refused", "reason": str(refused)})
            self.gate.refuse(peer, str(refused))
        except Exception as error:  # whatever a hostile peer makes of the handshake, its slot comes back
            self.gate.refuse(peer, f"handshake failed: {type(error).__name__}")
        finally:
            with self._lock:
                self._pending.pop(id(channel), None)
            self.gate.give_slot(peer)
            if agent is None:
                channel.close()
        if agent is None:
            return
        self.events.put(ControlEvent(EventKind.HELLO, agent.host, agent.rank, {"pid": agent.pid}))
        try:
            self._serve_admitted(channel, peer, agent)
        finally:
            channel.close()
            self._forget(agent)

    def _seated(self, rank: int) -> bool:
        with self._lock:
            return rank in self._agents

    def _seat(self, channel: Channel, seat: Seat) -> AgentState:
        agent = AgentState(
            host=seat.host, rank=seat.rank, pid=seat.pid, last_seen=self._clock(), local_rank=seat.local_rank
        )
        with self._lock:
            if seat.rank in self._agents:
                raise Refused(f"rank {seat.rank} is already connected")
            self._agents[seat.rank] = agent
            self._channels[seat.rank] = channel
        channel.session = seat.session
        channel.settimeout(None)
        return agent

    def _serve_admitted(self, channel: Channel, peer: str, agent: AgentState) -> None:
        while (message := channel.receive()) is not None:
            why = (
                f"ignored a message without a valid session MAC ({message['reason']})"
                if message.get("type") == "unauthenticated"
                else protocol.problem(message, protocol.SESSION_MESSAGES)
            )
            if why is not None:
                self.gate.refuse(f"{peer} (rank {agent.rank})", f"dropped a message: {why}")
                continue
            self._record(agent, message)
        if channel.close_reason.startswith("a line over"):
            self.gate.refuse(f"{peer} (rank {agent.rank})", f"closed: {channel.close_reason}")

    def _forget(self, agent: AgentState) -> None:
        with self._lock:
            reported = agent.exited
            if self._agents.get(agent.rank) is agent:
                del self._agents[agent.rank]  # the rank may reconnect (its agent retries)
                del self._channels[agent.rank]
                self._finished_work[agent.rank] = agent.work_history
        if not reported and not self._stopping.is_set():
            self.events.put(
                ControlEvent(EventKind.LOST, agent.host, agent.rank, {"reason": "connection closed"})
            )

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
                    if len(agent.work_history) < MAX_WORK_HISTORY:
                        agent.work_history.extend(work)
            elif message_type == "exit":
                agent.exited = True
        if message_type == "exit":
            detail = {**message, "tail": protocol.trimmed_tail(message.get("tail", []))}
            self.events.put(ControlEvent(EventKind.EXIT, agent.host, agent.rank, detail))

    def _beat_loop(self) -> None:
        # Ticks of a quarter of the beat interval: a handshake's deadline is enforced within 0.25 s.
        tick, ticks = protocol.BEAT_INTERVAL_S / 4, 0
        while not self._stopping.wait(tick):
            now, ticks = self._clock(), ticks + 1
            with self._lock:
                expired = [channel for channel, deadline in self._pending.values() if now > deadline]
            for channel in expired:
                channel.close()  # a handshake has one deadline, however slowly its bytes trickle in
            if ticks % 4:
                continue
            lost: list[tuple[AgentState, float]] = []
            with self._lock:
                live = [a for a in self._agents.values() if not a.exited]
                channels = [self._channels[a.rank] for a in live]
                for agent in live:
                    silent_for = now - agent.last_seen
                    if silent_for > self.heartbeat_timeout_s:
                        agent.exited = True  # report a node once, not every second
                        lost.append((agent, silent_for))
            for channel in channels:
                channel.send({"type": "beat"})
            for agent, silent_for in lost:
                reason = f"no heartbeat for {silent_for:.0f}s (network partition or frozen node)"
                self.events.put(ControlEvent(EventKind.LOST, agent.host, agent.rank, {"reason": reason}))


_TRANSIENT_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
