"""Stop what is left of one job on this node, found by its pid files (never by a name pattern)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def reap_job(job_root: Path, job_id: str) -> list[int]:
    """SIGKILL each rank's process group and agent recorded under job_root/job_id; return the pids."""
    killed: list[int] = []
    job_dir = job_root / job_id
    for pid_file in sorted(job_dir.glob("rank*.pid")):
        try:
            pids = [int(word) for word in pid_file.read_text().split()]
        except (OSError, ValueError):
            continue
        group, *agent = pids
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
            killed.append(group)
        for pid in agent:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    return killed
