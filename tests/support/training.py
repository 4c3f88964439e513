"""Running the bundled workload in tests: paths, the 2-rank DeepSpeed launch, its captured result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.rank.conventions import SHM_DIR, deepspeed_shm_buffer
from train.events import parse_events

from tests.support.ports import held_port

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
SCRIPT = APP / "train" / "run_clm.py"
CPU_DS_CONFIG = APP / "train" / "configs" / "ds_cpu.json"


TRAIN_STEPS = 8
SAVE_STEPS = 4
# A quarter of the model's 256-token context: a step costs about a quarter, and what is under test
# (learning, saves, resumes, the report's figures) is the same.
BLOCK_SIZE = 64


@dataclass
class Run:
    rc: int
    out: str
    err: str

    @property
    def events(self) -> list[dict]:
        return parse_events(self.out)

    def event(self, name: str) -> dict:
        found = [e for e in self.events if e["event"] == name]
        assert found, f"no {name!r} event in output:\n{self.out[-3000:]}\n{self.err[-3000:]}"
        return found[0]


def run_clm(args: list[str], env: dict[str, str], timeout: float = 300, module: bool = False) -> Run:
    cmd = [sys.executable, "-m", "train.run_clm"] if module else [sys.executable, str(SCRIPT)]
    proc = subprocess.run(
        cmd + args, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def run_deepspeed(args: list[str], env: dict[str, str], ranks: int = 2, timeout: float = 600) -> Run:
    with held_port() as port:
        cmd = [
            sys.executable, "-m", "deepspeed.launcher.runner",
            "--num_gpus", str(ranks), "--no_local_rank", "--master_port", str(port),
            str(SCRIPT), *args, "--deepspeed", str(CPU_DS_CONFIG),
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
            )
        finally:
            # Raw DeepSpeed, no rank agent to remove them: its shm all-reduce buffers (67 MB a rank,
            # never unlinked by DeepSpeed) stayed in the host's /dev/shm, 2.6 GB in a day of runs.
            where = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            for rank in range(ranks):
                (SHM_DIR / deepspeed_shm_buffer(where, rank, os.getuid())).unlink(missing_ok=True)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def train_args(output_dir: Path, max_steps: int = TRAIN_STEPS) -> list[str]:
    return [
        "--do_train",
        "--output_dir", str(output_dir),
        "--max_steps", str(max_steps),
        "--save_steps", str(SAVE_STEPS),
        "--logging_steps", "1",
        "--per_device_train_batch_size", "4",
        "--learning_rate", "2e-3",
        "--warmup_steps", "0",
        "--throughput_warmup_steps", "2",
        "--seed", "7",
        "--block_size", str(BLOCK_SIZE),
    ]  # fmt: skip


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
