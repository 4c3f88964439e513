"""One thread serving every connection of a listening socket (a selector), the control server's plumbing.

Nothing here blocks: lines are cut from whatever bytes arrived (`channel.LineBuffer`), and what a
peer does not read waits in that connection's own buffer, so a peer that stops reading delays no
one else (past MAX_UNSENT it is cut). Running out of descriptors rests the listener a moment while
the connections already in are served. Other threads reach the loop only through `call`.
What the lines mean is the subclass's (`control.ControlServer`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.channel import LineBuffer

log = logging.getLogger("gaudi_cluster.supervise.control")

MAX_UNSENT = 256 * 1024  # bytes a peer may leave unread (hours of beats) before it is cut
BACKLOG = 8192  # a burst of connects waits in the kernel (capped there by net.core.somaxconn)
ACCEPTS_PER_TURN = 256  # then the connections already in get their turn
ACCEPT_PAUSE_S = 0.05  # out of descriptors: the listener rests this long, the others are served
READ_SIZE = 65536
_LISTENER, _WAKE = "listener", "wake"
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Connection:
    """One accepted socket: its peer's address, the bytes it still owes a line, those it has not read."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.lines = LineBuffer()
        self.unsent = bytearray()
        self.closed = False


class SelectorServer:
    """Accepts, reads and writes in one thread; subclasses say what a connection and a line are."""

    def __init__(self, bind: str, port: int, tick_s: float, name: str) -> None:
        self._commands: collections.deque[Callable[[], None]] = collections.deque()
        self._stopping = threading.Event()
        self._open: set[Connection] = set()
        self._listener = socket.create_server((bind, port), reuse_port=False, backlog=BACKLOG)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_in, selectors.EVENT_READ, _WAKE)
        self._accept_again_at: float | None = None
        self._tick_s = tick_s
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._shut = False

    # --- what the subclass says -----------------------------------------------------------------

    def _connected(self, sock: socket.socket, peer: str) -> Connection | None:
        """A new peer's connection (None: turned away, the socket closed)."""
        raise NotImplementedError

    def _line(self, conn: Connection, line: bytes) -> None:
        raise NotImplementedError

    def _ended(self, conn: Connection, why: str) -> None:
        """The peer closed, broke, sent a line too long or left too much unread: close it."""
        self._close(conn)

    def _tick(self, ticks: int) -> None:
        """Every tick_s."""

    # --- other threads --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def call(self, work: Callable[[], None]) -> None:
        """Run `work` in the loop's thread, soon."""
        self._commands.append(work)
        self._wake()

    def close(self) -> None:
        """Stop serving: what was asked before still runs, then every socket closes and the port is
        free again when this returns."""
        self._stopping.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._shutdown()  # never started (or already done: then this does nothing)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the loop is awake already; closed: it is over
            self._wake_out.send(b"\0")

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        ticks, next_tick = 0, time.monotonic() + self._tick_s
        try:
            while not self._stopping.is_set():
                wait = next_tick - time.monotonic()
                if self._accept_again_at is not None:
                    wait = min(wait, self._accept_again_at - time.monotonic())
                for key, mask in self._selector.select(max(0.0, wait)):
                    self._ready(key.data, mask)
                    if self._commands:  # a stop goes out before the rest of a burst of thousands is read
                        self._run_commands()
                self._run_commands()
                now = time.monotonic()
                if self._accept_again_at is not None and now >= self._accept_again_at:
                    self._accept_again_at = None
                    self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
                if now >= next_tick:
                    ticks, next_tick = ticks + 1, now + self._tick_s
                    self._tick(ticks)
            self._run_commands()  # asked just before close (a stop): still goes out
        except Exception:
            log.exception("control channel: the server's loop failed")
        finally:
            self._shutdown()

    def _ready(self, what: Any, mask: int) -> None:
        if what is _LISTENER:
            self._accept()
        elif what is _WAKE:
            with contextlib.suppress(OSError):
                while self._wake_in.recv(4096):
                    pass
        elif not what.closed:
            try:
                if mask & selectors.EVENT_WRITE:
                    self._flush(what)
                if mask & selectors.EVENT_READ and not what.closed:
                    self._read(what)
            except Exception as error:  # one peer's trouble never ends the loop that serves them all
                log.exception("control channel: serving %s failed", what.peer)
                try:
                    self._ended(what, f"failed: {type(error).__name__}")
                except Exception:
                    log.exception("control channel: ending %s failed", what.peer)
                finally:
                    self._close(what)  # whatever _ended made of it, the connection is closed

    def _run_commands(self) -> None:
        while self._commands:
            self._commands.popleft()()

    def _shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        for conn in list(self._open):
            self._close(conn)
        for sock in (self._listener, self._wake_in, self._wake_out):
            with contextlib.suppress(OSError):
                sock.close()
        self._selector.close()

    # --- connections ----------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno == errno.ECONNABORTED:
                    continue
                if error.errno not in _OUT_OF_RESOURCES:
                    raise
                # Out of descriptors: serve what is connected and try again shortly, never give up.
                self._accept_failed(errno.errorcode.get(error.errno or 0, "?"))
                self._selector.unregister(self._listener)
                self._accept_again_at = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            conn = self._connected(sock, str(address[0]))
            if conn is not None:
                self._open.add(conn)
                self._selector.register(sock, selectors.EVENT_READ, conn)

    def _accept_failed(self, code: str) -> None:
        log.warning("control channel: accept failed (%s)", code)

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._ended(conn, "broken")
            return
        if not data:
            self._ended(conn, "closed by the peer")
            return
        for line in conn.lines.feed(data):
            self._line(conn, line)
            if conn.closed:
                return
        if conn.lines.overflow:
            self._ended(conn, f"a line over {protocol.MAX_LINE} bytes")

    def _close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._open.discard(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.sock.close()

    def _write(self, conn: Connection, data: bytes) -> None:
        if conn.closed:
            return
        if conn.unsent:  # behind what is queued already: keep the order
            conn.unsent += data
        else:
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._ended(conn, "broken")
                return
            if sent == len(data):
                return
            conn.unsent += data[sent:]
            self._selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        if len(conn.unsent) > MAX_UNSENT:
            self._ended(conn, f"the peer left {len(conn.unsent)} bytes unread")

    def _flush(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._ended(conn, "broken")
            return
        del conn.unsent[:sent]
        if not conn.unsent:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
