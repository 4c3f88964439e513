"""The master's /metrics endpoint (--metrics-port): one selector thread, a bounded number of connections.

prometheus_client's own server spends a thread on every connection, so 50 idle half-sent requests held
50 threads. This one serves every connection from the selector loop of `serving.SelectorServer`: at
most MAX_CONNECTIONS at once (a newcomer past that closes the oldest one still sending its request),
and a request whose headers have not
ended REQUEST_TIMEOUT_S after it connected is cut (one that does not read its answer, after
ANSWER_TIMEOUT_S). Each scrape is answered in that thread from the
registry (`view/metrics.JobCollector`), then closed (HTTP/1.0 style, which Prometheus speaks). No TLS
and no authentication here: put kube-rbac-proxy or any TLS proxy in front (docs/kubernetes.md).
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable, Sequence

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.supervise import serving
from gaudi_cluster.view.figures import JobFigures
from gaudi_cluster.view.metrics import JobCollector

log = logging.getLogger("gaudi_cluster.supervise.metrics")

MAX_CONNECTIONS = 16  # Prometheus scrapes one at a time per target; a few more for people and probes
REQUEST_TIMEOUT_S = 5.0  # from connect to the end of the headers
ANSWER_TIMEOUT_S = 60.0  # a scraper that stops reading its answer
MAX_HEADER_LINES = 100
TICK_S = 0.5


class Scrape(serving.Connection):
    """One HTTP connection: its request line, when it connected, whether its answer is out."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        super().__init__(sock, peer)
        self.since = time.monotonic()
        self.request: bytes | None = None
        self.headers = 0
        self.answered = False


class MetricsServer(serving.SelectorServer):
    """Serves the registry at addr:port; `follow` points it at the current attempt's figures."""

    def __init__(self, addr: str, port: int, states: Sequence[str]) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigError(
                "--metrics-port needs the prometheus_client package, which this Python lacks; "
                "fix: pip install prometheus-client (the cpu image has it)"
            ) from None
        self._source: Callable[[], JobFigures | None] = lambda: None
        self.registry = CollectorRegistry(auto_describe=False)
        # Through the attribute at each scrape: follow() replaces the source per attempt.
        self.registry.register(JobCollector(lambda: self._source(), states))  # noqa: PLW0108
        try:
            super().__init__(addr, port, TICK_S, "gc-metrics")
        except OSError as error:
            raise ConfigError(
                f"cannot serve metrics on {addr}:{port} ({error.strerror}); "
                f"fix: --metrics-port {port + 1 if port < 65535 else 9400} (a free port)"
            ) from None
        self.start()

    def follow(self, source: Callable[[], JobFigures | None]) -> None:
        self._source = source

    @property
    def connections(self) -> int:
        return len(self._open)

    # --- the loop's side ------------------------------------------------------------------------

    def _connected(self, sock: socket.socket, peer: str) -> serving.Connection | None:
        if len(self._open) >= MAX_CONNECTIONS:
            # Full: the oldest of those still sending their request makes room, so idle peers cannot
            # keep a scrape out; when every one is being answered, the newcomer is turned away.
            waiting = [c for c in self._open if isinstance(c, Scrape) and not c.answered]
            if not waiting:
                sock.close()
                return None
            self._close(min(waiting, key=lambda c: c.since))
        return Scrape(sock, peer)

    def _line(self, conn: serving.Connection, line: bytes) -> None:
        assert isinstance(conn, Scrape)
        if conn.answered:
            return
        if conn.request is None:
            conn.request = line
            return
        conn.headers += 1
        if line.strip():
            if conn.headers > MAX_HEADER_LINES:
                self._answer(conn, 431, b"too many headers\n", "text/plain")
            return
        self._respond(conn, conn.request)

    def _respond(self, conn: Scrape, request: bytes) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        words = request.split()
        if len(words) < 2 or words[0] not in (b"GET", b"HEAD"):
            self._answer(conn, 405, b"only GET /metrics\n", "text/plain")
        elif words[1].split(b"?")[0] not in (b"/metrics", b"/"):
            self._answer(conn, 404, b"not found: try /metrics\n", "text/plain")
        else:
            body = generate_latest(self.registry)
            self._answer(conn, 200, b"" if words[0] == b"HEAD" else body, CONTENT_TYPE_LATEST)

    def _answer(self, conn: Scrape, status: int, body: bytes, content_type: str) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Many Headers"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.answered = True
        # Not serving._write: a thousand nodes' answer is megabytes, past its cap on unread bytes.
        conn.unsent += head.encode() + body
        self._selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: serving.Connection) -> None:
        super()._flush(conn)
        if isinstance(conn, Scrape) and conn.answered and not conn.unsent:
            self._close(conn)

    def _ended(self, conn: serving.Connection, why: str) -> None:
        self._close(conn)

    def _tick(self, ticks: int) -> None:
        now = time.monotonic()
        for conn in list(self._open):
            assert isinstance(conn, Scrape)
            if conn.since < now - (ANSWER_TIMEOUT_S if conn.answered else REQUEST_TIMEOUT_S):
                self._close(conn)

    def _accept_failed(self, code: str) -> None:
        log.warning("metrics: accept failed (%s)", code)
