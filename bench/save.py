"""Checkpoint save time, 2 CPU ranks, host venv: the save with issue 24's steps (its marker removed
first, the ranks' agreement on the newest common checkpoint before rotation) against the save as it
was before, in the same processes, interleaved (bench/save_worker.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from bench.common import ROOT, WORK, Ctx, Row, Target, failed_row, log, stat
from tests.support.ports import held_port

TIMEOUT = 600.0
FIGURE = "Checkpoint save, 2 CPU ranks, DeepSpeed ZeRO-0 (ours vs the save before issue 24)"


def run(ctx: Ctx) -> list[Row]:
    rounds = ctx.reps(40)
    tmp = WORK / "save"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env.update(
        GAUDI_CLUSTER_DATA_DIR=str(WORK / "data"),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--no_local_rank",
        "--master_port", "PORT", str(ROOT / "bench" / "save_worker.py"),
        "--output_dir", str(tmp), "--rounds", str(rounds),
    ]  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "train.data", "--out", str(WORK / "data")],
        check=True,
        cwd=ROOT / "app",
        capture_output=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        with held_port() as port:  # the rendezvous binds it; no other process gets it meanwhile
            cmd[cmd.index("PORT")] = str(port)
            done = subprocess.run(
                cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
            )
        line = next((x for x in done.stdout.splitlines() if "bench-result " in x), None)
        if done.returncode != 0 or line is None:
            return [failed_row("save.checkpoint", FIGURE, f"exit {done.returncode}: {done.stderr[-600:]}")]
        seconds = json.loads(line.split("bench-result ", 1)[1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ours, today = seconds["ours"], seconds["today"]
    log(f"save: ours {sorted(ours)[len(ours) // 2]:.3f}s, before {sorted(today)[len(today) // 2]:.3f}s")
    paired = [o / t for o, t in zip(ours, today, strict=True)]
    return [
        Row(
            "save.checkpoint",
            FIGURE,
            "s",
            stat(ours),
            stat(today),
            "the save before issue 24 (commit 50755ed)",
            Target("ratio", "<=", 1.05, "no slower: ratio ≤ 1.05"),
            note=f"tiny GPT-2, save_total_limit 2 (one checkpoint removed per save), {rounds} pairs",
            details={"ours": ours, "today": today},
        ),
        Row(
            "save.paired",
            "  save time ratio of each interleaved pair (ours / before)",
            "",
            stat(paired),
            target=Target("ours", "<=", 1.05, "≤ 1.05"),
        ),
    ]
