"""The master's side of the job control channel: one connection per rank agent (client in `channel`).

One TCP connection per rank carries newline-delimited JSON both ways. It is how the master learns
within a second that a rank exited or a node vanished (the connection closes, or heartbeats stop on
a network partition), and how it stops this job's ranks on every node without ssh or pkill.
Nothing is accepted before the mutual handshake of `protocol`; the master admits only the (rank,
host) pairs it launched, each once. The messages are listed in docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.view.jobview import AgentState
from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.channel import Channel

log = logging.getLogger("gaudi_cluster.supervise.control")

SPARE_CONNECTIONS = 8  # beyond one per expected rank: reconnects, probes by operators
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


class Refused(Exception):
    """A connection the master turns away (logged once per peer and reason)."""


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
    ) -> None:
        self.job_id = job_id
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.events: queue.Queue[ControlEvent] = queue.Queue()
        self._token = token
        self._expected = dict(expected)  # rank -> the host name its node reported
        self._max_connections = len(self._expected) + SPARE_CONNECTIONS
        self._clock = clock
        self._agents: dict[int, AgentState] = {}
        self._channels: dict[int, Channel] = {}  # rank -> its agent's connection, beside its state
        self._finished_work: dict[int, list[tuple[int, float]]] = {}
        self._open = 0
        self._logged: set[tuple[str, str]] = set()
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

    def _refuse(self, peer: str, reason: str) -> None:
        with self._lock:
            first = (peer, reason) not in self._logged
            self._logged.add((peer, reason))
        if first:
            log.warning("control channel: refused %s: %s", peer, reason)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError:
                return
            peer = str(address[0])
            with self._lock:
                full = self._open >= self._max_connections
                self._open += 0 if full else 1
            if full:
                sock.close()
                self._refuse(peer, f"more than {self._max_connections} connections at once")
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._serve, args=(Channel(sock), peer), name="control-agent", daemon=True
            ).start()

    def _serve(self, channel: Channel, peer: str) -> None:
        try:
            agent = self._admit(channel)
        except Refused as refused:
            channel.send({"type": "refused", "reason": str(refused)})
            channel.close()
            self._refuse(peer, str(refused))
            self._release()
            return
        self.events.put(ControlEvent(EventKind.HELLO, agent.host, agent.rank, {"pid": agent.pid}))
        while (message := channel.receive()) is not None:
            why = protocol.problem(message)
            if why is not None or message["type"] == "hello":
                self._refuse(f"{peer} (rank {agent.rank})", f"dropped a message: {why or 'a second hello'}")
                continue
            self._record(agent, message)
        if channel.close_reason.startswith("a line over"):
            self._refuse(f"{peer} (rank {agent.rank})", f"closed: {channel.close_reason}")
        with self._lock:
            reported = agent.exited
            if self._agents.get(agent.rank) is agent:
                del self._agents[agent.rank]  # the rank may reconnect (its agent retries)
                del self._channels[agent.rank]
                self._finished_work[agent.rank] = agent.work_history
        self._release()
        if not reported and not self._stopping.is_set():
            self.events.put(
                ControlEvent(EventKind.LOST, agent.host, agent.rank, {"reason": "connection closed"})
            )

    def _release(self) -> None:
        with self._lock:
            self._open -= 1

    def _admit(self, channel: Channel) -> AgentState:
        """The master's side of the handshake; Refused unless the peer is a rank this attempt launched."""
        nonce = protocol.new_nonce()
        channel.settimeout(protocol.HANDSHAKE_TIMEOUT_S)
        channel.send({"type": "challenge", "nonce": nonce, "job": self.job_id})
        hello = channel.receive()
        if hello is None:
            raise Refused(f"no hello within {protocol.HANDSHAKE_TIMEOUT_S:.0f}s ({channel.close_reason})")
        why = protocol.problem(hello)
        if why is None and hello["type"] != "hello":
            why = f"{hello['type']} before the handshake"
        if why is not None:
            raise Refused(why)
        if hello["job"] != self.job_id:
            raise Refused(f"hello for another job ({str(hello['job'])[:40]})")
        rank, host = hello["rank"], hello["host"]
        if not protocol.same_mac(
            protocol.hello_mac(self._token, nonce, self.job_id, host, rank), hello["mac"]
        ):
            raise Refused(f"wrong job secret for rank {rank} from host {host}")
        if self._expected.get(rank) != host:
            raise Refused(f"rank {rank} on host {host} was not launched by this job")
        agent = AgentState(
            host=host,
            rank=rank,
            pid=hello["pid"],
            last_seen=self._clock(),
            local_rank=hello.get("local_rank", 0),
        )
        with self._lock:
            if rank in self._agents:
                raise Refused(f"rank {rank} is already connected")
            self._agents[rank] = agent
            self._channels[rank] = channel
        channel.settimeout(None)
        channel.send(
            {"type": "welcome", "mac": protocol.welcome_mac(self._token, hello["nonce"], self.job_id, rank)}
        )
        return agent

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
        while not self._stopping.wait(protocol.BEAT_INTERVAL_S):
            now = self._clock()
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
