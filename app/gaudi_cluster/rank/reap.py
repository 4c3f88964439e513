"""Stop what is left of one job on this node, found by its pid files (never by a name pattern)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Collection
from pathlib import Path

from gaudi_cluster.rank import jobdir, procgroup


def reap_job(job_root: Path, job_id: str) -> list[int]:
    """Kill each rank's process group and agent (and the node relay) recorded under job_root/job_id;
    return the pids.

    The master runs this (over ssh or srun) on a node whose relay did not reap it, after a failure
    or a stop, once the agents had their chance to end their ranks gracefully: whatever is still
    there is killed without a grace.
    """
    return reap_dir(jobdir.job_dir(job_root, job_id))


def reap_dir(job_dir: Path, keep: Collection[str] = ()) -> list[int]:
    """Kill what the pid files in job_dir name (but those named in `keep`: the relay keeps its own)
    and remove the node's private file; return the pids."""
    killed: list[int] = []
    (job_dir / jobdir.PRIVATE_FILE).unlink(missing_ok=True)
    for pid_file in sorted(job_dir.glob("*.pid")):  # the ranks' and the node relay's
        if pid_file.name in keep:
            continue
        try:
            group, *agents = [int(word) for word in pid_file.read_text().split()]
        except (OSError, ValueError):
            continue
        if procgroup.group_alive(group):
            procgroup.terminate(group, grace_s=0)
            killed.append(group)
        for pid in agents:
            if pid == os.getpid():  # agents in the node process that reaps (launch/node): it ends by itself
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    return killed
