"""The control channel's connection as both ends use it, and the agent's side of the handshake.

One TCP connection per node (its relay's, `rank.relay`; an agent started by hand holds its own)
carries newline-delimited JSON both ways (lines of at most protocol.MAX_LINE bytes); the same
`Channel` carries the agents' lines to their relay over a Unix socket, unsealed. The master's
server is in `control`; it reads without blocking, so it cuts its bytes into lines with a
`LineBuffer` and decodes them with `decode` like `Channel` does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.wire import protocol


class Channel:
    """A socket speaking newline-delimited JSON (lines of at most protocol.MAX_LINE bytes), safe to
    send on from several threads. Once the handshake set a `session`, every message sent is sealed
    and every message received must be authentic and next in order: one that is not comes back as
    {"type": "unauthenticated", "reason": ...}, for the caller to drop and log."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self.closed = False
        self.close_reason = ""
        self.session: protocol.Session | None = None
        self.attempts = 1  # handshakes it took (connect_and_authenticate retries)

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def send(self, message: dict[str, Any]) -> bool:
        with self._send_lock:
            if self.closed:
                return False
            sealed = self.session.seal(message) if self.session is not None else message
            try:
                self._sock.sendall(encode(sealed))
                return True
            except OSError:
                self.closed = True
                return False

    def receive(self) -> Any:
        """The next decoded line ({} when it is not JSON), or None once the connection is over."""
        try:
            line = self._reader.readline(protocol.MAX_LINE + 1)
        except (OSError, ValueError) as error:  # ValueError: read on a file closed by another thread
            self.closed, self.close_reason = (
                True,
                "timed out" if isinstance(error, TimeoutError) else "broken",
            )
            return None
        if not line:
            self.closed, self.close_reason = True, "closed by the peer"
            return None
        if len(line) > protocol.MAX_LINE:
            self.close()
            self.close_reason = f"a line over {protocol.MAX_LINE} bytes"
            return None
        message = decode(line)
        if self.session is None:
            return message
        why = self.session.open(message)
        return message if why is None else {"type": "unauthenticated", "reason": why}

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line on the wire."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> Any:
    """A received line's message ({} when it is not JSON, as `Channel.receive` says it)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # "[" * 2000 nests past the parser's recursion limit
        return {}


class LineBuffer:
    """The bytes a non-blocking reader got so far, cut into lines of at most protocol.MAX_LINE
    bytes (newline included): `overflow` once a line grows past that, whether or not it ended."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self.overflow = False

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        lines: list[bytes] = []
        start = 0
        while (end := self._pending.find(b"\n", start)) >= 0:
            if end + 1 - start > protocol.MAX_LINE:
                self.overflow = True
                break
            lines.append(bytes(self._pending[start : end + 1]))
            start = end + 1
        del self._pending[:start]
        if len(self._pending) > protocol.MAX_LINE:
            self.overflow = True
        if self.overflow:
            self._pending.clear()
        return lines


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


@dataclass(frozen=True)
class Identity:
    """Who an agent is to the master: its node in the plan (whose key it holds), host name and rank;
    a node relay (role "node") speaks for every rank of its node and names rank protocol.NODE_RANK."""

    key: str
    node: str
    job: str
    host: str
    rank: int
    pid: int
    local_rank: int = 0
    role: str = "rank"


def authenticate(channel: Channel, me: Identity) -> None:
    """The agent's side of the handshake: the master proves it holds this node's key first; then this
    agent proves it, and both seal every later message. ConnectionError when it fails."""
    channel.settimeout(protocol.HANDSHAKE_TIMEOUT_S)
    challenge = channel.receive()
    if not isinstance(challenge, dict) or challenge.get("type") != "challenge":
        raise ConnectionError(
            f"the master sent no challenge ({channel.close_reason or 'unexpected message'})"
        )
    master_nonce, agent_nonce = str(challenge.get("nonce"))[:64], protocol.new_nonce()
    hello = {"type": "hello", "job": me.job, "node": me.node, "host": me.host, "rank": me.rank}
    if me.role != "rank":
        hello["role"] = me.role
    channel.send({**hello, "local_rank": me.local_rank, "pid": me.pid, "nonce": agent_nonce})
    welcome = channel.receive()
    if not isinstance(welcome, dict) or welcome.get("type") != "welcome":
        why = welcome.get("reason") if isinstance(welcome, dict) else channel.close_reason
        raise ConnectionError(f"the master refused this rank: {str(why or 'no answer')[:200]}")
    names = (master_nonce, agent_nonce, me.job, me.node, me.host, me.rank)
    if not protocol.same_mac(protocol.welcome_mac(me.key, *names), welcome.get("mac")):
        raise ConnectionError(
            "the peer at the control address does not prove this job's key (not this job's master, or "
            "this node's key is stale)"
        )
    channel.send({"type": "proof", "mac": protocol.proof_mac(me.key, *names)})
    channel.session = protocol.Session(
        protocol.session_key(me.key, master_nonce, agent_nonce, me.job, me.rank), role="agent"
    )
    channel.settimeout(None)


def connect_and_authenticate(address: str, me: Identity, timeout_s: float) -> Channel:
    """Connect and authenticate, again and again until timeout_s: a connection turned away by a busy
    or jammed master, or cut mid-handshake, is tried anew rather than ending the rank."""
    deadline = time.monotonic() + timeout_s
    attempts = 0
    while True:
        attempts += 1
        channel = connect(address, max(1.0, deadline - time.monotonic()))
        try:
            authenticate(channel, me)
            channel.attempts = attempts
            return channel
        except ConnectionError as error:
            channel.close()
            if time.monotonic() + 0.5 >= deadline or "does not prove this job's key" in str(error):
                raise
            time.sleep(0.5)
