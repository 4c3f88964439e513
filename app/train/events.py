"""Workload events and the progress file (standard library only: imported before torch).

Rank 0 prints ``gaudi-cluster-event {"event": NAME, "t": unix_time, ...}`` lines (docs/architecture.md,
"Workload events"); every rank rewrites ``$GAUDI_CLUSTER_PROGRESS_FILE`` atomically after each step.
"""

from __future__ import annotations

import json
import os
import sys
import time

EVENT_PREFIX = "gaudi-cluster-event "


def global_rank() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def emit(event: str, t: float | None = None, **fields: object) -> None:
    """Print one event line on rank 0 (no-op elsewhere)."""
    if global_rank() != 0:
        return
    record = {"event": event, "t": time.time() if t is None else t, **fields}
    sys.stdout.write(EVENT_PREFIX + json.dumps(record, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def write_progress(path: str, step: int, t: float | None = None) -> None:
    """Atomically replace ``path`` with ``{"step": step, "t": t}``."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(json.dumps({"step": step, "t": time.time() if t is None else t}))
    os.replace(tmp, path)


def parse_events(text: str) -> list[dict]:
    """The event records found in a process's output (for tests and benches)."""
    out = []
    for line in text.splitlines():
        idx = line.find(EVENT_PREFIX)
        if idx >= 0:
            out.append(json.loads(line[idx + len(EVENT_PREFIX) :]))
    return out
