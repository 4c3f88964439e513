"""Node: the node relay run inside a node process instead of as a process of its own.

The direct launcher's node process (launch/node) lives as long as its ranks where it is an srun task
or runs on the master's own node; there it starts the node's relay in a thread before its agents, so
the node starts one interpreter fewer. It takes the relay's lock while the relay connects and until it
listens: the agents (relay_join) wait on that lock, then find the relay listening and join it, as they
would join a relay process another agent started. Its lines go to the job's relay.log, as a relay
process's output does; it writes no pid file (the agents' own files name what a reap must end).
"""

from __future__ import annotations

import fcntl
import threading
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.rank import jobdir, relay_join
from gaudi_cluster.rank.relay import CLOSE_WAIT_S, Relay

# How long its end may take once its agents have exited (their links closing; after a stop the reap).
END_S = 5.0


@dataclass
class HostedRelay:
    """The node's relay running in this node process: the relay and its thread."""

    relay: Relay
    thread: threading.Thread

    def end(self, timeout_s: float = END_S) -> None:
        """Its agents have all exited: let it end (its last messages sent) and wait for it."""
        self.relay.end_once_idle(timeout_s)
        self.thread.join(timeout_s + CLOSE_WAIT_S)  # its link's close waits for the master's


def host(
    job_id: str, job_root: Path, control: str, heartbeat_timeout_s: float, connect_timeout_s: float
) -> HostedRelay | None:
    """Start the node's relay in this process, before its agents; None when a relay already listens
    there. If the master does not admit the node, the relay's reason goes to its log and the lock is
    let go: the first agent then starts a relay process as always, which meets the same refusal and
    says it."""
    job_dir = jobdir.create(job_root, job_id)
    lock = (job_dir / relay_join.LOCK_NAME).open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if relay_join.listening(job_dir):
        lock.close()
        return None
    relay = Relay(job_id, job_dir, control, heartbeat_timeout_s)
    relay.said_to = (job_dir / relay_join.LOG_NAME).open("a")

    def work() -> None:
        try:
            relay.connect(connect_timeout_s)
        except ConnectionError as error:
            relay.say(f"error: {error}")
            lock.close()
            relay.end(f"the master did not admit the node ({error})")
            return
        relay.serve(pid_file=False, listening=lock.close)

    thread = threading.Thread(target=work, name="node-relay", daemon=True)
    thread.start()
    return HostedRelay(relay, thread)
