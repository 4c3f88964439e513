"""Trainer hooks: events, progress heartbeat, step clock, graceful stop on SIGTERM/SIGINT, and the
atomic-checkpoint Trainer mixin (see ``train.checkpoints``)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from train import checkpoints
from train.events import emit, global_rank, write_progress
from train.metrics import StepClock
from train.steptiming import StepTimer, slow_down_if_asked

log = logging.getLogger("train.callbacks")


class StopRequest:
    """Remembers the first SIGTERM/SIGINT; the handler only sets a flag (the step finishes normally)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("signal %d: finishing this step, saving a checkpoint, then stopping", signum)

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)


def inject_fault_once(step: int, output_dir: str) -> None:
    """Fault-injection hook for reliability tests and drills, off unless GAUDI_CLUSTER_FAULT_AT_STEP is set.

    The chosen rank (GAUDI_CLUSTER_FAULT_RANK, default 0) dies with exit code 3 at that step, once: a
    marker in its output_dir keeps a restarted job from failing again, as with a transient fault.
    """
    at_step = os.environ.get("GAUDI_CLUSTER_FAULT_AT_STEP")
    if not at_step or step != int(at_step):
        return
    rank = int(os.environ.get("RANK", "0"))
    if rank != int(os.environ.get("GAUDI_CLUSTER_FAULT_RANK", "0")):
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


class ClusterCallback(TrainerCallback):
    """Per-step work that has to happen on every rank, kept small (one tiny all_reduce when distributed)."""

    def __init__(
        self, stop: StopRequest, clock: StepClock, global_batch: int, collective_device: Any
    ) -> None:
        self.stop = stop
        self.clock = clock
        self.global_batch = global_batch
        self.progress_file = os.environ.get("GAUDI_CLUSTER_PROGRESS_FILE") or None
        self.collective_device = collective_device
        self.timer = StepTimer()
        self.rank = global_rank()
        self._first = True
        self._flag = None
        self._last_log_index = -1
        self.stopped_at: int | None = None

    def _dist(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop.install()
        self.clock.begin(state.global_step)
        self._last_log_index = -1
        if self._dist():
            self.timer.install()
        self.timer.begin()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        slow_down_if_asked(self.rank)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.clock.step(state.global_step)
        if self._first:
            self._first = False
            emit("first_step", step=state.global_step)
        self.timer.step_done(state.global_step)
        if self.progress_file:
            try:
                write_progress(
                    self.progress_file,
                    state.global_step,
                    max_steps=state.max_steps,
                    samples_per_step=self.global_batch,
                    work=list(self.timer.recent),
                )
            except OSError as exc:
                log.warning("cannot write progress file %s: %s", self.progress_file, exc)
                self.progress_file = None
        inject_fault_once(state.global_step, args.output_dir)
        stop = self.stop.signum is not None
        if self._dist():
            import torch
            import torch.distributed as dist

            if self._flag is None:
                self._flag = torch.zeros(1, dtype=torch.int32, device=self.collective_device)
            self._flag.fill_(1 if stop else 0)
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
            stop = bool(self._flag.item())
        if stop:
            self.stopped_at = state.global_step
            if self.stop.signum is None:  # a peer got the signal: stop with the same code
                self.stop.signum = signal.SIGTERM
            control.should_save = True
            control.should_training_stop = True

    def augment_logs(self, logs: dict) -> None:
        """Add the cluster throughput since the previous log line (called by ClusterTrainer.log)."""
        if "loss" not in logs or not self.clock.times:
            return
        seconds, steps = self.clock.window_rate(self._last_log_index)
        self._last_log_index = len(self.clock.times) - 1
        if seconds > 0 and steps > 0:
            logs["samples_per_second"] = round(steps * self.global_batch / seconds, 3)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop.restore()


def make_trainer_class(base: type) -> type:
    """``base`` (Trainer or GaudiTrainer) whose checkpoints are atomic (see ``train.checkpoints``)."""

    class ClusterTrainer(base):  # type: ignore[misc, valid-type]
        def _save_checkpoint(self, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
            limit = self.args.save_total_limit
            # the Trainer's own rotation would run before the new checkpoint is marked complete
            object.__setattr__(self.args, "save_total_limit", None)
            try:
                super()._save_checkpoint(model, trial, *args, **kwargs)
            finally:
                object.__setattr__(self.args, "save_total_limit", limit)
            run_dir = Path(self._get_output_dir(trial=trial))
            ckpt = run_dir / f"checkpoint-{self.state.global_step}"
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                checkpoints.write_marker(ckpt, self.state.global_step, self.args.world_size)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                for gone in checkpoints.rotate(run_dir, limit):
                    log.info("removed old checkpoint %s", gone)

        def log(self, logs: dict, *args: Any, **kwargs: Any) -> None:
            hook = getattr(self, "cluster_log_hook", None)
            if hook is not None:
                hook(logs)
            super().log(logs, *args, **kwargs)

    ClusterTrainer.__name__ = f"Cluster{base.__name__}"
    return ClusterTrainer
