"""Runs in rank 0's training program (`train`, which writes them) and in the master (`view.report`
and the report's startup points, which read them): the names of the workload's events, one JSON
object a line in the job's events.jsonl, `{"event": NAME, "t": seconds, ...}`. Pure."""

from __future__ import annotations

from gaudi_cluster.wire.kinds import StrEnum


class WorkloadEvent(StrEnum):
    START = "start"  # the program started (t: the interpreter's start)
    IMPORTS_DONE = "imports_done"
    RESUME = "resume"  # the checkpoint it resumes from (step: 0 from scratch)
    MODEL_READY = "model_ready"
    FIRST_STEP = "first_step"
    TRAIN_STOPPED = "train_stopped"  # stopped by a signal, after saving (step, signal)
    TRAIN_DONE = "train_done"
    EVAL_DONE = "eval_done"


# The program's way to its first step, in order: the report's startup phases run between them.
STARTUP = (
    WorkloadEvent.START,
    WorkloadEvent.IMPORTS_DONE,
    WorkloadEvent.MODEL_READY,
    WorkloadEvent.FIRST_STEP,
)
