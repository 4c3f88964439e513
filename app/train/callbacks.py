"""Trainer hooks: events, progress heartbeat, step clock, graceful stop on SIGTERM/SIGINT, and the
atomic-checkpoint Trainer mixin (see ``train.checkpoints`` for the steps of a save, ``train.timeline``
for the decisions every rank takes together)."""

from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

from gaudi_cluster.wire.workload_events import WorkloadEvent
from transformers import TrainerCallback

from train import checkpoints, faults, timeline
from train.errors import CheckpointWriteError
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
            emit(WorkloadEvent.FIRST_STEP, step=state.global_step)
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
        faults.exit_at_step(state.global_step, args.output_dir)
        faults.hit("sigterm", state.global_step)
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


def disk_full_error(step: int, ckpt: Path) -> CheckpointWriteError:
    free = checkpoints.free_bytes(ckpt)
    kept = checkpoints.latest_complete(ckpt.parent)
    survivor = (
        f"the newest complete checkpoint there, {kept[1].name}, is intact" if kept else "none was complete"
    )
    return CheckpointWriteError(
        f"No space left on device: {ckpt.name} could not be written on {socket.gethostname()} ({ckpt}, "
        f"{free if free is not None else '?'} bytes free); {survivor}; fix: free space there or point "
        "--output_dir at a larger volume"
    )


def make_trainer_class(base: type) -> type:
    """``base`` (Trainer or GaudiTrainer) whose checkpoints are atomic (see ``train.checkpoints``)."""

    class ClusterTrainer(base):  # type: ignore[misc, valid-type]
        cluster_collective = timeline.Collective(False)

        def _save_checkpoint(self, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
            step = self.state.global_step
            run_dir = Path(self._get_output_dir(trial=trial))
            ckpt = run_dir / f"checkpoint-{step}"
            faults.hit("before_files", step)
            faults.hit("fill_disk", step, str(run_dir))
            writer = self.args.should_save
            limit = self.args.save_total_limit
            # the Trainer's own rotation would run before the new checkpoint is marked complete
            object.__setattr__(self.args, "save_total_limit", None)
            try:
                if checkpoints.unmark(ckpt):
                    log.warning("saving over %s: its completion marker was removed first", ckpt)
                super()._save_checkpoint(model, trial, *args, **kwargs)
                faults.hit("after_files", step)
                self.accelerator.wait_for_everyone()
                faults.hit("before_marker", step)
                if writer:
                    checkpoints.write_marker(ckpt, step, self.args.world_size)
                self.accelerator.wait_for_everyone()
                # After the barrier: every writer's marker is on disk. Right after its own, a rank that
                # died could beat a slower peer's marker to the teardown (a busy node), and the save
                # the fault means to leave complete everywhere was not.
                faults.hit("after_marker", step)
            except Exception as exc:
                if checkpoints.disk_full(exc, ckpt):
                    raise disk_full_error(step, ckpt) from exc
                raise
            finally:
                object.__setattr__(self.args, "save_total_limit", limit)
            removed = timeline.rotate(
                run_dir,
                limit,
                writer=writer,
                collective=self.cluster_collective,
                on_renamed=lambda _path: faults.hit("during_rotation", step),
            )
            for gone in removed:
                log.info("removed old checkpoint %s", gone)

        def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
            faults.hit("during_files", self.state.global_step)
            faults.hit("sigterm_in_save", self.state.global_step)
            super()._save_optimizer_and_scheduler(output_dir)

        def log(self, logs: dict, *args: Any, **kwargs: Any) -> None:
            hook = getattr(self, "cluster_log_hook", None)
            if hook is not None:
                hook(logs)
            super().log(logs, *args, **kwargs)

    ClusterTrainer.__name__ = f"Cluster{base.__name__}"
    return ClusterTrainer
