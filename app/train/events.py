"""Workload events and the progress file (standard library only: imported before torch).

Rank 0 records ``{"event": NAME, "t": unix_time, ...}`` (docs/architecture.md, "Workload events") as
JSON lines: under gaudi-cluster into ``$GAUDI_CLUSTER_EVENTS_FILE`` (the job directory) and, once the
output directory is known, ``<output_dir>/events.jsonl``, not onto the console
(``GAUDI_CLUSTER_ECHO_EVENTS=1`` prints them too, as ``gaudi-cluster-event {...}`` lines); run on its
own, it prints them. Every rank
rewrites ``$GAUDI_CLUSTER_PROGRESS_FILE`` atomically after each step.
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


EVENTS_FILE_NAME = "events.jsonl"
_recorded: list[str] = []  # every event of this process, for a file added later
_files: list[str] = []


def _append(path: str, lines: list[str]) -> None:
    try:
        with open(path, "a") as out:
            out.write("".join(f"{line}\n" for line in lines))
    except OSError:
        pass  # events are for people and tools; a full disk is reported by the training itself


def emit(event: str, t: float | None = None, **fields: object) -> None:
    """Record one event on rank 0 (no-op elsewhere)."""
    if global_rank() != 0:
        return
    record = {"event": event, "t": time.time() if t is None else t, **fields}
    line = json.dumps(record, sort_keys=False, default=str)
    _recorded.append(line)
    job_file = os.environ.get("GAUDI_CLUSTER_EVENTS_FILE")
    for path in ([job_file] if job_file else []) + _files:
        _append(path, [line])
    if not job_file or _echo():
        sys.stdout.write(EVENT_PREFIX + line + "\n")
        sys.stdout.flush()


def _echo() -> bool:
    from gaudi_cluster.settings.config import parse_bool  # the control plane's one set of words

    try:
        return parse_bool(os.environ.get("GAUDI_CLUSTER_ECHO_EVENTS", ""))
    except ValueError:
        return True  # an unreadable switch errs on the side of showing


def also_record_in(directory: str) -> None:
    """Keep the events in `directory`/events.jsonl too, from the first one (rank 0 only)."""
    if global_rank() != 0:
        return
    path = os.path.join(directory, EVENTS_FILE_NAME)
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as out:  # a new run starts a new record
        out.write("".join(f"{line}\n" for line in _recorded))
    _files.append(path)


def write_progress(path: str, step: int, t: float | None = None, **fields: object) -> None:
    """Atomically replace ``path`` with ``{"step": step, "t": t, **fields}`` (its agent reads it)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(json.dumps({"step": step, "t": time.time() if t is None else t, **fields}))
    os.replace(tmp, path)


def parse_events_file(text: str) -> list[dict]:
    """The records of an events.jsonl file (for tests and benches)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def parse_events(text: str) -> list[dict]:
    """The event records found in a process's output (for tests and benches)."""
    out = []
    for line in text.splitlines():
        idx = line.find(EVENT_PREFIX)
        if idx >= 0:
            out.append(json.loads(line[idx + len(EVENT_PREFIX) :]))
    return out
