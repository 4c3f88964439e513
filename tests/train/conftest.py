"""Fixtures for the workload tests: offline env, embedded data, one real 2-rank DeepSpeed training run.

Everything runs on CPU with nothing from the network (HF_HUB_OFFLINE=1). The trained output directory is
made once per session and shared: tests that need their own copy copy it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.training import APP, Run, run_deepspeed, train_args


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


@pytest.fixture(scope="session")
def trained(train_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The default model trained for TRAIN_STEPS steps on 2 CPU ranks with the DeepSpeed launcher."""
    out = tmp_path_factory.mktemp("trained") / "out"
    run = run_deepspeed(train_args(out), train_env)
    assert run.rc == 0, f"training failed rc={run.rc}\n{run.out[-4000:]}\n{run.err[-6000:]}"
    return out, run
