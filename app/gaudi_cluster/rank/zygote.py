"""Node: the pre-imported rank (a per-node zygote): one process imports the workload's heavy libraries
once and forks each rank from there, which then runs its script as `__main__`.

`python -u -m gaudi_cluster.rank.zygote --fds N,M,...` is started by the node process (launch/node)
with the environment its ranks share, one end of a socketpair per agent. It imports
zygote_rules.preload_modules (what fails to import is left to the rank), tells each agent it is
ready, then serves them from one thread: an agent sends a ForkRequest (program, environment, working
directory) with its rank's stdin and output as file descriptors; the zygote answers the rank's pid,
or why it will not fork (zygote_rules: a second thread, a device file open, a device bridge
imported, another import-time setting, a program that is no `python [-u] SCRIPT`), and the rank's
wait status once it ends. It ignores SIGTERM/SIGINT/SIGHUP (the agents stop their ranks) and leaves
once every agent has gone and every rank it forked has ended. The agent's side is
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
import sys
import threading
from collections.abc import Mapping, Sequence

from gaudi_cluster.rank.zygote_rules import (
    ForkReply,
    ForkRequest,
    Script,
    fork_refusal,
    key_difference,
    preload_modules,
    script_of,
)

MAX_REQUEST = 1 << 20


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
    for name in preload_modules(env):
        try:
            importlib.import_module(name)
        except Exception:
            return


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


def become_rank(request: ForkRequest, script: Script, stdin_fd: int, out_fd: int) -> int:
    """Turn this forked child into the rank a plain `python [-u] SCRIPT` start would be; its exit code."""
    import runpy

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
        self, conns: Sequence[socket.socket], env: Mapping[str, str], imported: Mapping[str, str]
    ) -> None:
        self.env = dict(env)  # as the node process gave it, before the imports
        self.imported = dict(imported)  # what the imports set in os.environ (a plain rank's do too)
        self.selector = selectors.DefaultSelector()
        self.conns = set(conns)
        self.ranks: dict[int, socket.socket] = {}  # pidfd -> the agent that asked for it
        self.pids: dict[int, int] = {}  # pidfd -> pid
        for conn in conns:
            self.selector.register(conn, selectors.EVENT_READ, "agent")

    def serve(self) -> None:
        while self.conns or self.ranks:
            for key, _ in self.selector.select():
                if key.data == "agent":
                    self._request(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._reaped(key.fd)

    def _drop(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        self.conns.discard(conn)
        conn.close()

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
        return refusal_now(), script

    def _fork(self, conn: socket.socket, request: ForkRequest, script: Script, fds: list[int]) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.selector.close()
                for fd in [*self.pids, *(c.fileno() for c in self.conns)]:
                    os.close(fd)
                env = {**request.env, **{k: v for k, v in self.imported.items() if k not in request.env}}
                code = become_rank(ForkRequest(request.program, env, request.cwd), script, fds[0], fds[1])
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

    def _send(self, conn: socket.socket, reply: ForkReply) -> None:
        try:
            conn.sendall(reply.to_json().encode() + b"\n")
        except OSError:  # the agent is gone; its rank's status has no one to go to
            if conn in self.conns:
                self._drop(conn)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster.rank.zygote", allow_abbrev=False)
    parser.add_argument("--fds", required=True, help="the agents' socket ends, comma-separated")
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    conns = [socket.socket(fileno=int(fd)) for fd in args.fds.split(",") if fd]
    given = dict(os.environ)
    preload(given)
    imported = {k: v for k, v in os.environ.items() if given.get(k) != v}
    zygote = Zygote(conns, given, imported)
    for conn in conns:  # the agents join the master only now: their wait was for the imports
        zygote._send(conn, ForkReply(ready=True))
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
