"""Preflight (doctor) and bad input on a real cluster: clear error, exit code, nothing launched."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.mounts import USER_DIR
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

USER_SCRIPT = "/workspace/user/allreduce.py"


@pytest.fixture(scope="module")
def held(hold):
    """A master that prepared the cluster and stays up, so every case is one `docker exec`."""
    return hold(workers=2, run_args=["-v", f"{USER_DIR}:/workspace/user:ro"])


def run_in_master(cluster, *argv: str, env: dict[str, str] | None = None, timeout: float = 120):
    return cluster.in_master(*argv, env=env, timeout=timeout)


def write_in_master(cluster, path: str, text: str) -> None:
    subprocess.run(
        ["docker", "exec", "-i", cluster.master, "sh", "-c", f"cat > {path}"],
        input=text,
        text=True,
        check=True,
    )


def assert_nothing_launched(done) -> None:
    assert "rank 0]" not in done.stdout and "deepspeed.launcher" not in done.stdout


def ssh_clients_and_sockets(cluster) -> tuple[str, str]:
    """The master's ssh client processes and shared-connection directories (sshd is not a client)."""
    clients = run_in_master(cluster, "pgrep", "-a", "-x", "ssh").stdout.strip()
    sockets = run_in_master(cluster, "sh", "-c", "ls -d /tmp/gc-ssh-* 2>/dev/null || true").stdout.strip()
    return clients, sockets


def no_ssh_left(cluster) -> bool:
    """No ssh client or shared-connection directory on the master within a few seconds: `ssh -O stop`
    returns before the control master it stops has exited."""
    return bool(wait_for(lambda: ssh_clients_and_sockets(cluster) == ("", ""), 10))


def test_doctor_reports_every_node_as_a_table_or_as_json_and_leaves_no_ssh_behind(held):
    assert no_ssh_left(held), ssh_clients_and_sockets(held)
    done = run_in_master(held, "gaudi-cluster", "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "CHECK", "RESULT"]
    assert not any(line.lstrip().startswith(("[", "{")) for line in lines), done.stdout
    as_json = run_in_master(held, "gaudi-cluster", "doctor", "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    findings = json.loads(as_json.stdout)  # the whole of stdout: JSON and nothing else
    hosts = {f["host"] for f in findings}
    assert len(hosts) == 3
    assert {f["check"] for f in findings} >= {"ssh", "slots", "interface", "workload"}
    assert all(f["ok"] or not f["blocking"] for f in findings)
    # Each doctor opened one shared ssh connection per node; each ended them when it finished.
    assert no_ssh_left(held), ssh_clients_and_sockets(held)


@pytest.mark.parametrize(
    ("case", "hostfile", "expect"),
    [
        ("malformed", "worker-1 slots=two\n", ":1:"),
        ("duplicate hosts", "worker-1 slots=1\nworker-1 slots=1\n", ":2:"),
        ("zero slots", "worker-1 slots=0\n", ":1:"),
        ("unknown token", "worker-1 slots=1 gpus=2\n", ":1:"),
    ],
)
def test_bad_hostfile_exits_2_naming_file_and_line(held, case, hostfile, expect):
    write_in_master(held, "/tmp/bad-hostfile", hostfile)
    done = run_in_master(held, "gaudi-cluster", "master", "--hostfile", "/tmp/bad-hostfile", USER_SCRIPT)
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("gaudi-cluster: error:") and "/tmp/bad-hostfile" + expect in error
    assert_nothing_launched(done)


@pytest.mark.parametrize(
    ("case", "env_spec", "culprit"),
    [
        ("shell metacharacter", "FOO=a$b", "FOO"),
        ("secret", "HF_TOKEN=hf_abc", "HF_TOKEN"),
        ("bad name", "1BAD=x", "1BAD"),
        ("no equals", "JUSTANAME", "JUSTANAME"),
    ],
)
def test_bad_env_entries_exit_2(held, case, env_spec, culprit):
    done = run_in_master(held, "gaudi-cluster", "master", "--env", env_spec, USER_SCRIPT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert culprit in done.stderr.strip().splitlines()[-1]
    assert "hf_abc" not in done.stdout + done.stderr
    assert_nothing_launched(done)


def test_script_missing_on_one_node_is_caught_before_launch(held):
    subprocess.run(
        ["docker", "exec", held.master, "cp", USER_SCRIPT, "/workspace/only-on-master.py"], check=True
    )
    done = run_in_master(held, "gaudi-cluster", "master", "/workspace/only-on-master.py")
    assert done.returncode == 3, done.stdout + done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "workload" in error and "/workspace/only-on-master.py is missing" in error
    assert_nothing_launched(done)


def test_package_version_differing_on_one_node_is_caught(held):
    worker = held.worker(2)
    patch = (
        "f=$(ls -d /opt/venv/lib/python3*/site-packages/deepspeed-*.dist-info)/METADATA; "
        "cp $f /tmp/METADATA.orig; sed -i 's/^Version: .*/Version: 0.0.1/' $f"
    )
    subprocess.run(["docker", "exec", worker, "sh", "-c", patch], check=True)
    try:
        done = run_in_master(held, "gaudi-cluster", "master", USER_SCRIPT)
    finally:
        restore = (
            "cp /tmp/METADATA.orig "
            "$(ls -d /opt/venv/lib/python3*/site-packages/deepspeed-*.dist-info)/METADATA"
        )
        subprocess.run(["docker", "exec", worker, "sh", "-c", restore], check=True)
    assert done.returncode == 3, done.stdout + done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "deepspeed 0.0.1" in error and held.ip_of(worker) in error
    assert_nothing_launched(done)
