"""Training metrics in the style of optimum-habana, plus MFU, memory and a plot.

* ``train_samples_per_second``: cluster-wide, ``global_batch * (steps - warmup) / (t_end - t_warm)``
  where ``t_warm`` is the end of the ``--throughput_warmup_steps``-th optimizer step of this run and
  ``global_batch = per_device_batch * grad_accum * world_size`` (same definition as optimum-habana's
  ``speed_metrics``; warmup is skipped only when more steps than warmup steps ran);
* ``train_tokens_per_second`` = samples/s * block_size; ``train_steps_per_second`` likewise;
* ``mfu`` = 6 * params * tokens/s / (peak FLOP/s per device * world_size): a rough, attention-free
  estimate; peak from ``--peak_tflops`` or the device table in ``train.device``;
* memory: CUDA ``max_memory_allocated``, HPU ``memory_stats()["MaxInUse"]``, CPU peak RSS (this rank).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_cluster.wire.kinds import Accelerator

PLOT_NAME = "training_curves.png"


@dataclass
class StepClock:
    """Timestamps of optimizer steps (perf_counter), kept cheap: two floats per step."""

    warmup_steps: int = 0
    t_begin: float | None = None
    first_step: int = 0
    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def begin(self, global_step: int) -> None:
        self.t_begin = time.perf_counter()
        self.first_step = global_step

    def step(self, global_step: int) -> None:
        self.steps.append(global_step)
        self.times.append(time.perf_counter())

    def window_rate(self, since_index: int) -> tuple[float, int]:
        """(seconds, steps) between entry ``since_index`` (or begin when -1) and the last step."""
        if not self.times:
            return 0.0, 0
        t0 = self.t_begin if since_index < 0 else self.times[since_index]
        s0 = self.first_step if since_index < 0 else self.steps[since_index]
        if t0 is None:
            return 0.0, 0
        return self.times[-1] - t0, self.steps[-1] - s0


def throughput(clock: StepClock, global_batch: int, block_size: int) -> dict[str, float]:
    """Samples/steps/tokens per second after the warmup steps (see the module docstring)."""
    n = len(clock.times)
    if n == 0:
        return {}
    warm = clock.warmup_steps if clock.warmup_steps < n else 0
    seconds, steps = clock.window_rate(warm - 1)
    if seconds <= 0 or steps <= 0:
        return {}
    sps = steps / seconds
    return {
        "train_steps_per_second": round(sps, 4),
        "train_samples_per_second": round(sps * global_batch, 4),
        "train_tokens_per_second": round(sps * global_batch * block_size, 2),
        "throughput_warmup_steps_applied": warm,
    }


def mfu(n_params: int, tokens_per_second: float, peak_tflops: float | None, world_size: int) -> float | None:
    if not peak_tflops or not tokens_per_second:
        return None
    return 6.0 * n_params * tokens_per_second / (peak_tflops * 1e12 * max(1, world_size))


def train_metrics(
    trainer_metrics: dict[str, Any],
    clock: StepClock,
    *,
    global_batch: int,
    block_size: int,
    n_params: int,
    world_size: int,
    peak_tflops: float | None,
    memory: dict[str, float],
    train_samples: int,
    global_step: int,
) -> dict[str, Any]:
    """What a training run reports: the Trainer's metrics plus throughput, MFU, memory and the counts."""
    metrics = dict(trainer_metrics)
    metrics.update(throughput(clock, global_batch, block_size))
    value = mfu(n_params, metrics.get("train_tokens_per_second", 0.0), peak_tflops, world_size)
    if value is not None:
        metrics["mfu"] = round(value, 6)
        metrics["peak_tflops_per_device"] = peak_tflops
    metrics.update(memory)
    metrics["train_samples"] = train_samples
    metrics["global_batch_size"] = global_batch
    metrics["world_size"] = world_size
    metrics["n_params"] = n_params
    metrics["global_step"] = global_step
    return metrics


def eval_metrics(trainer_metrics: dict[str, Any], eval_samples: int) -> dict[str, Any]:
    """The Trainer's evaluation metrics plus the sample count and the perplexity."""
    metrics = dict(trainer_metrics)
    metrics["eval_samples"] = eval_samples
    metrics["perplexity"] = perplexity(metrics["eval_loss"])
    return metrics


def memory_metrics(kind: Accelerator) -> dict[str, float]:
    """Peak device memory of this rank in GB, where the device reports it."""
    gb = 1024**3
    try:
        if kind is Accelerator.CUDA:
            import torch

            return {
                "max_memory_allocated (GB)": round(torch.cuda.max_memory_allocated() / gb, 3),
                "total_memory_available (GB)": round(
                    torch.cuda.get_device_properties(0).total_memory / gb, 3
                ),
            }
        if kind is Accelerator.HPU:
            import habana_frameworks.torch.hpu as hthpu  # type: ignore[import-not-found]

            stats = hthpu.memory_stats()
            return {
                "memory_allocated (GB)": round(stats.get("InUse", 0) / gb, 3),
                "max_memory_allocated (GB)": round(stats.get("MaxInUse", 0) / gb, 3),
                "total_memory_available (GB)": round(stats.get("Limit", 0) / gb, 3),
            }
        import resource

        # ru_maxrss is in KiB on Linux
        return {"peak_rss (GB)": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 3)}
    except Exception:
        return {}


def perplexity(eval_loss: float) -> float:
    try:
        return math.exp(eval_loss)
    except OverflowError:
        return float("inf")


def plot_curves(log_history: list[dict[str, Any]], out_png: Path) -> Path | None:
    """Loss and throughput against step (from the Trainer's log history); returns the PNG path."""
    loss = [(h["step"], h["loss"]) for h in log_history if "loss" in h and "step" in h]
    rate = [(h["step"], h["samples_per_second"]) for h in log_history if "samples_per_second" in h]
    if not loss and not rate:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    if loss:
        ax1.plot([s for s, _ in loss], [v for _, v in loss], marker=".")
    ax1.set_ylabel("training loss")
    ax1.grid(alpha=0.3)
    if rate:
        ax2.plot([s for s, _ in rate], [v for _, v in rate], marker=".", color="tab:green")
    ax2.set_ylabel("samples/s (cluster)")
    ax2.set_xlabel("optimizer step")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out_png.with_name(out_png.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(out_png)
    return out_png
