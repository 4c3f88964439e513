"""An agent's way onto its node's relay: join the running one, or start it first (one per job and node).

Agents of one node start together and race: the first to hold the job's relay lock starts the relay
(in a session of its own, its output in the job's relay.log, never the agent's stdout: an ssh
session would wait for it) and waits until it listens, which it does only once the master admitted
the node; the others find it listening. The master then seats the rank (`join` -> `seated`), or
refuses it with the reason, before the agent starts its rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gaudi_cluster.rank import jobdir
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel

if TYPE_CHECKING:
    import subprocess

RELAY_MODULE_ARGS = (sys.executable, "-u", "-m", "gaudi_cluster.rank.relay")
LOCK_NAME = "relay.lock"
LOG_NAME = "relay.log"
POLL_S = 0.05
RELAY_GRACE_S = 3.0


def join(
    job_dir: Path, job_id: str, control: str, member: messages.Join, timeout_s: float, heartbeat_s: float
) -> Channel:
    """This rank's seated link to its node's relay; ConnectionError (with the master's or the
    relay's reason) when the rank may not start."""
    deadline = time.monotonic() + timeout_s
    relay = [*RELAY_MODULE_ARGS, "--job-id", job_id, "--job-root", str(job_dir.parent), "--control", control]
    channel = _relay_link(job_dir, [*relay, "--heartbeat-timeout", str(heartbeat_s)], deadline)
    channel.settimeout(max(1.0, deadline - time.monotonic()))
    channel.send(member)
    answer = channel.receive(messages.FROM_MASTER)
    channel.settimeout(None)
    if isinstance(answer, messages.Seated):
        return channel
    channel.close()
    if isinstance(answer, messages.Refused | messages.Dropped):
        why = repr(answer.reason[:200])[1:-1]
    else:
        out_of_turn = "no answer" if answer is None else f"a {answer.TYPE.value} before the seat"
        why = channel.close_reason or out_of_turn
    raise ConnectionError(f"the master refused this rank: {why}")


def _relay_link(job_dir: Path, relay_args: list[str], deadline: float) -> Channel:
    if (channel := _connect(job_dir)) is not None:
        return channel
    with (job_dir / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one agent starts the relay; the others wait here, then join it
        if (channel := _connect(job_dir)) is not None:
            return channel
        relay = _start_relay(job_dir, relay_args, deadline)
        while (channel := _connect(job_dir)) is None:
            if relay.poll() is not None:
                raise ConnectionError(_relay_error(job_dir))
            if time.monotonic() > deadline + RELAY_GRACE_S:  # the relay gives up at the deadline: its reason
                where = job_dir / jobdir.RELAY_SOCKET
                raise ConnectionError(f"the node relay did not start listening in {where}")
            time.sleep(POLL_S)
        return channel


def listening(job_dir: Path) -> bool:
    """Whether a relay answers on this job's socket now."""
    channel = _connect(job_dir)
    if channel is None:
        return False
    channel.close()
    return True


def _connect(job_dir: Path) -> Channel | None:
    if not (job_dir / jobdir.RELAY_SOCKET).exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(jobdir.relay_socket_path(job_dir))
    except OSError:  # a dead relay's socket: the next relay replaces it
        sock.close()
        return None
    return Channel(sock)


def _start_relay(job_dir: Path, relay_args: list[str], deadline: float) -> subprocess.Popen[bytes]:
    import subprocess  # here: only the agent that starts the node's relay needs it

    command = [*relay_args, "--connect-timeout", f"{max(1.0, deadline - time.monotonic()):.1f}"]
    command += ["--starter-pid", str(os.getpid())]
    with (job_dir / LOG_NAME).open("ab") as log:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _relay_error(job_dir: Path) -> str:
    """The relay's own last line (it says why the master did not admit the node)."""
    with contextlib.suppress(OSError):
        lines = (job_dir / LOG_NAME).read_text(errors="replace").strip().splitlines()
        if lines:
            return lines[-1].removeprefix("gaudi-cluster[relay]: error: ")[: protocol.LAST_LINE_CHARS * 2]
    return "the node relay ended before it listened"
