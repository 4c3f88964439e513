"""The job control channel between the master (server) and every rank agent (client).

One TCP connection per rank carries newline-delimited JSON both ways. It is how the master learns
within a second that a rank exited or a node vanished (the connection closes, or heartbeats stop on
a network partition), and how it stops this job's ranks on every node without ssh or pkill.

Agent -> master: hello {job, host, rank, pid}, beat {step, step_time, last_output}, exit {code,
signal, tail}. Master -> agent: beat, stop {grace}.
"""

from __future__ import annotations

import contextlib
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
    host: str
    rank: int
    pid: int
    channel: Channel
    last_seen: float
    step: int | None = None
    step_time: float | None = None
    last_output: float | None = None
    exited: bool = False


@dataclass(frozen=True)
class ControlEvent:
    kind: str  # hello | exit | lost
    host: str
    rank: int
    detail: dict[str, Any] = field(default_factory=dict)


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
        with self._lock:
            return list(self._agents.values())

    def stop_all(self, grace_s: float) -> None:
        """Ask every connected agent to stop its rank (SIGTERM, then SIGKILL after grace_s)."""
        for agent in self.agents():
            agent.channel.send({"type": "stop", "grace": grace_s})

    def close(self) -> None:
        self._stopping.set()
        # shutdown() wakes the thread blocked in accept(); close() alone would keep the port bound
        # until then, and a restarted job could not listen on it again.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        for agent in self.agents():
            agent.channel.close()

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
        while True:
            message = channel.receive()
            if message is None:
                break
            agent.last_seen = self._clock()
            kind = message.get("type")
            if kind == "beat":
                agent.step = message.get("step", agent.step)
                agent.step_time = message.get("step_time", agent.step_time)
                agent.last_output = message.get("last_output", agent.last_output)
            elif kind == "exit":
                agent.exited = True
                self.events.put(ControlEvent("exit", agent.host, agent.rank, message))
        if not agent.exited and not self._stopping.is_set():
            self.events.put(ControlEvent("lost", agent.host, agent.rank, {"reason": "connection closed"}))

    def _beat_loop(self) -> None:
        while not self._stopping.wait(BEAT_INTERVAL_S):
            now = self._clock()
            for agent in self.agents():
                if agent.exited:
                    continue
                agent.channel.send({"type": "beat"})
                silent_for = now - agent.last_seen
                if silent_for > self.heartbeat_timeout_s:
                    agent.exited = True  # report a node once, not every second
                    reason = f"no heartbeat for {silent_for:.0f}s (network partition or frozen node)"
                    self.events.put(ControlEvent("lost", agent.host, agent.rank, {"reason": reason}))
