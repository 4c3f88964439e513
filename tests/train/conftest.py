"""Fixtures for the workload tests: offline env, embedded data, one real 2-rank DeepSpeed training run.

Everything runs on CPU with nothing from the network (HF_HUB_OFFLINE=1). The trained output directory is
made once per session and shared: tests that need their own copy copy it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
SCRIPT = APP / "train" / "run_clm.py"
CPU_DS_CONFIG = APP / "train" / "configs" / "ds_cpu.json"

sys.path.insert(0, str(APP))
from train.events import parse_events  # noqa: E402

TRAIN_STEPS = 8
SAVE_STEPS = 4


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    subprocess.run(
        [sys.executable, "-m", "train.data", "--out", str(root)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(APP)},
        capture_output=True,
        timeout=300,
    )
    return root


@pytest.fixture(scope="session")
def train_env(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    hf_home = tmp_path_factory.mktemp("hf_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env.update(
        {
            "PYTHONPATH": str(APP),
            "GAUDI_CLUSTER_DATA_DIR": str(data_root),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(hf_home),
            "DS_ACCELERATOR": "cpu",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def run_clm(args: list[str], env: dict[str, str], timeout: float = 300, module: bool = False) -> Run:
    cmd = [sys.executable, "-m", "train.run_clm"] if module else [sys.executable, str(SCRIPT)]
    proc = subprocess.run(
        cmd + args, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def run_deepspeed(args: list[str], env: dict[str, str], ranks: int = 2, timeout: float = 600) -> Run:
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner",
        "--num_gpus", str(ranks), "--no_local_rank", "--master_port", str(free_port()),
        str(SCRIPT), *args, "--deepspeed", str(CPU_DS_CONFIG),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
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
    ]  # fmt: skip


@pytest.fixture(scope="session")
def trained(train_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The default model trained for TRAIN_STEPS steps on 2 CPU ranks with the DeepSpeed launcher."""
    out = tmp_path_factory.mktemp("trained") / "out"
    run = run_deepspeed(train_args(out), train_env)
    assert run.rc == 0, f"training failed rc={run.rc}\n{run.out[-4000:]}\n{run.err[-6000:]}"
    return out, run


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
