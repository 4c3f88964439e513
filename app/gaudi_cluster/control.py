"""The job control channel between the master (server) and every rank agent (client).

One TCP connection per rank carries newline-delimited JSON both ways. It is how the master learns
within a second that a rank exited or a node vanished (the connection closes, or heartbeats stop on
a network partition), and how it stops this job's ranks on every node without ssh or pkill.
The messages are listed in docs/architecture.md ("Rank agent protocol").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gaudi_cluster.control")

BEAT_INTERVAL_S = 1.0


class Channel:
    """A socket speaking newline-delimited JSON, safe to send on from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, message: dict[str, Any]) -> bool:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            if self.closed:
                return False
            try:
                self._sock.sendall(data)
                return True
            except OSError:
                self.closed = True
                return False

    def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the peer closed or the connection broke."""
        try:
            line = self._reader.readline()
        except OSError:
            line = b""
        if not line:
            self.closed = True
            return None
        try:
            message = json.loads(line)
        except ValueError:
            log.warning("ignoring a malformed control message: %r", line[:200])
            return {}
        return message if isinstance(message, dict) else {}

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def connect(address: str, timeout_s: float) -> Channel:
    """Connect to HOST:PORT, retrying until timeout_s (the master may still be binding)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    last_error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Channel(sock)
        except OSError as error:
            last_error = error
            time.sleep(0.2)
    raise ConnectionError(f"cannot reach the master's control channel at {address}: {last_error}")


@dataclass
class AgentState:
    """What the master knows of one rank agent. Changed only by ControlServer, under its lock."""

    host: str
    rank: int
    pid: int
    channel: Channel
    last_seen: float  # master's monotonic clock
    step: int | None = None
    # Seconds since the rank last made progress (a step, else output), as the agent measured it on
    # its own node, and when the master received that figure: no two nodes' clocks are compared.
    progress_age: float | None = None
    progress_received: float | None = None
    exited: bool = False

    def progress_age_now(self, now: float) -> float | None:
        if self.progress_age is None or self.progress_received is None:
            return None
        return self.progress_age + (now - self.progress_received)


@dataclass(frozen=True)
class ControlEvent:
    kind: str  # hello | exit | lost
    host: str
    rank: int
    detail: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class ControlServer:
    """Accepts rank agents of one job and turns what happens to them into ControlEvents."""

    def __init__(
        self,
        bind: str,
        port: int,
        job_id: str,
        heartbeat_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.events: queue.Queue[ControlEvent] = queue.Queue()
        self._clock = clock
        self._agents: dict[int, AgentState] = {}
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

    def mark_exited(self, rank: int) -> None:
        """The supervisor has accounted for this rank (its exit or loss): report nothing more of it."""
        with self._lock:
            if rank in self._agents:
                self._agents[rank].exited = True

    def stop_all(self, grace_s: float) -> None:
        """Ask every connected agent to stop its rank (SIGTERM, then SIGKILL after grace_s)."""
        with self._lock:
            channels = [a.channel for a in self._agents.values()]
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
            channels = [a.channel for a in self._agents.values()]
        for channel in channels:
            channel.close()

    # --- threads --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._serve, args=(Channel(sock),), name="control-agent", daemon=True
            ).start()

    def _serve(self, channel: Channel) -> None:
        hello = channel.receive()
        if not hello or hello.get("type") != "hello" or hello.get("job") != self.job_id:
            # A rank of another (older) job must not be mistaken for one of ours.
            channel.send({"type": "stop", "grace": 0, "reason": "unknown job"})
            channel.close()
            return
        agent = AgentState(
            host=str(hello.get("host")),
            rank=int(hello.get("rank", -1)),
            pid=int(hello.get("pid", 0)),
            channel=channel,
            last_seen=self._clock(),
        )
        with self._lock:
            self._agents[agent.rank] = agent
        self.events.put(ControlEvent("hello", agent.host, agent.rank, {"pid": agent.pid}))
        while (message := channel.receive()) is not None:
            self._record(agent, message)
        with self._lock:
            reported = agent.exited
        if not reported and not self._stopping.is_set():
            self.events.put(ControlEvent("lost", agent.host, agent.rank, {"reason": "connection closed"}))

    def _record(self, agent: AgentState, message: dict[str, Any]) -> None:
        now = self._clock()
        kind = message.get("type")
        with self._lock:
            agent.last_seen = now
            if kind == "beat":
                step = message.get("step")
                agent.step = step if isinstance(step, int) and not isinstance(step, bool) else agent.step
                age = _number(message.get("progress_age"))
                if age is not None:
                    agent.progress_age, agent.progress_received = age, now
            elif kind == "exit":
                agent.exited = True
        if kind == "exit":
            self.events.put(ControlEvent("exit", agent.host, agent.rank, message))

    def _beat_loop(self) -> None:
        while not self._stopping.wait(BEAT_INTERVAL_S):
            now = self._clock()
            lost: list[tuple[AgentState, float]] = []
            with self._lock:
                live = [a for a in self._agents.values() if not a.exited]
                for agent in live:
                    silent_for = now - agent.last_seen
                    if silent_for > self.heartbeat_timeout_s:
                        agent.exited = True  # report a node once, not every second
                        lost.append((agent, silent_for))
            for agent in live:
                agent.channel.send({"type": "beat"})
            for agent, silent_for in lost:
                reason = f"no heartbeat for {silent_for:.0f}s (network partition or frozen node)"
                self.events.put(ControlEvent("lost", agent.host, agent.rank, {"reason": reason}))
