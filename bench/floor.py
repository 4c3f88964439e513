"""What a training step and a start cost us, in isolation, on the host (no containers).

1. Per-step cost of everything gaudi-cluster adds to a step (ClusterCallback.on_step_end: step clock,
   progress file rewrite, fault-injection check; the log hook), measured in-process over many calls,
   and the one small all-reduce per step that lets every rank stop at the same step, measured in a
   2-rank gloo group; both against the default job's step time.
2. The start-up floor: one rank of the default job alone on one core (imports + model init + first
   step, no launcher at all), and the same once torch/transformers/deepspeed are already imported.
   The cluster figure (containers started → first step) is compared with it in the README.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, WORK, Ctx, Row, Streamed, Target, events_in, failed_row, log, stat
from tests.support.ports import held_port

CALLS = 2000
COLLECTIVES = 300


def _callback_cost_us(tmp: Path) -> float:
    """Microseconds per on_step_end + log hook, with a real progress file and no process group."""
    from train.callbacks import ClusterCallback, StopRequest
    from train.metrics import StepClock

    class Args:
        output_dir = str(tmp)

    class State:
        global_step = 0
        max_steps = CALLS

    class Control:
        should_save = False
        should_training_stop = False

    os.environ["GAUDI_CLUSTER_PROGRESS_FILE"] = str(tmp / "progress.json")
    callback = ClusterCallback(StopRequest(), StepClock(warmup_steps=3), 16, None)
    callback._first = False  # the first-step event is printed once per run, not per step
    state, args, control = State(), Args(), Control()
    callback.clock.begin(0)
    started = time.perf_counter()
    for step in range(1, CALLS + 1):
        state.global_step = step
        callback.on_step_end(args, state, control)
        callback.augment_logs({"loss": 1.0})
    return (time.perf_counter() - started) / CALLS * 1e6


_COLLECTIVE = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
flag = torch.zeros(1, dtype=torch.int32)
for _ in range(20): dist.all_reduce(flag, op=dist.ReduceOp.MAX)
t = time.perf_counter()
for _ in range(int(sys.argv[2])):
    flag.fill_(0); dist.all_reduce(flag, op=dist.ReduceOp.MAX); bool(flag.item())
if dist.get_rank() == 0: print("per-step-us", (time.perf_counter() - t) / int(sys.argv[2]) * 1e6, flush=True)
dist.destroy_process_group()
"""


def _collective_cost_us() -> float:
    with held_port() as port:  # rank 0's store binds it; no other process gets it meanwhile
        return _collective_on(port)


def _collective_on(port: int) -> float:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COLLECTIVE, str(rank), str(COLLECTIVES)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    out = procs[0].communicate(timeout=120)[0]
    procs[1].wait(timeout=120)
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("per-step-us")))


def _default_job(out_dir: Path) -> list[str]:
    from train import DEFAULT_JOB_ARGS, DEFAULT_OUTPUT_DIR

    args = [str(out_dir) if a == DEFAULT_OUTPUT_DIR else a for a in DEFAULT_JOB_ARGS]
    # 20 timed steps after the job's own 3 warm-up steps give the step time the per-step cost is held to.
    return [*args, "--max_steps", "23", "--save_strategy", "no", "--no_save_last_ckpt", "--no_plot"]


_WARM = """
import sys, time
import torch, transformers, deepspeed, datasets  # what a pre-imported interpreter would hold
from transformers import Trainer  # noqa: F401
t = time.time()
print("warm-start", t, flush=True)
sys.argv = ["run_clm.py", *sys.argv[1:]]
from train import run_clm
sys.exit(run_clm.main(sys.argv[1:]))
"""


def _one_rank(tmp: Path, warm: bool) -> tuple[float, float]:
    """(seconds from process start, or from the end of the imports when warm, to the first step;
    seconds per optimizer step after the warm-up)."""
    with held_port() as port:  # the rank's store binds it; no other process gets it meanwhile
        return _one_rank_on(port, tmp, warm)


def _one_rank_on(port: int, tmp: Path, warm: bool) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GAUDI_CLUSTER_DATA_DIR=str(WORK / "data"),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(ROOT / "app"),
        DS_ACCELERATOR="cpu",
    )
    one_core = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    script = ["-c", _WARM] if warm else [str(ROOT / "app" / "train" / "run_clm.py")]
    proc = Streamed([*one_core, sys.executable, "-u", *script, *_default_job(tmp / "out")], env=env, cwd=ROOT)
    try:
        code = proc.wait_exit(600)
        ev = events_in(proc.lines)
        if code != 0 or "first_step" not in ev:
            raise RuntimeError(f"exit {code}:\n{proc.tail(30)}")
        results = json.loads((tmp / "out" / "train_results.json").read_text())
        step_s = 1.0 / float(results["train_steps_per_second"])
        if warm:
            started = next(float(x.split()[1]) for _t, x in proc.lines if x.startswith("warm-start"))
            return ev["first_step"]["t"] - started, step_s
        return ev["first_step"]["t"] - proc.t_start, step_s
    finally:
        proc.stop()


def run(ctx: Ctx) -> list[Row]:
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="gc-floor-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "train.data", "--out", str(WORK / "data")],
            check=True,
            cwd=ROOT / "app",
            capture_output=True,
        )
        reps = ctx.reps(3)
        cold, warm, steps = [], [], []
        for rep in range(reps):
            for is_warm in (rep % 2 == 1, rep % 2 == 0):  # interleaved, alternating first
                first_step_s, step_s = _one_rank(tmp / f"{rep}-{is_warm}", is_warm)
                (warm if is_warm else cold).append(first_step_s)
                steps.append(step_s)
        log(f"floor: one rank cold {min(cold):.1f}s, warm {min(warm):.1f}s")
        rows.append(
            Row(
                "floor.one_rank",
                "Start-up floor: one rank of the default job alone on one core → first step (no launcher)",
                "s",
                stat(cold),
                stat(warm),
                "same, torch/transformers/deepspeed already imported",
                note="what no launcher can go below here; in the cluster rows 3 ranks share the 2 cores",
            )
        )
        callback = stat([_callback_cost_us(tmp) for _ in range(3)])
        collective = stat([_collective_cost_us() for _ in range(2)])
        rows.append(
            Row(
                "step.overhead_us",
                "Per-step cost we add: callback (step clock, progress file, log hook) | stop-flag all-reduce",
                "µs",
                callback,
                collective,
                "the per-step stop-flag all-reduce (gloo, 2 ranks)",
                details={"calls": CALLS, "collectives": COLLECTIVES},
            )
        )
        rows.append(step_overhead_row(rows[-1], statistics.median(steps)))
    except Exception as exc:  # reported, never silently dropped
        rows.append(failed_row("floor.one_rank", "Start-up floor / per-step cost", str(exc)[:800]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def step_overhead_row(overhead: Row, step_seconds: float) -> Row:
    """The per-step cost as a share of one step of the default job (target < 1 %)."""
    total_us = (overhead.ours.median or 0.0) + ((overhead.theirs.median or 0.0) if overhead.theirs else 0.0)
    share = total_us / (step_seconds * 1e6) * 100
    return Row(
        "step.overhead_share",
        f"Per-step cost we add, as a share of a default-job step ({step_seconds * 1000:.0f} ms)",
        "%",
        stat([share]),
        target=Target("ours", "<=", 1.0, "< 1 % of a step"),
    )
