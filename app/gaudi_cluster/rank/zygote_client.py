"""Rank: the agent's side of the node's zygote (rank/zygote): ask it to fork this rank, and hold the
forked rank as Popen would (pid, stdout, poll, wait).

The rank is the zygote's child, not the agent's: its wait status comes back over the agent's socket
once the zygote has reaped it, read by one thread of the agent's (`ZygoteChild`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import IO

from gaudi_cluster.rank.zygote_rules import ForkReply, ForkRequest

# The zygote answers once its imports are done: the bundled stack takes seconds on a busy node.
ANSWER_TIMEOUT_S = 300.0
# The zygote left before it could say how the rank ended (it never does on its own).
LOST_STATUS = 255


class ZygoteChild:
    """A rank the zygote forked, in Popen's shape for the agent."""

    def __init__(self, conn: socket.socket, replies: IO[bytes], pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._conn, self._replies = conn, replies
        self._done = threading.Event()
        threading.Thread(target=self._read_status, name="zygote", daemon=True).start()

    def _read_status(self) -> None:
        code = LOST_STATUS
        with contextlib.suppress(OSError, ValueError):
            for line in self._replies:
                reply = ForkReply.from_json(line.decode())
                if reply.status is not None:
                    code = os.waitstatus_to_exitcode(reply.status)
                    break
        self.returncode = code
        self._done.set()
        with contextlib.suppress(OSError):
            self._replies.close()  # the socket's fd closes with its last file: the zygote sees us go
            self._conn.close()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int:
        self._done.wait()
        assert self.returncode is not None
        return self.returncode


class ZygoteLink:
    """This agent's socket to its node's zygote."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.replies = conn.makefile("rb")

    def _answer(self, timeout_s: float) -> ForkReply:
        self.conn.settimeout(timeout_s)
        try:
            line = self.replies.readline()
        finally:
            self.conn.settimeout(None)
        return ForkReply.from_json(line.decode()) if line else ForkReply(refused="the zygote is gone")

    def wait_ready(self, timeout_s: float = ANSWER_TIMEOUT_S) -> str | None:
        """None once the zygote's imports are done, else why it will not serve."""
        try:
            reply = self._answer(timeout_s)
        except (OSError, ValueError) as error:
            return f"no answer from the zygote ({error})"
        return None if reply.ready else reply.refused or "the zygote said something else than ready"

    def start(self, program: Sequence[str], env: Mapping[str, str], cwd: str) -> ZygoteChild | str:
        """The rank forked by the zygote, or why not (then start it plainly)."""
        read_end, write_end = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            request = ForkRequest(tuple(program), env, cwd).to_json().encode()
            socket.send_fds(self.conn, [request], [stdin, write_end])
            reply = self._answer(ANSWER_TIMEOUT_S)
        except (OSError, ValueError) as error:
            reply = ForkReply(refused=f"no answer from the zygote ({error})")
        finally:
            os.close(stdin)
            os.close(write_end)
        if reply.pid is None:
            os.close(read_end)
            return reply.refused or "the zygote did not fork"
        return ZygoteChild(self.conn, self.replies, reply.pid, open(read_end, "rb"))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.replies.close()
            self.conn.close()


def link(fd: int | None) -> ZygoteLink | None:
    """The agent's link from the socket launch/node passed it (--zygote-fd), if any."""
    return None if fd is None else ZygoteLink(socket.socket(fileno=fd))
