"""The master's Reach over srun against a stand-in `srun` (no Slurm here): one step for every node, the
labelled output read back by the node each task names, and a task that stages its own payload only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gaudi_cluster.nodes.reach import SrunReach, failures
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.nodes.survey import probe_nodes
from gaudi_cluster.rank import jobdir
from gaudi_cluster.wire.private_payload import PayloadBundle, PrivatePayload

# Runs each task of the step one after another, in the reverse of the node list's order (Slurm's task
# order need not be ours), with SLURMD_NODENAME set, stdin to every task (--input=all), --label, and
# srun's own line for a failed task. FAIL_ON names a node whose task exits 3.
FAKE_SRUN = r"""#!PYTHON
import os, subprocess, sys
args, opts = sys.argv[1:], {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
hosts = opts["nodelist"].split(",")
data = sys.stdin.buffer.read() if opts.get("input") == "all" else b""
code = 0
for task, host in reversed(list(enumerate(hosts))):
    env = {**os.environ, "SLURMD_NODENAME": host}
    command = ["false"] if host == os.environ.get("FAIL_ON") else args
    done = subprocess.run(command, input=data, capture_output=True, env=env)
    for line in done.stdout.decode().splitlines():
        print(f"{task}: {line}" if "label" in opts else line)
    if done.returncode:
        print(f"srun: error: {host}: task {task}: Exited with exit code {done.returncode}", file=sys.stderr)
        code = done.returncode
sys.exit(code)
"""


@pytest.fixture
def step(tmp_path: Path) -> SrunStep:
    fake = tmp_path / "srun"
    fake.write_text(FAKE_SRUN.replace("PYTHON", sys.executable))
    fake.chmod(0o755)
    return SrunStep(str(fake), 42)


def probe_command(job_root: Path, stage: bool, srun_task: bool = False) -> list[str]:
    command = [sys.executable, "-m", "gaudi_cluster.nodes.probe", "--json", "--accelerator", "cpu"]
    command += ["--srun-task"] if srun_task else []
    return command + (["--stage", "j1", "--job-root", str(job_root)] if stage else [])


def test_one_probe_step_reports_every_node_by_the_name_its_task_gives(step, tmp_path):
    command = probe_command(tmp_path, False)
    reports, unreachable = probe_nodes(
        SrunReach(step), ["node1", "node2"], command, None, time.monotonic() + 60
    )
    assert sorted(reports) == ["node1", "node2"] and unreachable == {}
    assert reports["node1"].accelerator == "cpu"


def test_a_failed_task_is_named_with_sruns_verdict(step, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_ON", "node2")
    command = probe_command(tmp_path, False)
    reports, unreachable = probe_nodes(
        SrunReach(step), ["node1", "node2"], command, None, time.monotonic() + 60
    )
    assert sorted(reports) == ["node1"]
    assert unreachable == {"node2": "srun: Exited with exit code 1"}
    failed = failures(SrunReach(step).run(["node1", "node2"], ["true"], timeout_s=30, label="gc-reap"))
    assert failed == {"node2": "srun: Exited with exit code 1"}
    assert SrunReach(step).run([], ["true"], timeout_s=30) == {}


def test_a_probe_over_srun_sends_every_nodes_payload_in_one_bundle_and_each_stages_its_own(step, tmp_path):
    payloads = {host: PrivatePayload(host, f"key-of-{host}") for host in ("node1", "node2")}
    command = probe_command(tmp_path, True)
    reports, unreachable = probe_nodes(
        SrunReach(step), ["node1", "node2"], command, payloads.__getitem__, time.monotonic() + 60
    )
    assert sorted(reports) == ["node1", "node2"] and unreachable == {}
    # The stand-in runs both tasks on this machine, into one job directory: the last task's own key.
    private = tmp_path / "j1" / jobdir.PRIVATE_FILE
    assert json.loads(private.read_text())["token"] == "key-of-node1"


def test_a_probe_task_stages_its_own_payload_and_nothing_of_the_others(tmp_path):
    bundle = PayloadBundle(
        {"node1": PrivatePayload("node1", "key-of-node1"), "node2": PrivatePayload("node2", "key-of-node2")}
    )
    env = {**os.environ, "SLURMD_NODENAME": "node2"}
    done = subprocess.run(
        probe_command(tmp_path, True, srun_task=True),
        check=False,
        input=bundle.to_json(),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "gaudi-cluster-node node2"
    private = tmp_path / "j1" / jobdir.PRIVATE_FILE
    assert json.loads(private.read_text())["token"] == "key-of-node2"
    assert private.stat().st_mode & 0o777 == 0o600
    written = "".join(path.read_text() for path in tmp_path.rglob("*") if path.is_file())
    assert "key-of-node1" not in written + done.stdout + done.stderr


def test_the_local_reach_runs_here_and_says_why_a_command_failed():
    from gaudi_cluster.nodes.reach import LocalReach

    reach = LocalReach()
    ok = reach.run(["this"], ["sh", "-c", "echo one; echo two"])["this"]
    assert ok.ok and ok.lines == ("one", "two") and ok.why == ""
    given = reach.run(["this"], ["cat"], stdin_of=lambda host: f"for {host}\n")["this"]
    assert given.lines == ("for this",)
    failed = reach.run(["this"], ["sh", "-c", "echo gone >&2; exit 3"])["this"]
    assert not failed.ok and failed.why == "exit code 3: gone"
    assert failures({"this": failed}) == {"this": "exit code 3: gone"}


def test_the_ssh_reach_gives_each_node_its_own_stdin_and_ssh_failures_in_words(tmp_path, monkeypatch):
    from gaudi_cluster.nodes import ssh
    from gaudi_cluster.nodes.reach import SshReach

    seen = {}

    def fake_run_on_hosts(hosts, argv, config, timeout_s, connect_timeout_s=None, stdin=None):
        seen.update({host: (stdin(host), connect_timeout_s) for host in hosts})
        return {
            "a": ssh.SshResult("a", 0, "report\n", ""),
            "b": ssh.SshResult("b", 255, "", "ssh: connect to host b port 3022: Connection refused"),
        }

    monkeypatch.setattr(ssh, "run_on_hosts", fake_run_on_hosts)
    reach = SshReach(tmp_path / "ssh_config", 3022)
    replies = reach.run(["a", "b"], ["true"], stdin_of=lambda host: f"key of {host}", timeout_s=3)
    assert seen == {"a": ("key of a", 1), "b": ("key of b", 1)}  # a short run connects within 1 s
    assert replies["a"].ok and replies["a"].lines == ("report",)
    assert not replies["b"].ok and "nothing listens on port 3022" in replies["b"].why
    reach.close()  # nothing opened: nothing to close, no error
