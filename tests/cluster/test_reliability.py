"""Faults on real containers: the job must end fast, name the culprit, leave nothing behind, resume."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import time

import pytest
from gaudi_cluster_dev.localcluster import docker

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SCRIPT = "/opt/gaudi-cluster/app/train/run_clm.py"
CPU_CONFIG = "/opt/gaudi-cluster/app/train/configs/ds_cpu.json"


def long_job(max_steps: int, save_steps: int = 10) -> list[str]:
    """The bundled workload on 64-token blocks (the default is the model's 256): a step costs about a
    quarter, and what these tests watch (steps, saves, restarts, the ranks' processes) is the same."""
    return [
        SCRIPT,
        "--do_train",
        "--output_dir",
        "/workspace/output",
        "--deepspeed",
        CPU_CONFIG,
        "--max_steps",
        str(max_steps),
        "--save_steps",
        str(save_steps),
        "--logging_steps",
        "1",
        "--block_size",
        "64",
    ]


def rank0_step(cluster) -> int:
    done = cluster.exec(cluster.master, "sh", "-c", "cat /run/gaudi-cluster/jobs/*/rank0.progress")
    steps = [int(m) for m in re.findall(r'"step": (\d+)', done.stdout)]
    return max(steps, default=-1)


def wait_until_training(cluster, min_step: int = 1, timeout_s: float = 240) -> None:
    def training() -> bool:
        # rank 0's events go to the job directory on its node (the master), not the console
        done = cluster.exec(cluster.master, "sh", "-c", "cat /run/gaudi-cluster/jobs/*/events.jsonl")
        return '"first_step"' in done.stdout and (min_step <= 1 or rank0_step(cluster) >= min_step)

    assert wait_for(training, timeout_s), cluster.logs(cluster.master)[-3000:]


def job_processes(cluster, name: str) -> list[str]:
    """Processes of any job on a node: rank agents and what they run (python), not sshd/tini."""
    done = cluster.exec(name, "ps", "-eo", "pid,args", "--no-headers")
    return [
        line
        for line in done.stdout.splitlines()
        if "gaudi_cluster.rank.agent" in line
        or "gaudi_cluster.launch.node" in line
        or "gaudi_cluster.launch.fanout" in line
        or "run_clm" in line
        or "deepspeed.launcher" in line
        or "allreduce" in line
    ]


def relay_processes(cluster, name: str) -> list[str]:
    """Node relays running as processes of their own on a node (not one a node process runs)."""
    done = cluster.exec(name, "ps", "-eo", "pid,args", "--no-headers")
    return [line for line in done.stdout.splitlines() if "gaudi_cluster.rank.relay" in line.split()]


def ssh_clients(cluster) -> list[str]:
    """ssh client processes on the master (a shared connection shows as `ssh: ... [mux]`), not sshd."""
    done = cluster.exec(cluster.master, "ps", "-eo", "pid,rss,args", "--no-headers")
    found = []
    for line in done.stdout.splitlines():
        command = line.split(None, 2)[2].split()[0]
        if command in ("ssh", "ssh:") or command.endswith("/ssh"):
            found.append(line)
    return found


def private_files(cluster) -> dict[str, str]:
    """The job's private files still on each node (master and workers)."""
    found = {}
    for name in (cluster.master, *cluster.worker_names):
        done = cluster.exec(name, "sh", "-c", "ls /run/gaudi-cluster/jobs/*/private.json 2>/dev/null || true")
        if done.stdout.strip():
            found[name] = done.stdout.strip()
    return found


def relay_logs(cluster, names) -> str:
    """Each node's relay.log (why its relay ended, what it sent last): what a cleanup assertion shows.
    Copied out, not read by `docker exec`: the master's container has stopped with its job."""
    shown = []
    for name in names:
        copied = subprocess.run(
            ["docker", "cp", f"{name}:/run/gaudi-cluster/jobs", "-"], check=False, capture_output=True
        )
        if copied.returncode != 0:
            shown.append(f"--- {name}\n{copied.stderr.decode(errors='replace')}")
            continue
        with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
            for member in tar.getmembers():
                if member.name.endswith("/relay.log") and (log := tar.extractfile(member)) is not None:
                    shown.append(f"--- {name}: {member.name}\n{log.read().decode(errors='replace')}")
    return "\n".join(shown)


def summary_line(log: str) -> str:
    lines = [line for line in log.splitlines() if re.match(r"gaudi-cluster: job \S+ failed:", line)]
    assert len(lines) == 1, log[-3000:]
    return lines[0]


def started_cluster(make_cluster, workers: int = 2):
    cluster = make_cluster(workers=workers)
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    return cluster


LAUNCHERS = pytest.mark.parametrize("launcher", ["direct", "deepspeed"])


@LAUNCHERS
def test_killed_worker_stops_the_job_everywhere_and_is_named(make_cluster, launcher):
    cluster = started_cluster(make_cluster)
    cluster.start_master(long_job(2000), extra_env={"GAUDI_CLUSTER_LAUNCHER": launcher})
    wait_until_training(cluster)
    if launcher == "direct":
        # Once the ranks are in, their output and exits travel over the node relays: the launch
        # sessions have ended and the shared connections with them (issue 33).
        assert wait_for(lambda: not ssh_clients(cluster), 15), ssh_clients(cluster)
        # and each node's relay removed its private file (the node key, --env-pass values)
        assert wait_for(lambda: not private_files(cluster), 15), private_files(cluster)
        # The master's own node process lives as long as its rank and runs the relay itself; a
        # worker's ended with its launch session, so its first agent started the relay as a process.
        relays = {
            name: len(relay_processes(cluster, name)) for name in (cluster.master, *cluster.worker_names)
        }
        assert relays == {cluster.master: 0, cluster.worker(1): 1, cluster.worker(2): 1}, relays
    victim = cluster.worker(2)
    docker("kill", victim)
    killed_at = time.monotonic()
    code = cluster.wait_master(timeout_s=60)
    detected_s = time.monotonic() - killed_at
    log = cluster.logs(cluster.master)
    assert code != 0
    assert "host worker-2" in summary_line(log)
    assert detected_s < 15, detected_s
    for survivor in (cluster.worker(1),):
        assert wait_for(lambda s=survivor: not job_processes(cluster, s), 15), job_processes(
            cluster, survivor
        )
    # The survivors' relays reaped their nodes after the stop: the master reached none of them to
    # clean up (issue 33), and skipped the dead one.
    report = json.loads((cluster.output_dir / "job_report.json").read_text())
    cleaned = {how: sorted(nodes) for how, nodes in report["cleanup"].items()}
    assert cleaned == {"by_relay": ["master", "worker-1"], "by_master": [], "skipped": ["worker-2"]}, (
        cleaned,
        relay_logs(cluster, (cluster.master, cluster.worker(1))),
        log[-3000:],
    )


def test_network_partition_ends_the_job_within_30s_naming_the_node(make_cluster):
    cluster = started_cluster(make_cluster)
    cluster.start_master(long_job(2000))
    wait_until_training(cluster)
    victim = cluster.worker(1)
    docker("network", "disconnect", cluster.network, victim)
    cut_at = time.monotonic()
    code = cluster.wait_master(timeout_s=90)
    elapsed = time.monotonic() - cut_at
    log = cluster.logs(cluster.master)
    assert code != 0
    summary = summary_line(log)
    assert "worker-1" in summary or "worker-" in summary, summary
    assert elapsed < 30, elapsed
    # The cut-off node's own agents notice the silent master and stop their ranks too.
    assert wait_for(lambda: not job_processes(cluster, victim), 20), job_processes(cluster, victim)
    assert wait_for(lambda: not job_processes(cluster, cluster.worker(2)), 15)


def test_lost_master_ends_worker_ranks_and_workers_take_the_next_job(make_cluster, tmp_path):
    cluster = started_cluster(make_cluster)
    cluster.start_master(long_job(2000))
    wait_until_training(cluster)
    docker("kill", cluster.master)
    killed_at = time.monotonic()
    for worker in cluster.worker_names:
        assert wait_for(lambda w=worker: not job_processes(cluster, w), 10), job_processes(cluster, worker)
    assert time.monotonic() - killed_at < 12
    docker("rm", "-f", cluster.master)
    cluster.start_master(["/workspace/user/allreduce.py"])
    assert cluster.wait_master(timeout_s=180) == 0, cluster.logs(cluster.master)[-3000:]
    assert len(list((tmp_path / "shared").glob("rank-*.json"))) == 3


def _global_step(output) -> int:
    states = sorted(
        output.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    return json.loads(states[-1].read_text())["global_step"]


@LAUNCHERS
def test_docker_stop_saves_then_a_restart_resumes_to_the_full_step_count(make_cluster, launcher):
    cluster = started_cluster(make_cluster)
    total = 20  # the stop comes at step 7 or later: 13 steps of margin for it to land before the end
    chosen = {"GAUDI_CLUSTER_LAUNCHER": launcher}
    cluster.start_master(long_job(total, save_steps=5), extra_env=chosen)
    wait_until_training(cluster, min_step=7)
    stopped = subprocess.run(["docker", "stop", "-t", "40", cluster.master], capture_output=True, check=False)
    assert stopped.returncode == 0
    assert cluster.wait_master(timeout_s=60) == 143, cluster.logs(cluster.master)[-3000:]
    saved = _global_step(cluster.output_dir)
    assert 5 <= saved < total
    docker("rm", "-f", cluster.master)
    cluster.start_master(long_job(total, save_steps=5), extra_env=chosen)
    assert cluster.wait_master(timeout_s=600) == 0, cluster.logs(cluster.master)[-3000:]
    log = cluster.logs(cluster.master)
    assert re.search(rf"resum\w* .*checkpoint-{saved}\b", log, re.IGNORECASE), log[-3000:]
    assert _global_step(cluster.output_dir) == total


@LAUNCHERS
def test_max_restarts_survives_one_injected_rank_failure(make_cluster, launcher):
    cluster = started_cluster(make_cluster)
    total = 12  # the fault at step 9 resumes from checkpoint-8
    cluster.start_master(
        long_job(total, save_steps=4),
        extra_env={
            "GAUDI_CLUSTER_LAUNCHER": launcher,
            "GAUDI_CLUSTER_MAX_RESTARTS": "1",
            "GAUDI_CLUSTER_ENV": "GAUDI_CLUSTER_FAULT_AT_STEP=9;GAUDI_CLUSTER_FAULT_RANK=1",
        },
    )
    code = cluster.wait_master(timeout_s=600)
    log = cluster.logs(cluster.master)
    assert code == 0, log[-4000:]
    assert "restarting the job" in log
    assert "rank 1 exited with code" in summary_line(log)
    assert _global_step(cluster.output_dir) == total
