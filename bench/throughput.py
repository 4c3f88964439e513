"""5. Workload throughput on CPU, single process, host venv: the bundled workload (app/train/run_clm.py,
our callbacks, step clock, progress file) vs the same model, data, batch and steps under a plain
transformers Trainer (bench/plain_trainer.py). Interleaved, alternating which goes first.

samples/s: optimizer steps after the first WARMUP steps (train.metrics' definition, used by both).
Time to first step: from spawning the process to the `first_step` event.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    NO_SAVE_NO_LOG,
    ROOT,
    WORK,
    Ctx,
    Row,
    Streamed,
    Target,
    events_in,
    failed_row,
    log,
    stat,
)

STEPS = 80  # ~15 s of timed steps: a 15-step run (2 s) was mostly noise on shared cores
WARMUP = 3
BATCH = 4
TIMEOUT = 600.0


def env(tmp: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    out.update(
        GAUDI_CLUSTER_DATA_DIR=str(WORK / "data"),
        GAUDI_CLUSTER_PROGRESS_FILE=str(tmp / "progress.json"),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        # One thread, on one core (below): intra-op threads fighting other processes for 2 shared cores
        # made two runs of this bench disagree by 15 %.
        OMP_NUM_THREADS="1",
    )
    return out


ONE_CORE = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def run_ours(tmp: Path) -> dict:
    out_dir = tmp / "ours"
    argv = [
        str(ROOT / "app" / "train" / "run_clm.py"),
        "--do_train",
        "--output_dir",
        str(out_dir),
        "--max_steps",
        str(STEPS),
        "--per_device_train_batch_size",
        str(BATCH),
        "--throughput_warmup_steps",
        str(WARMUP),
        *NO_SAVE_NO_LOG,
        "--report_to",
        "none",
    ]
    results_file = out_dir / "train_results.json"
    return timed_run("run_clm", argv, tmp, lambda _lines: json.loads(results_file.read_text()))


def run_plain(tmp: Path) -> dict:
    argv = [
        str(ROOT / "bench" / "plain_trainer.py"),
        "--output_dir",
        str(tmp / "plain"),
        "--max_steps",
        str(STEPS),
        "--batch",
        str(BATCH),
        "--warmup",
        str(WARMUP),
    ]

    def printed_result(lines: list[tuple[float, str]]) -> dict:
        line = next(x for _t, x in lines if x.startswith("bench-result "))
        return json.loads(line[len("bench-result ") :])

    return timed_run("plain Trainer", argv, tmp, printed_result)


def timed_run(
    what: str, script_argv: list[str], tmp: Path, results_of: Callable[[list[tuple[float, str]]], dict]
) -> dict:
    """Run one training script; samples/s from its results, time to first step from its events."""
    proc = Streamed([*ONE_CORE, sys.executable, "-u", *script_argv], env=env(tmp), cwd=ROOT)
    try:
        code = proc.wait_exit(TIMEOUT)
        if code != 0:
            raise RuntimeError(f"{what} exited {code}:\n{proc.tail(30)}")
        ev = events_in(proc.lines)
        return {
            "sps": float(results_of(proc.lines)["train_samples_per_second"]),
            "ttfs": ev["first_step"]["t"] - proc.t_start,
        }
    finally:
        proc.stop()


def run(ctx: Ctx) -> list[Row]:
    reps = ctx.reps(4)
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "train.data", "--out", str(WORK / "data")],
        check=True,
        cwd=ROOT / "app",
        capture_output=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    ours: list[dict] = []
    plain: list[dict] = []
    errors: list[str] = []
    pair_s = 0.0
    for rep in range(reps):
        if pair_s and not ctx.can_start(pair_s):
            errors.append(f"time budget: {rep} of {reps} planned pairs")
            break
        t_pair = time.time()
        order = ("ours", "plain") if rep % 2 == 0 else ("plain", "ours")
        for who in order:
            tmp = WORK / f"throughput-{who}-{rep}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                r = run_ours(tmp) if who == "ours" else run_plain(tmp)
                (ours if who == "ours" else plain).append(r)
                log(f"throughput: {who}: {r['sps']:.1f} samples/s, first step after {r['ttfs']:.1f}s")
            except Exception as exc:
                errors.append(f"{who}: {str(exc)[:800]}")
                log(f"throughput: {who} failed: {str(exc)[:800]}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        pair_s = time.time() - t_pair
    if not ours or not plain:
        return [
            failed_row("throughput.sps", "Workload samples/s vs plain Trainer", "; ".join(errors) or "no run")
        ]
    note = (
        f"tiny GPT-2 (configs/tiny-gpt2.json), batch {BATCH}, block 256, {STEPS} steps, {WARMUP} warm-up, "
        "1 thread on 1 core"
    )
    if errors:
        note += "; failures: " + "; ".join(e.splitlines()[0] for e in errors)
    paired = [o["sps"] / p["sps"] for o, p in zip(ours, plain, strict=False)]
    return [
        Row(
            "throughput.sps",
            "Workload samples/s, CPU, 1 process (ours vs plain Trainer)",
            "samples/s",
            stat([r["sps"] for r in ours]),
            stat([r["sps"] for r in plain]),
            "plain transformers Trainer",
            Target("ratio", ">=", 0.98, "ratio ≥ 0.98"),
            note=note,
            details={"ours": ours, "plain": plain},
        ),
        Row(
            "throughput.paired",
            "  samples/s ratio of each interleaved pair (ours / plain Trainer)",
            "",
            stat(paired),
            target=Target("ours", ">=", 0.98, "≥ 0.98"),
        ),
        Row(
            "throughput.ttfs",
            "Workload process start → first step, CPU (ours vs plain Trainer)",
            "s",
            stat([r["ttfs"] for r in ours]),
            stat([r["ttfs"] for r in plain]),
            "plain transformers Trainer",
        ),
    ]
