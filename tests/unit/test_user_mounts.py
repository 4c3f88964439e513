"""The node scripts bring the user's code, data, Hugging Face cache and secrets (issue 35): what
scripts/run-node.sh and slurm/gaudi-cluster.sbatch hand docker, read from their dry runs."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_NODE = ROOT / "scripts" / "run-node.sh"
SBATCH = ROOT / "slurm" / "gaudi-cluster.sbatch"
TOKEN = "hf_notARealTokenValue42"


def dry_run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "DRY_RUN": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "77"}
    return subprocess.run(
        ["bash", str(script), *args], env={**base, **env}, capture_output=True, text=True, check=False
    )


def volumes(words: list[str]) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word == "-v"]


def passed(words: list[str]) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word == "-e"]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    # This host's own part, as make keys NAMES=$(hostname -s) lays it out (run-node.sh and the sbatch
    # refuse a worker without one).
    (tmp_path / "keys" / "nodes" / socket.gethostname().split(".")[0]).mkdir(parents=True)
    (tmp_path / "keys" / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")
    return tmp_path / "keys"


def test_run_node_mounts_code_data_cache_and_the_jobs_directory(tmp_path, keys):
    for name in ("code", "data", "hf"):
        (tmp_path / name).mkdir()
    env = {
        "GAUDI_CLUSTER_KEYS": str(keys),
        "GAUDI_CLUSTER_OUTPUT": "/srv/out",
        "GAUDI_CLUSTER_CODE": str(tmp_path / "code"),
        "GAUDI_CLUSTER_DATA": str(tmp_path / "data"),
        "GAUDI_CLUSTER_HF_HOME": str(tmp_path / "hf"),
        "GAUDI_CLUSTER_MOUNTS": f"{tmp_path}:/extra:ro",
    }
    master = shlex.split(dry_run(RUN_NODE, "master", "/workspace/code/train.py", **env).stdout)
    worker = shlex.split(dry_run(RUN_NODE, "worker", **env).stdout)
    mine = [
        f"{tmp_path}/code:/workspace/code:ro",
        f"{tmp_path}/data:/workspace/data:ro",
        f"{tmp_path}/hf:/workspace/hf",
        f"{tmp_path}:/extra:ro",
    ]
    for words in (master, worker):
        assert set(mine) <= set(volumes(words)), volumes(words)
        assert "HF_HOME=/workspace/hf" in passed(words)
        # The scripts' own variables are theirs, not the container's.
        assert not [
            name for name in passed(words) if name.startswith(("GAUDI_CLUSTER_CODE", "GAUDI_CLUSTER_MOUNTS"))
        ]
    # Rank logs outlive the master's --rm container: its job root is a host directory.
    assert "/srv/out/jobs:/run/gaudi-cluster/jobs" in volumes(master)
    assert not [v for v in volumes(worker) if v.endswith(":/run/gaudi-cluster/jobs")]
    assert master[-2:] == ["master", "/workspace/code/train.py"]


def test_run_node_passes_env_pass_names_to_the_master_by_name_only(keys):
    env = {"GAUDI_CLUSTER_KEYS": str(keys), "HF_TOKEN": TOKEN, "WANDB_API_KEY": "w" * 12}
    env["GAUDI_CLUSTER_ENV_PASS"] = "WANDB_API_KEY"
    done = dry_run(RUN_NODE, "master", "--env-pass", "HF_TOKEN", "job.py", **env)
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    assert {"HF_TOKEN", "WANDB_API_KEY"} <= set(passed(words))
    assert TOKEN not in done.stdout and "w" * 12 not in done.stdout
    done = dry_run(RUN_NODE, "master", "--env-pass=HF_TOKEN", **env)
    assert "HF_TOKEN" in passed(shlex.split(done.stdout))
    # A worker runs no --env-pass: it gets no secret.
    worker = dry_run(RUN_NODE, "worker", **env)
    assert "HF_TOKEN" not in passed(shlex.split(worker.stdout)) and TOKEN not in worker.stdout


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("GAUDI_CLUSTER_CODE", "/no/such/dir", "GAUDI_CLUSTER_CODE='/no/such/dir'"),
        ("GAUDI_CLUSTER_MOUNTS", "relative:/x", "GAUDI_CLUSTER_MOUNTS entry 'relative:/x'"),
        ("GAUDI_CLUSTER_ENV_PASS", "HF TOKEN", "--env-pass name 'HF TOKEN'"),
    ],
)
def test_run_node_refuses_a_bad_mount_or_name_in_one_line(keys, variable, value, named):
    done = dry_run(RUN_NODE, "master", GAUDI_CLUSTER_KEYS=str(keys), **{variable: value})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and named in done.stderr and "fix:" in done.stderr


def test_sbatch_docker_mode_mounts_the_same_and_gives_the_token_to_node_0_only(tmp_path, keys):
    env = {
        "GAUDI_CLUSTER_KEYS": str(keys),
        "GAUDI_CLUSTER_OUTPUT": "/srv/out",
        "GAUDI_CLUSTER_CODE": "/shared/code",
        "GAUDI_CLUSTER_HF_HOME": "/shared/hf",
        "GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN",
        "HF_TOKEN": TOKEN,
    }
    lines = {}
    for node in ("0", "1"):
        done = dry_run(SBATCH, "/workspace/code/train.py", SLURM_NODEID=node, **env)
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout
        lines[node] = shlex.split(done.stdout.splitlines()[-1])
    for words in lines.values():
        assert {"/shared/code:/workspace/code:ro", "/shared/hf:/workspace/hf"} <= set(volumes(words))
    assert "HF_TOKEN" in passed(lines["0"]) and "HF_TOKEN" not in passed(lines["1"])
    assert "/srv/out/jobs:/run/gaudi-cluster/jobs" in volumes(lines["0"])
    assert "GAUDI_CLUSTER_ENV_PASS" in passed(lines["0"])
    pyxis = dry_run(SBATCH, GAUDI_CLUSTER_SLURM_MODE="pyxis", **env).stdout
    assert "/shared/code:/workspace/code:ro" in pyxis and "/workspace/hf" in pyxis and TOKEN not in pyxis


@pytest.mark.parametrize(
    ("listed", "args"),
    [
        ("HF_TOKEN; WANDB_API_KEY", ()),  # the master splits at ';' too, and drops the blanks
        (" HF_TOKEN ,", ("--env-pass", "WANDB_API_KEY")),
        ("", ("--env-pass=HF_TOKEN;WANDB_API_KEY",)),
    ],
)
def test_run_node_reads_the_names_as_the_master_does(keys, listed, args):
    env = {"GAUDI_CLUSTER_KEYS": str(keys), "HF_TOKEN": TOKEN, "WANDB_API_KEY": "w" * 12}
    done = dry_run(RUN_NODE, "master", *args, "job.py", GAUDI_CLUSTER_ENV_PASS=listed, **env)
    assert done.returncode == 0, done.stderr
    assert {"HF_TOKEN", "WANDB_API_KEY"} <= set(passed(shlex.split(done.stdout)))
    assert TOKEN not in done.stdout and "w" * 12 not in done.stdout


def node_commands(done: subprocess.CompletedProcess, tmp_path: Path, node: str, **env: str) -> list[str]:
    """The docker command that the sbatch's srun step runs on node `node`: its printed step line run
    by bash here, through an `srun` that drops its own options and runs the task."""
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    fake.chmod(0o755)
    path = f"{fake.parent}:{os.environ['PATH']}"
    base = {"PATH": path, "DRY_RUN": "1", "SLURM_JOB_ID": "77", "SLURM_NODEID": node}
    step = ["bash", "-c", done.stdout.splitlines()[0]]
    ran = subprocess.run(step, env={**base, **env}, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    return shlex.split(ran.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("listed", "args"),
    [
        ("", ("--env-pass", "HF_TOKEN")),  # the job's arguments are the master's: its flags count
        ("", ("--env-pass=WANDB_API_KEY,HF_TOKEN",)),
        ("HF_TOKEN; WANDB_API_KEY", ()),
        ("WANDB_API_KEY", ("--env_pass", "HF_TOKEN")),
    ],
)
def test_sbatch_gives_node_0_every_name_the_master_forwards(tmp_path, keys, listed, args):
    env = {"GAUDI_CLUSTER_KEYS": str(keys), "HF_TOKEN": TOKEN, "WANDB_API_KEY": "w" * 12}
    if listed:
        env["GAUDI_CLUSTER_ENV_PASS"] = listed
    job = (*args, "/workspace/code/train.py")
    wandb = "WANDB" in "".join(job) + listed
    for node in ("0", "1"):
        done = dry_run(SBATCH, *job, SLURM_NODEID=node, **env)
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout and "w" * 12 not in done.stdout
        for words in (shlex.split(done.stdout.splitlines()[-1]), node_commands(done, tmp_path, node, **env)):
            names = set(passed(words))
            if node == "0":
                assert "HF_TOKEN" in names and ("WANDB_API_KEY" in names) == wandb
            else:
                assert not {"HF_TOKEN", "WANDB_API_KEY"} & names
            assert words[-len(job) :] == list(job)


def test_sbatch_refuses_a_name_that_is_no_variable_before_any_step(keys):
    done = dry_run(SBATCH, "--env-pass", "HF TOKEN", "train.py", GAUDI_CLUSTER_KEYS=str(keys))
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.count("\n") == 1 and "'HF TOKEN'" in done.stderr and "fix:" in done.stderr
