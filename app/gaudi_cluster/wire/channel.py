"""The control channel's connection as both ends use it, and the agent's side of the handshake.

One TCP connection per rank carries newline-delimited JSON both ways (lines of at most
protocol.MAX_LINE bytes). The master's server is in `control`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

from gaudi_cluster.wire import protocol


class Channel:
    """A socket speaking newline-delimited JSON (lines of at most protocol.MAX_LINE bytes), safe to
    send on from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self.closed = False
        self.close_reason = ""

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

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

    def receive(self) -> Any:
        """The next decoded line ({} when it is not JSON), or None once the connection is over."""
        try:
            line = self._reader.readline(protocol.MAX_LINE + 1)
        except OSError as error:
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
            return json.loads(line)
        except ValueError:
            return {}

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


def authenticate(
    channel: Channel, token: str, job: str, host: str, rank: int, pid: int, local_rank: int = 0
) -> None:
    """The agent's side of the handshake; ConnectionError unless the master proves it has the secret."""
    channel.settimeout(protocol.HANDSHAKE_TIMEOUT_S)
    challenge = channel.receive()
    if not isinstance(challenge, dict) or challenge.get("type") != "challenge":
        raise ConnectionError(
            f"the master sent no challenge ({channel.close_reason or 'unexpected message'})"
        )
    nonce = protocol.new_nonce()
    mac = protocol.hello_mac(token, str(challenge.get("nonce")), job, host, rank)
    channel.send(
        {
            "type": "hello",
            "job": job,
            "host": host,
            "rank": rank,
            "local_rank": local_rank,
            "pid": pid,
            "nonce": nonce,
            "mac": mac,
        }
    )
    welcome = channel.receive()
    if not isinstance(welcome, dict) or welcome.get("type") != "welcome":
        why = welcome.get("reason") if isinstance(welcome, dict) else channel.close_reason
        raise ConnectionError(f"the master refused this rank: {why or 'no answer'}")
    if not protocol.same_mac(protocol.welcome_mac(token, nonce, job, rank), welcome.get("mac")):
        raise ConnectionError("the peer at the control address does not know this job's secret")
    channel.settimeout(None)
