"""Node: the pre-imported rank (a per-node zygote): one process imports the workload's heavy libraries
once and forks each rank from there, which then runs its script as `__main__`.

`python -u -m gaudi_cluster.rank.zygote --listen PATH --keep-s N` is started by the node process
(launch/node) with the import-time settings its ranks share (zygote_rules.start_environment) and
listens on PATH, a Unix socket named after those settings (zygote_rules.zygote_name). It imports
zygote_rules.preload_modules (what fails to import is left to the rank), then serves its agents from
one thread: each agent connects and is told the zygote is ready, then sends a ForkRequest (program,
environment, working directory) with its rank's stdin and output as file descriptors; the zygote
answers the rank's pid, or why it will not fork (zygote_rules: a second thread, a device file open, a
device bridge imported, another import-time setting, a program that is no `python [-u] SCRIPT`, its
libraries changed on disk), and the rank's wait status once it ends.

It stays warm for the next attempt or job: once no agent and no rank is left it waits N seconds for
the next agent (0: it leaves with the job, as under Slurm, and `--leave-with PID` has the kernel kill it
and its ranks once that node process ends, however it ends), and it leaves as soon as its socket is no
longer its own (launch/node retires the previous zygote of a node when a job needs other settings).
It ignores SIGTERM/SIGINT/SIGHUP (the agents stop their ranks). The agent's side is
rank/zygote_client (`ZygoteLink`, and `ZygoteChild` in Popen's shape).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import random
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from gaudi_cluster.rank import cmdline, procgroup
from gaudi_cluster.rank.zygote_rules import (
    PRELOAD_ONLY_ENV,
    ForkReply,
    ForkRequest,
    Script,
    fork_refusal,
    key_difference,
    openblas_threads,
    preload_modules,
    script_of,
)

MAX_REQUEST = 1 << 20
# A zygote no agent has reached yet leaves after this long (the node process that started it is gone).
FIRST_AGENT_S = 60.0
# How often an idle zygote checks that its socket is still its own.
RETIRE_CHECK_S = 1.0


def _open_files() -> list[str]:
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
    return paths


def refusal_now() -> str | None:
    """Why this process may not fork now (its real threads, open files and modules)."""
    return fork_refusal(len(os.listdir("/proc/self/task")), _open_files(), list(sys.modules))


def preload(env: Mapping[str, str]) -> None:
    only_now = {name: value for name, value in PRELOAD_ONLY_ENV.items() if name not in os.environ}
    os.environ.update(only_now)
    try:
        for name in preload_modules(env):
            try:
                importlib.import_module(name)
            except Exception:
                return
    finally:
        for name in only_now:
            os.environ.pop(name, None)


def library_stamp() -> tuple[tuple[str, int, int], ...]:
    """The preloaded libraries' files as they are on disk: a reinstall changes it, and a rank forked
    from the old modules would run code that is no longer there."""
    stamps = []
    for name in ("torch", "transformers", "deepspeed"):
        path = getattr(sys.modules.get(name), "__file__", None)
        with contextlib.suppress(OSError, TypeError):
            st = os.stat(path)  # type: ignore[arg-type]
            stamps.append((name, st.st_ino, st.st_mtime_ns))
    return tuple(stamps)


# --- the rank, in the forked child ---------------------------------------------------------------


def _streams(unbuffered: bool) -> None:
    """stdin/stdout/stderr on fds 0-2 as a plain start makes them (-u: unbuffered output)."""
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    if unbuffered:
        out = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
        err = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
    else:
        out = open(1, "w", closefd=False)  # noqa: SIM115
        err = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code & 0xFF
    print(error.code, file=sys.stderr)
    return 1


def _openblas_libraries() -> list[str]:
    """The OpenBLAS libraries loaded here (numpy's bundled one, any other's), by their mapped files."""
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if "openblas" in os.path.basename(path) and path not in found:
                found.append(path)
    return found


def size_blas_pools(env: Mapping[str, str]) -> None:
    """Give each OpenBLAS the threads a plain start under `env` gives it: the zygote imported it with
    one (PRELOAD_ONLY_ENV), and its pool is sized once, at import. Its own calls, found under the
    names its builds export (numpy 2's scipy_openblas, ILP64 suffixes)."""
    import ctypes

    for path in _openblas_libraries():
        try:
            library = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        except OSError:
            continue
        calls = (
            (
                getattr(library, f"{name}_set_num_threads{suffix}", None),
                getattr(library, f"{name}_get_num_procs{suffix}", None),
            )
            for name in ("openblas", "scipy_openblas")
            for suffix in ("", "64_", "_64")
        )
        found = next(
            ((set_threads, get_procs) for set_threads, get_procs in calls if set_threads and get_procs), None
        )
        if found is not None:
            set_threads, get_procs = found
            set_threads(openblas_threads(env, get_procs()))


def become_rank(
    request: ForkRequest, script: Script, stdin_fd: int, out_fd: int, zygote: int | None = None
) -> int:
    """Turn this forked child into the rank a plain `python [-u] SCRIPT` start would be; its exit code.
    zygote: its parent's pid where the zygote leaves with its node process (Slurm): the rank then
    dies with the zygote, which dies with that process."""
    import runpy

    if zygote is not None and not procgroup.die_with_parent(zygote):
        return 128 + signal.SIGKILL  # the zygote is already gone: so is the node process and its agents
    os.setsid()  # its own process group, as the agent's plain start gives (start_new_session)
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(stdin_fd)
    os.close(out_fd)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    cmdline.show(request.program)  # over the zygote's strings: after the environment moved off them
    sys.argv = list(script.argv)
    # A plain start puts the script's directory first on sys.path; the zygote's first entry is its cwd.
    sys.path[0] = os.path.dirname(os.path.abspath(script.path))
    _streams(script.unbuffered)
    # Fresh entropy, as a process of its own would have: every RNG seeded at import is seeded again.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    code = 0
    try:
        runpy.run_path(script.path, run_name="__main__")
    except SystemExit as error:
        code = _exit_code(error)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at a normal exit
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


# --- the zygote's loop ---------------------------------------------------------------------------


class Zygote:
    def __init__(
        self,
        listener: socket.socket,
        path: str,
        env: Mapping[str, str],
        imported: Mapping[str, str],
        keep_s: float,
        leaves_with: int | None = None,
    ) -> None:
        self.listener, self.path, self.keep_s = listener, path, keep_s
        self.leaves_with = leaves_with  # the node process it dies with (and its ranks with it), if any
        self.pid = os.getpid()
        self.inode = os.stat(path).st_ino  # the socket file is ours while this inode sits at `path`
        self.env = dict(env)  # as the node process gave it, before the imports
        self.imported = dict(imported)  # what the imports set in os.environ (a plain rank's do too)
        self.libraries = library_stamp()
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.conns: set[socket.socket] = set()
        self.ranks: dict[int, socket.socket] = {}  # pidfd -> the agent that asked for it
        self.pids: dict[int, int] = {}  # pidfd -> pid
        self.served = False
        self.idle_since = time.monotonic()

    def serve(self) -> None:
        while True:
            wait = self._wait_s()
            if wait is not None and wait <= 0:
                self.retire()
                if not self.selector.select(0):  # an agent that connected meanwhile is still served
                    return
            for key, _ in self.selector.select(wait):
                if key.data == "listener":
                    self._accept()
                elif key.data == "agent":
                    self._request(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._reaped(key.fd)

    def _wait_s(self) -> float | None:
        """How long to wait for the next event: None while agents or ranks are here; else the idle time
        left (at most RETIRE_CHECK_S, so that a retired zygote leaves soon), 0 when it is over."""
        if self.conns or self.ranks:
            return None
        if not self._owns_socket():
            return 0
        keep = self.keep_s if self.served else max(self.keep_s, FIRST_AGENT_S)
        return max(0.0, min(RETIRE_CHECK_S, self.idle_since + keep - time.monotonic()))

    def _owns_socket(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def retire(self) -> None:
        """No new agent from now on: the socket goes (if still ours); agents already here are served."""
        if self._owns_socket():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.inode = -1

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():  # the directory is ours alone; a stranger's connection is refused anyway
            conn.close()
            return
        self.selector.register(conn, selectors.EVENT_READ, "agent")
        self.conns.add(conn)
        self.served = True
        self._send(conn, ForkReply(ready=True))

    def _idle_check(self) -> None:
        if not self.conns and not self.ranks:
            self.idle_since = time.monotonic()

    def _drop(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        self.conns.discard(conn)
        conn.close()
        self._idle_check()

    def _request(self, conn: socket.socket) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            self._drop(conn)
            return
        try:
            request = ForkRequest.from_json(data.decode())
            reason, script = self._decide(request)
            if len(fds) != 2:
                reason = f"the agent sent {len(fds)} file descriptors, not 2"
            reply = (
                ForkReply(refused=reason) if reason else ForkReply(pid=self._fork(conn, request, script, fds))
            )
        except (ValueError, OSError) as error:
            reply = ForkReply(refused=f"bad request ({error})")
        finally:
            for fd in fds:
                os.close(fd)
        self._send(conn, reply)

    def _decide(self, request: ForkRequest) -> tuple[str | None, Script]:
        script = script_of(request.program, sys.executable)
        if isinstance(script, str):
            return script, Script("", (), False)
        differ = key_difference(self.env, request.env)
        if differ:
            return f"import-time settings differ from the zygote's: {', '.join(differ[:5])}", script
        if library_stamp() != self.libraries:
            self.retire()  # the next job starts a zygote on what is installed now
            return "its preloaded libraries changed on disk since it started", script
        return refusal_now(), script

    def _fork(self, conn: socket.socket, request: ForkRequest, script: Script, fds: list[int]) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.selector.close()
                for fd in [self.listener.fileno(), *self.pids, *(c.fileno() for c in self.conns)]:
                    os.close(fd)
                # By the rank's own variables: its numpy's pool was sized at import, before the
                # libraries' imports set theirs (accelerate sets OMP_NUM_THREADS).
                size_blas_pools(request.env)
                env = {**request.env, **{k: v for k, v in self.imported.items() if k not in request.env}}
                given = ForkRequest(request.program, env, request.cwd)
                zygote = self.pid if self.leaves_with is not None else None
                code = become_rank(given, script, fds[0], fds[1], zygote)
            finally:
                os._exit(code)
        pidfd = os.pidfd_open(pid)
        self.selector.register(pidfd, selectors.EVENT_READ, "rank")
        self.ranks[pidfd], self.pids[pidfd] = conn, pid
        return pid

    def _reaped(self, pidfd: int) -> None:
        self.selector.unregister(pidfd)
        conn, pid = self.ranks.pop(pidfd), self.pids.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn in self.conns:
            self._send(conn, ForkReply(status=status))
        self._idle_check()

    def _send(self, conn: socket.socket, reply: ForkReply) -> None:
        try:
            conn.sendall(reply.to_json().encode() + b"\n")
        except OSError:  # the agent is gone; its rank's status has no one to go to
            if conn in self.conns:
                self._drop(conn)


def listen(path: str) -> socket.socket | None:
    """The zygote's socket at `path` (mode 0600), or None when another zygote holds that name.

    It is bound and listening under a private name first and then linked to `path`: a node process
    that sees the file connects at once, and a socket bound but not yet listening refuses it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    private = f"{path}.{os.getpid()}.new"
    old = os.umask(0o177)
    try:
        listener.bind(private)
        listener.listen(64)
        os.link(private, path)  # atomic, and fails where a zygote of the same settings already is
    except OSError:
        listener.close()
        return None
    finally:
        os.umask(old)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(private)
    return listener


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster.rank.zygote", allow_abbrev=False)
    parser.add_argument("--listen", required=True, help="the Unix socket its agents connect to")
    parser.add_argument(
        "--keep-s", type=float, default=0.0, help="seconds it waits for the next agent once idle"
    )
    parser.add_argument(
        "--leave-with",
        type=int,
        metavar="PID",
        help="the node process that started it: it and its ranks are killed once that one ends (Slurm)",
    )
    args = parser.parse_args(argv)
    # It ignores the stop signals (its agents stop the ranks), so under Slurm a step's tracker that
    # lost it (its node process killed first, it reparented) would leave it and its ranks running.
    if args.leave_with is not None and not procgroup.die_with_parent(args.leave_with):
        return 0
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    listener = listen(args.listen)  # before the imports: the agents queue while they run
    if listener is None:
        return 0  # a zygote of the same settings answers there: the node process uses that one
    given = dict(os.environ)
    preload(given)
    imported = {k: v for k, v in os.environ.items() if given.get(k) != v}
    Zygote(listener, args.listen, given, imported, args.keep_s, args.leave_with).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
