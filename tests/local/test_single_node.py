"""Single-node runs need no ssh: gaudi_spawn.py on the host venv, no sshd, no keys, real ranks.

optimum-habana runs `--world_size N --use_mpi|--use_deepspeed` and `--world_size 1` on this node
only; so does the drop-in, still under the rank agents (supervision and the failure report work).
Every case points the ssh settings at nothing (a closed port, no key directory) to prove no ssh
is attempted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.host_tools import require
from tests.support.ports import held_port

ROOT = Path(__file__).resolve().parents[2]
GAUDI_SPAWN = ROOT / "app" / "gaudi_spawn.py"
ALLREDUCE = ROOT / "tests" / "cluster" / "user" / "allreduce.py"

pytestmark = pytest.mark.slow


def spawn(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if "--use_mpi" in argv:
        require("mpirun")
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    with held_port() as ssh, held_port() as control, held_port() as rendezvous:
        base.update(
            {
                "GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs"),
                "GAUDI_CLUSTER_SSH_PORT": str(ssh),  # held, nothing listens: any ssh attempt would fail
                "GAUDI_CLUSTER_SSH_DIR": str(tmp_path / "no-keys"),
                "GAUDI_CLUSTER_CONTROL_PORT": str(control),
                "RESULT_DIR": str(results),
                "PYTHONUNBUFFERED": "1",
                **(env or {}),
            }
        )
        return subprocess.run(
            [sys.executable, str(GAUDI_SPAWN), "--master_port", str(rendezvous), *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=base,
            timeout=300,
            check=False,
        )


def results(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results").glob("rank-*.json"))]


@pytest.mark.parametrize("launcher", ["--use_deepspeed", "--use_mpi"])
def test_two_ranks_all_reduce_locally_without_ssh(tmp_path, launcher):
    done = spawn(tmp_path, "--world_size", "2", launcher, str(ALLREDUCE), "--note", "two words")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "launching locally, no ssh" in done.stderr
    ranks = results(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world"] == 2 and r["argv"] == ["--note", "two words"] for r in ranks)
    assert [r["env"]["LOCAL_RANK"] for r in ranks] == ["0", "1"]
    assert {r["env"]["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
    assert "job " in done.stdout and "succeeded: 2 ranks on 1 nodes" in done.stdout


def test_a_failing_rank_fails_the_spawn_with_the_one_line_report(tmp_path):
    done = spawn(tmp_path, "--world_size", "2", "--use_deepspeed", str(ALLREDUCE), env={"FAIL_RANK": "1"})
    assert done.returncode == 1, done.stdout[-3000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("gaudi-cluster: job ")]
    assert len(summary) == 1 and "rank 1 exited with code 1" in summary[0], done.stdout[-3000:]
    assert "failing on purpose" in summary[0]


def test_one_card_runs_one_rank_and_deepspeed_single_card_passes_local_rank(tmp_path):
    plain = spawn(tmp_path, str(ALLREDUCE), "x")
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    assert [(r["rank"], r["world"], r["argv"]) for r in results(tmp_path)] == [(0, 1, ["x"])]
    for old in (tmp_path / "results").glob("*.json"):
        old.unlink()
    card = spawn(tmp_path, "--use_deepspeed", str(ALLREDUCE), "y")
    assert card.returncode == 0, card.stdout[-3000:] + card.stderr[-3000:]
    # optimum-habana's single card: `deepspeed --num_gpus 1` without --no_local_rank.
    assert [r["argv"] for r in results(tmp_path)] == [["--local_rank=0", "y"]]


def test_env_pass_reaches_the_ranks_privately(tmp_path):
    done = spawn(
        tmp_path,
        "--world_size", "2", "--use_mpi", str(ALLREDUCE),
        env={"GAUDI_CLUSTER_ENV_PASS": "MY_SERVICE_TOKEN", "MY_SERVICE_TOKEN": "s3cr3t-value",
             "ECHO_VARS": "MY_SERVICE_TOKEN"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert all(r["present"] == {"MY_SERVICE_TOKEN": True} for r in results(tmp_path))
    assert "s3cr3t-value" not in done.stdout + done.stderr
    assert "delivered privately" in done.stderr and "MY_SERVICE_TOKEN" in done.stderr
    # Staged 0600 for the agents, then removed once every rank had read it.
    assert list((tmp_path / "jobs").glob("*/rank0.log")) and not list(
        (tmp_path / "jobs").glob("*/private.json")
    )
