"""Fault injection for reliability drills and the fault-matrix tests; off unless its variables are set.

``GAUDI_CLUSTER_FAULTS``: comma-separated ``POINT@STEP[:rank=R][:attempt=A]``; the fault fires when
this process is global rank R (default ``GAUDI_CLUSTER_FAULT_RANK``, else 0), in attempt A of the job
(default 1: a transient fault, gone on the restart) and at STEP. Points, in the order of a save:

  before_files      the save of STEP starts: die before writing anything
  fill_disk         the save of STEP starts: fill output_dir's file system, then go on (the save fails)
  during_files      the model's files are written, the optimizer's are not: die
  sigterm_in_save   same place: SIGTERM the container's PID 1 (what ``docker stop`` does), go on
  after_files       every file written, before the barrier that precedes the markers: die
  before_marker     after that barrier: die without a marker, a second later (the peers write theirs:
                    detecting a dead node takes far longer than writing a marker)
  after_marker      every writer's marker written (the barrier after them passed), before rotation: die
  during_rotation   the first checkpoint to remove is renamed, not yet deleted: die
  sigterm           at the end of STEP (not a save point): SIGTERM the container's PID 1, go on

"Die" is ``os._exit(3)`` after one log line, as a node dies: no clean-up, nothing flushed.
``GAUDI_CLUSTER_FAULT_AT_STEP`` (the older form: the chosen rank exits 3 at that step, once) stays.
``GAUDI_CLUSTER_FAULT_PAUSE_DIR=DIR``: on a restart, rank 0 writes DIR/paused-A and waits (at most
5 minutes) for DIR/go-A before the resume is chosen, so a test can look at every node's checkpoints
as the fault left them.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from train.events import global_rank
from train.timeline import attempt_number

log = logging.getLogger("train.faults")

DIE = frozenset(
    {"before_files", "during_files", "after_files", "before_marker", "after_marker", "during_rotation"}
)
POINTS = DIE | {"fill_disk", "sigterm_in_save", "sigterm"}
FILLER = ".fault-filler"
PAUSE_LIMIT_S = 300.0


@dataclass(frozen=True)
class Fault:
    point: str
    step: int
    rank: int
    attempt: int


def parse_faults(text: str, default_rank: int = 0) -> tuple[Fault, ...]:
    """``POINT@STEP[:rank=R][:attempt=A]`` items; ValueError names a bad one."""
    faults = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        head, *options = item.split(":")
        point, _, step = head.partition("@")
        fields = {"rank": default_rank, "attempt": 1}
        for option in options:
            name, _, value = option.partition("=")
            if name not in fields or not value.isdigit():
                raise ValueError(f"GAUDI_CLUSTER_FAULTS: {item!r}: options are rank=N and attempt=N")
            fields[name] = int(value)
        if point not in POINTS or not step.isdigit():
            raise ValueError(
                f"GAUDI_CLUSTER_FAULTS: {item!r}: write POINT@STEP, POINT one of {', '.join(sorted(POINTS))}"
            )
        faults.append(Fault(point, int(step), fields["rank"], fields["attempt"]))
    return tuple(faults)


@functools.cache
def _mine() -> tuple[Fault, ...]:
    env = os.environ
    chosen = parse_faults(env.get("GAUDI_CLUSTER_FAULTS", ""), int(env.get("GAUDI_CLUSTER_FAULT_RANK", "0")))
    rank, attempt = global_rank(), attempt_number(env)
    return tuple(f for f in chosen if f.rank == rank and f.attempt == attempt)


def _die(point: str, step: int) -> None:
    log.error(
        "injected fault: rank %d dies (%s of step %d, GAUDI_CLUSTER_FAULTS)", global_rank(), point, step
    )
    logging.shutdown()
    os._exit(3)


def _stop_container(point: str, step: int) -> None:
    """SIGTERM to PID 1, only when it is the image's tini: never a host's init."""
    try:
        if Path("/proc/1/comm").read_text().strip() != "tini":
            log.error("injected fault %s skipped: PID 1 is not the container's tini", point)
            return
    except OSError:
        return
    log.warning("injected fault: rank %d sends SIGTERM to PID 1 (%s of step %d)", global_rank(), point, step)
    os.kill(1, signal.SIGTERM)


def _fill(output_dir: str) -> None:
    path = Path(output_dir) / FILLER
    log.warning("injected fault: rank %d fills the file system of %s", global_rank(), output_dir)
    chunk = b"\0" * (1 << 20)
    try:
        with open(path, "ab") as fh:
            while True:
                fh.write(chunk)
                fh.flush()
    except OSError:
        pass
    try:  # the last bytes a page-sized write could not take
        with open(path, "ab") as fh:
            while True:
                fh.write(b"\0" * 512)
                fh.flush()
    except OSError:
        pass


def hit(point: str, step: int, output_dir: str = "") -> None:
    """Fire the faults chosen for this rank, this attempt, this point and step."""
    for fault in _mine():
        if fault.point != point or fault.step != step:
            continue
        if point == "before_marker":
            time.sleep(1.0)
        if point in DIE:
            _die(point, step)
        elif point == "fill_disk":
            _fill(output_dir)
        else:
            _stop_container(point, step)


def exit_at_step(step: int, output_dir: str, env: Mapping[str, str] | None = None) -> None:
    """``GAUDI_CLUSTER_FAULT_AT_STEP``: the chosen rank (GAUDI_CLUSTER_FAULT_RANK, default 0) exits with
    code 3 at that step, once: a marker in its output_dir keeps a restarted job from failing again."""
    env = os.environ if env is None else env
    at_step = env.get("GAUDI_CLUSTER_FAULT_AT_STEP")
    if not at_step or step != int(at_step):
        return
    rank = global_rank()
    if rank != int(env.get("GAUDI_CLUSTER_FAULT_RANK", "0")):
        return
    marker = Path(output_dir) / f".fault-injected-rank{rank}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{step}\n")
    log.error(
        "injected fault: rank %d exits with code 3 at step %d (GAUDI_CLUSTER_FAULT_AT_STEP)", rank, step
    )
    logging.shutdown()
    os._exit(3)


def pause_before_resume(env: Mapping[str, str] | None = None) -> None:
    """``GAUDI_CLUSTER_FAULT_PAUSE_DIR``: rank 0 of a restart waits for the test's go-ahead."""
    env = os.environ if env is None else env
    directory, attempt = env.get("GAUDI_CLUSTER_FAULT_PAUSE_DIR"), attempt_number(env)
    if not directory or attempt < 2 or global_rank() != 0:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"paused-{attempt}").write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (Path(directory) / f"go-{attempt}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
