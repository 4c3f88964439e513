"""The control channel's connection as both ends use it, and the agent's side of the handshake.

One TCP connection per node (its relay's, `rank.relay`; an agent started by hand holds its own)
carries newline-delimited JSON both ways (lines of at most protocol.MAX_LINE bytes); the same
`Channel` carries the agents' lines to their relay over a Unix socket, unsealed. The master's
server is in `control`; it reads without blocking, so it cuts its bytes into lines with a
`LineBuffer` and parses them with `messages` like `Channel` does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.wire import messages, protocol


class Unsendable(ValueError):
    """A message that would make no line a reader takes (over protocol.MAX_LINE, or a number JSON
    has not): why, in one line."""


class Channel:
    """A socket speaking newline-delimited JSON (lines of at most protocol.MAX_LINE bytes), safe to
    send on from several threads. Once the handshake set a `session`, every message sent is sealed
    and every line received must be authentic and next in order: one that is not (or that is no
    message the reader takes) comes back as `messages.Dropped`, for the caller to drop and log."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self.closed = False
        self.close_reason = ""
        self.session: protocol.Session | None = None
        self.attempts = 1  # handshakes it took (connect_and_authenticate retries)

    @property
    def room(self) -> int:
        """The most bytes a message's JSON may take here (a sealed line's seq and MAC take some)."""
        return protocol.MAX_SEALED_BODY if self.session is not None else protocol.MAX_LINE - 1

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def send(self, message: messages.Message | Mapping[str, Any]) -> bool:
        """Send a typed message (a mapping: its fields as they are, which only a test forging one
        needs); False once the connection is broken. Unsendable, with nothing sent and the session's
        sequence untouched, for a message no reader would take (the caller says so and goes on)."""
        forged = isinstance(message, Mapping)
        fields = message if forged else messages.render(message)  # type: ignore[arg-type]
        try:  # a forgery goes as it is (NaN too): a test sends what no reader should take
            body = json.dumps(fields, separators=(",", ":"), allow_nan=forged).encode()
        except ValueError as error:
            raise Unsendable(f"a {fields.get('type')} holding a number JSON has not: {error}") from None
        with self._send_lock:
            if self.closed:
                return False
            # Checked before the seal takes a sequence number: a line skipped after it would make
            # every later one out of order, silencing the connection for good.
            if len(body) > (room := self.room):
                raise Unsendable(f"a {fields.get('type')} of {len(body)} bytes, over the {room} a line holds")
            line = self.session.seal_line(body) if self.session is not None else body + b"\n"
            try:
                self._sock.sendall(line)
                return True
            except OSError as error:  # said by the caller that reads close_reason
                self.closed = True
                self.close_reason = self.close_reason or f"a send failed ({error.strerror or error})"
                return False

    def receive(
        self, allowed: Collection[messages.MessageType] = messages.ANY
    ) -> messages.Message | messages.Dropped | None:
        """The next message of the allowed kinds; Dropped (with why) for a line that is none (or, in a
        session, is not authentic and next in order); None once the connection is over."""
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
        try:
            body = self.session.open(line) if self.session is not None else line
        except protocol.Unsealed as error:
            return messages.Dropped(f"without the session's MAC: {error}")
        try:
            return messages.parse_line(body, allowed)
        except messages.BadMessage as error:
            return messages.Dropped(str(error))
        except Exception as error:  # a check's own slip costs the line, never the reader or its link
            return messages.Dropped(f"unreadable: {type(error).__name__}")

    def shut_sending(self) -> None:
        """Send no more: the peer reads everything sent, then the end (a FIN after the last line)."""
        with self._send_lock, contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line on the wire."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


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
    agent proves it, and both seal every later message. ConnectionError when it fails, whatever the
    peer sent."""
    channel.settimeout(protocol.HANDSHAKE_TIMEOUT_S)
    challenge = channel.receive(messages.FROM_MASTER_HANDSHAKE)
    if not isinstance(challenge, messages.Challenge):
        raise ConnectionError(f"the master sent no challenge ({_why(channel, challenge)})")
    master_nonce, agent_nonce = challenge.nonce, protocol.new_nonce()
    hello = messages.Hello(
        me.job, me.node, me.host, me.rank, me.pid, agent_nonce, local_rank=me.local_rank, role=me.role
    )
    channel.send(hello)
    welcome = channel.receive(messages.FROM_MASTER_HANDSHAKE)
    if not isinstance(welcome, messages.Welcome):
        raise ConnectionError(f"the master refused this rank: {_why(channel, welcome)}")
    transcript = protocol.Transcript(master_nonce, agent_nonce, me.job, me.node, me.host, me.rank)
    if not protocol.same_mac(protocol.welcome_mac(me.key, transcript), welcome.mac):
        raise ConnectionError(
            "the peer at the control address does not prove this job's key (not this job's master, or "
            "this node's key is stale)"
        )
    channel.send(messages.Proof(protocol.proof_mac(me.key, transcript)))
    channel.session = protocol.Session(
        protocol.session_key(me.key, master_nonce, agent_nonce, me.job, me.rank), role="agent"
    )
    channel.settimeout(None)


def _why(channel: Channel, answer: messages.Message | messages.Dropped | None) -> str:
    """What the master said instead of the step due (its refusal, or what was wrong with its line)."""
    if isinstance(answer, messages.Refused | messages.Dropped):
        return repr(answer.reason[:200])[1:-1]
    if answer is None:
        return channel.close_reason or "no answer"
    return f"a {answer.TYPE.value} out of turn"


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
