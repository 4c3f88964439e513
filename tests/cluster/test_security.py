"""The control channel on a real cluster: the attack that used to stop a job, replayed from a worker
container and from a stranger's container on the training network, with the job id from the logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from gaudi_cluster_dev.localcluster import LABEL

from tests.support.mounts import user_mounts

if TYPE_CHECKING:
    from tests.cluster.conftest import HeldCluster, MasterRun

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ATTACKS = Path(__file__).resolve().parents[1] / "support" / "attacks.py"


@dataclass
class Held:
    """The module's held cluster (master and two workers, shared by the tests that cut or kill
    nothing: each runs its own job in it, with its own stop file and log) and its shared directory."""

    cluster: HeldCluster
    shared: Path


@pytest.fixture(scope="module")
def held(hold, tmp_path_factory) -> Held:
    shared = tmp_path_factory.mktemp("shared")
    return Held(hold(workers=2, run_args=user_mounts(shared)), shared)


@pytest.fixture
def slow_job(held, request, tmp_path) -> Iterator[Callable[..., MasterRun]]:
    """Start slow.py on the held cluster until this test's stop file exists (SLOW_S: a cap); a run the
    test left behind is stopped, so the next test finds the cluster idle."""
    name = re.sub(r"\W", "_", request.node.name)
    stop = held.shared / f"stop-{name}"
    runs: list[MasterRun] = []

    def start(*args: str, env: dict[str, str] | None = None) -> MasterRun:
        # The ranks' variables go by GAUDI_CLUSTER_ENV: the master forwards only an allow-list of its own.
        ranks = f"SLOW_S=180;STOP_FILE=/workspace/shared/{stop.name}"
        given = {"GAUDI_CLUSTER_ENV": ranks, **(env or {})}
        run = held.cluster.start_in_master(
            "gaudi-cluster",
            "master",
            "/workspace/user/slow.py",
            *args,
            log=tmp_path / "master.log",
            env=given,
        )
        runs.append(run)
        return run

    start.stop = stop.touch  # type: ignore[attr-defined]
    yield start
    stop.touch()
    for run in runs:
        try:
            run.wait(timeout_s=120)
        except subprocess.TimeoutExpired:
            held.cluster.exec(held.cluster.master, "pkill", "-KILL", "-f", "gaudi-cluster master")
            run.process.kill()
            raise


def wait_for_training(run: MasterRun, timeout_s: float = 180) -> str:
    """The master's output once every rank trains (slow.py prints `still training`)."""
    deadline = time.monotonic() + timeout_s
    while "still training" not in run.log():
        assert run.process.poll() is None and time.monotonic() < deadline, run.log()[-3000:]
        time.sleep(0.5)
    return run.log()


def test_forged_messages_from_the_network_cannot_stop_the_job(held, slow_job):
    cluster = held.cluster
    run = slow_job()
    found = re.search(r"job (\S+): \d+ ranks", wait_for_training(run))
    assert found, run.log()[-3000:]
    job = found[1]
    master_ip = cluster.ip_of(cluster.master)
    script = ATTACKS.read_text()

    # From a worker of this very cluster (it holds the ssh key but not the job's secret).
    from_worker = cluster.exec(
        cluster.worker(1), "python", "-c", script, master_ip, "29400", job, timeout=120
    )
    # From a stranger's container on the same network.
    stranger = subprocess.run(
        ["docker", "run", "--rm", "--network", cluster.network, "--label", f"{LABEL}={cluster.name}",
         cluster.image, "python", "-c", script, master_ip, "29400", job, "--flood"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    for done in (from_worker, stranger):
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["forged_exit_closed"] and report["huge_line_closed"], report

    slow_job.stop()  # both attacks are over, the job still ran: let it finish
    assert run.wait(timeout_s=240) == 0, run.log()[-4000:]
    log = run.log()
    assert "succeeded: 3 ranks on 3 nodes" in log
    assert " failed: " not in log and "host intruder" not in log
    refused = [line for line in log.splitlines() if "control channel: refused" in line]
    worker_ip = cluster.ip_of(cluster.worker(1))
    assert any(worker_ip in line for line in refused), refused  # the worker's attempts
    assert any(worker_ip not in line for line in refused), refused  # the stranger's


def stranger(cluster, *argv: str, timeout: float = 240) -> subprocess.Popen[str]:
    """A container of someone else's on the training network, running the attack script."""
    return subprocess.Popen(
        ["docker", "run", "--rm", "--network", cluster.network, "--label", f"{LABEL}={cluster.name}",
         cluster.image, "python", "-c", ATTACKS.read_text(), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_jammed_control_port_still_admits_every_rank(held, slow_job):
    """Nested lines and slowloris peers from the moment the control port opens, while the ranks check
    in: every slot comes back, every handshake has its deadline, the job succeeds."""
    cluster = held.cluster
    jam = stranger(cluster, cluster.ip_of(cluster.master), "29400", "-", "--jam", "15")
    run = slow_job()
    out, _ = jam.communicate(timeout=240)
    slow_job.stop()  # the jam is over: the job (every rank in it) may end
    assert run.wait(timeout_s=240) == 0, run.log()[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["nested_sent"] > 0 and report["nested_closed"] == report["nested_sent"], report
    assert report["slowloris"] > 0 and report["longest_held_s"] < 8, report  # cut at the 5 s deadline
    log = run.log()
    assert "succeeded: 3 ranks on 3 nodes" in log
    assert "control channel: refused" in log


def test_an_impostor_at_a_workers_alias_is_refused_named_and_given_nothing(make_cluster, tmp_path):
    """A container answering at the workers' DNS name with its own host key (it even holds the public
    key, so a login would work): ssh refuses it before the probe sends the job's secrets."""
    cluster = make_cluster(workers=2)
    cluster.start_workers()
    impostor_keys = tmp_path / "impostor-keys"
    impostor_keys.mkdir(mode=0o700)
    (impostor_keys / "id_ed25519.pub").write_bytes((cluster.key_dir / "id_ed25519.pub").read_bytes())
    impostor = f"{cluster.name}-impostor"
    subprocess.run(
        ["docker", "run", "-d", "--name", impostor, "--network", cluster.network, "--network-alias", "worker",
         "--label", f"{LABEL}={cluster.name}", "-v", f"{impostor_keys}:/run/secrets/gaudi-cluster:ro",
         cluster.image, "worker"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    cluster.wait_healthy([*cluster.worker_names, impostor])
    cluster.workers = 3  # the master waits for all three names behind the alias
    cluster.start_master(
        ["/workspace/user/slow.py"], extra_env={"GAUDI_CLUSTER_ENV": "SLOW_S=1", "MY_SECRET_TOKEN": "x"}
    )
    assert cluster.wait_master(timeout_s=180) == 3, cluster.logs(cluster.master)[-3000:]
    log = cluster.logs(cluster.master)
    assert f"{cluster.ip_of(impostor)}: answered with a host key that is not the cluster's" in log, log[
        -3000:
    ]
    staged = cluster.exec(
        impostor, "sh", "-c", "ls -R /run/gaudi-cluster/jobs; cat /proc/*/cmdline | tr '\\0' ' '"
    )
    assert "private.json" not in staged.stdout and "probe" not in staged.stdout, staged.stdout
    assert "rank 0]" not in log  # nothing was launched


def test_a_worker_passing_for_another_or_uncertified_is_refused_by_host_key(make_cluster, tmp_path):
    """Per-node host keys certified by the cluster's CA: a worker of this cluster that takes over
    another node's name (it answers at that name with its own certified key) and a container with an
    uncertified key are refused before anything is sent, each named with the fix; the job runs on the
    other nodes (the two are spares, so it goes on without them)."""
    cluster = make_cluster(workers=2)
    impostor, stranger = f"{cluster.name}-impostor", f"{cluster.name}-stranger"
    taken, own = f"{cluster.name}-w3", f"{cluster.name}-w4"  # the name it takes over, and its own
    keys = tmp_path / "keys"
    subprocess.run(
        [str(Path(__file__).resolve().parents[2] / "scripts" / "make-keys.sh"), str(keys),
         *cluster.worker_names, taken, own],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    cluster.key_dir = keys
    cluster.start_workers()
    stranger_keys = tmp_path / "stranger-keys"
    stranger_keys.mkdir(mode=0o700)
    (stranger_keys / "id_ed25519.pub").write_bytes((keys / "id_ed25519.pub").read_bytes())
    label = ["--label", f"{LABEL}={cluster.name}", "--network", cluster.network]
    for name, alias, mounted in (
        (impostor, taken, keys / "nodes" / own),
        (stranger, stranger, stranger_keys),
    ):
        subprocess.run(
            ["docker", "run", "-d", "--name", name, *label, "--network-alias", alias,
             "-v", f"{mounted}:/run/secrets/gaudi-cluster:ro", cluster.image, "worker"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        cluster.started.append(name)
    cluster.wait_healthy([*cluster.worker_names, impostor, stranger])
    peers = ",".join([*cluster.worker_names, taken, stranger])
    args = cluster.master_args(
        {"GAUDI_CLUSTER_PEERS": peers, "GAUDI_CLUSTER_SPARES": "2", "GAUDI_CLUSTER_MAX_RESTARTS": "1",
         "GAUDI_CLUSTER_ENV": "SLOW_S=1", "MY_SECRET_TOKEN": "x"}
    )  # fmt: skip
    at = args.index("GAUDI_CLUSTER_PEERS_DNS=worker")
    del args[at - 1 : at + 1]
    subprocess.run(
        ["docker", "run", "-d", *args, cluster.image, "master", "/workspace/user/slow.py"], check=True
    )
    cluster.started.append(cluster.master)
    assert cluster.wait_master(timeout_s=240) == 0, cluster.logs(cluster.master)[-4000:]
    log = cluster.logs(cluster.master)
    assert "succeeded: 3 ranks on 3 nodes" in log, log[-3000:]
    refused = [line for line in log.splitlines() if "probe failed; left out" in line]
    assert len(refused) == 1, log[-3000:]
    for name, why in (
        (taken, "its certificate does not name it"),
        (stranger, "no certificate of the cluster's CA"),
    ):
        assert f"{name} (answered with a host key that is not the cluster's ({why}" in refused[0], refused
        assert f"fix: make keys NAMES={name} and start that node with .keys/nodes/{name}" in refused[0]
    for name in (impostor, stranger):
        staged = cluster.exec(
            name, "sh", "-c", "ls -R /run/gaudi-cluster/jobs; cat /proc/*/cmdline | tr '\\0' ' '"
        )
        assert "private.json" not in staged.stdout and "probe" not in staged.stdout, staged.stdout


def test_no_secret_reaches_deepspeeds_runner_pdsh_or_the_log(held, slow_job):
    cluster = held.cluster
    secret = "mlflow-" + os.urandom(8).hex()
    run = slow_job(env={"GAUDI_CLUSTER_LAUNCHER": "deepspeed", "MLFLOW_TRACKING_PASSWORD": secret})
    wait_for_training(run)
    seen = ""
    for name in [cluster.master, *cluster.worker_names]:
        argv = cluster.exec(name, "sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
        assert "pdsh" in argv or "deepspeed.launcher.launch" in argv or name != cluster.master, argv[-2000:]
        seen += argv
    slow_job.stop()  # every node's processes were read while the job ran
    assert run.wait(timeout_s=240) == 0, run.log()[-4000:]
    log = run.log()
    assert "[launcher]" in log and "export " in log  # DeepSpeed's runner logged its pdsh command
    for text in (seen, log, *(cluster.logs(name) for name in cluster.worker_names)):
        assert secret not in text


# Every process of a container, one command line a line.
EACH_CMDLINE = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null"


def test_a_token_argument_reaches_the_program_and_no_launchers_argv_or_log(held, slow_job):
    cluster = held.cluster
    secret = "hf_" + os.urandom(8).hex()
    run = slow_job("--hub_token", secret, f"--token={secret}", env={"GAUDI_CLUSTER_LAUNCHER": "deepspeed"})
    wait_for_training(run)
    programs, launchers = [], []
    for name in [cluster.master, *cluster.worker_names]:
        for line in cluster.exec(name, "sh", "-c", EACH_CMDLINE).stdout.splitlines():
            if "master /workspace/user/slow.py" in line:
                continue  # the master's own command: what the user typed (the warning names the fix)
            if "slow.py" in line and "gaudi_cluster" not in line and "deepspeed" not in line:
                programs.append(line)  # the user's program itself (python -u slow.py ...)
            elif "slow.py" in line:
                launchers.append(line)  # runner, pdsh, ssh, launch.py, the rank agents
    slow_job.stop()  # every node's processes were read while the job ran
    assert run.wait(timeout_s=240) == 0, run.log()[-4000:]
    assert programs and all(f"--hub_token {secret} --token={secret}" in line for line in programs), programs
    assert any("pdsh" in line for line in launchers) and any("rank.agent" in line for line in launchers)
    assert not [line for line in launchers if secret in line]
    master_log = run.log()
    assert "argument(s) --hub_token, --token look like a secret" in master_log
    for text in (master_log, *(cluster.logs(name) for name in cluster.worker_names)):
        assert secret not in text
