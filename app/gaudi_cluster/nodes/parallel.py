"""Run one command per node, all at once, from one thread: a selector over the children's pipes.

A thread per node would be 1,000 threads at 1,000 nodes, and a pool of 64 makes a teardown 16 rounds
of the slowest node's time. Here every child is started up front (a sliding window like pdsh's, sized
to the open-file limit: each child takes three pipes), its output read as it comes, its stdin written
without blocking, and each one killed at its own deadline; one slow or dead node never delays another.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

WINDOW = 1024  # children at once at most (DeepSpeed sets pdsh's fanout to the same)
FDS_PER_CHILD = 4  # stdin, stdout, stderr and a spare for Popen's own error pipe while it starts
SPARE_FDS = 64  # left to everything else this process opens meanwhile
POLL_S = 0.05  # how often exits are looked for between output events


@dataclass(frozen=True)
class Finished:
    returncode: int  # 124: killed at its deadline
    stdout: str
    stderr: str


def window_size(limit: int = WINDOW) -> int:
    """How many children fit the open-file limit next to what this process already holds."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 256
    room = soft - in_use - SPARE_FDS if soft != resource.RLIM_INFINITY else limit * FDS_PER_CHILD
    return max(1, min(limit, room // FDS_PER_CHILD))


@dataclass
class _Child:
    key: str
    process: subprocess.Popen[bytes]
    deadline: float
    pending_input: bytes
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)  # its pipes, open or closed since


def run_all(
    commands: Mapping[str, Sequence[str]],
    timeout_s: float,
    stdin_of: Callable[[str], str | None] | None = None,
    capture: bool = True,
    window: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Finished]:
    """Run every command (by key) in parallel; each gets `timeout_s` from its own start. `stdin_of`
    gives a key's whole standard input (None: none). Without `capture`, output goes to /dev/null: for
    a command that leaves a background process holding its pipes (ssh -f)."""
    waiting = deque(commands.items())
    running: dict[int, tuple[_Child, str]] = {}  # each pipe still open, by fd: its child and role
    children: list[_Child] = []
    results: dict[str, Finished] = {}
    size = window or window_size()
    selector = selectors.DefaultSelector()
    try:
        while waiting or children:
            while waiting and len(children) < size:
                key, argv = waiting.popleft()
                child = _start(key, argv, timeout_s, stdin_of, capture, clock, selector, running)
                if isinstance(child, Finished):
                    results[key] = child
                else:
                    children.append(child)
            for event, _ in selector.select(timeout=POLL_S):
                _transfer(event.fd, running, selector)
            now = clock()
            for child in list(children):
                if child.process.poll() is None and now < child.deadline:
                    continue
                timed_out = child.process.returncode is None
                if timed_out:
                    child.process.kill()
                    child.process.wait()
                _close_all(child, running, selector, drain=not timed_out)
                children.remove(child)
                results[child.key] = (
                    Finished(124, child.out.decode(errors="replace"), f"timed out after {timeout_s:.0f}s")
                    if timed_out
                    else Finished(
                        child.process.returncode,
                        child.out.decode(errors="replace"),
                        child.err.decode(errors="replace"),
                    )
                )
    finally:
        for child in children:  # only on an exception: nothing outlives the call
            with contextlib.suppress(OSError):
                child.process.kill()
                child.process.wait()
            _close_all(child, running, selector, drain=False)
        selector.close()
    return {key: results[key] for key in commands}


def _start(
    key: str,
    argv: Sequence[str],
    timeout_s: float,
    stdin_of: Callable[[str], str | None] | None,
    capture: bool,
    clock: Callable[[], float],
    selector: selectors.BaseSelector,
    running: dict[int, tuple[_Child, str]],
) -> _Child | Finished:
    text = stdin_of(key) if stdin_of else None
    sink = subprocess.PIPE if capture else subprocess.DEVNULL
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if text is not None else subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
        )
    except OSError as error:
        return Finished(127, "", f"could not start {argv[0]}: {error}")
    child = _Child(key, process, clock() + timeout_s, (text or "").encode())
    for role in ("stdin", "stdout", "stderr"):
        stream = getattr(process, role)
        if stream is not None:
            os.set_blocking(stream.fileno(), False)
            selector.register(
                stream.fileno(), selectors.EVENT_WRITE if role == "stdin" else selectors.EVENT_READ
            )
            running[stream.fileno()] = (child, role)
            child.fds.append(stream.fileno())
    return child


def _transfer(fd: int, running: dict[int, tuple[_Child, str]], selector: selectors.BaseSelector) -> None:
    child, role = running[fd]
    if role == "stdin":
        try:
            sent = os.write(fd, child.pending_input[:65536])
            child.pending_input = child.pending_input[sent:]
        except BlockingIOError:
            return
        except OSError:  # it exited without reading its input (broken pipe): its exit code tells
            child.pending_input = b""
        if not child.pending_input:
            _close(fd, running, selector)
        return
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return
    except OSError:
        chunk = b""
    if chunk:
        (child.out if role == "stdout" else child.err).extend(chunk)
    else:
        _close(fd, running, selector)


def _close_all(
    child: _Child, running: dict[int, tuple[_Child, str]], selector: selectors.BaseSelector, drain: bool
) -> None:
    """Close what is left of a finished child's pipes. An exited child's last output is already in
    its pipes' buffers (it could not have exited while blocked on a write), so reading until the pipe
    is empty gets all of it, even when a process it left behind still holds the pipe open (whose
    own writes are not waited for: at most a pipe's worth more is read)."""
    for fd in child.fds:
        if running.get(fd, (None, ""))[0] is not child:
            continue  # closed already (and the number perhaps reused by another child's pipe)
        for _ in range(16 if drain and running[fd][1] != "stdin" else 0):
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # BlockingIOError: empty now
                break
            if not chunk:
                break
            (child.out if running[fd][1] == "stdout" else child.err).extend(chunk)
        _close(fd, running, selector)


def _close(fd: int, running: dict[int, tuple[_Child, str]], selector: selectors.BaseSelector) -> None:
    child, role = running.pop(fd)
    selector.unregister(fd)
    stream = getattr(child.process, role)
    with contextlib.suppress(OSError):
        stream.close()


def greeters(hosts: Sequence[str], port: int, timeout_s: float = 2.0, prefix: bytes = b"SSH-") -> set[str]:
    """The hosts whose host:port greets with `prefix` within timeout_s (a TCP connect alone can be a
    proxy): every connect at once, non-blocking, over one selector, in windows of the fd limit."""
    answered: set[str] = set()
    size = window_size()
    for start in range(0, len(hosts), size):
        answered |= _greeting_window(hosts[start : start + size], port, timeout_s, prefix)
    return answered


def _greeting_window(hosts: Sequence[str], port: int, timeout_s: float, prefix: bytes) -> set[str]:
    selector = selectors.DefaultSelector()
    sockets: dict[int, tuple[str, socket.socket]] = {}
    answered: set[str] = set()
    try:
        for host in hosts:
            with contextlib.suppress(OSError):  # e.g. the name does not resolve: not answering
                family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                sockets[sock.fileno()] = (host, sock)
                sock.connect_ex(address)
                selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for event, _ in selector.select(timeout=left):
                host, sock = sockets[event.fd]
                with contextlib.suppress(OSError):
                    if sock.recv(len(prefix)).startswith(prefix):
                        answered.add(host)
                selector.unregister(sock)
    finally:
        for _, sock in sockets.values():
            sock.close()
        selector.close()
    return answered
