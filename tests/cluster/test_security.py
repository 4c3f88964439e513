"""The control channel on a real cluster: the attack that used to stop a job, replayed from a worker
container and from a stranger's container on the training network, with the job id from the logs."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import LABEL

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ATTACKS = Path(__file__).resolve().parents[1] / "support" / "attacks.py"


def test_forged_messages_from_the_network_cannot_stop_the_job(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    cluster.start_master(["/workspace/user/slow.py"], extra_env={"SLOW_S": "40"})
    deadline = time.monotonic() + 180
    job = None
    while job is None and time.monotonic() < deadline:
        log = cluster.logs(cluster.master)
        found = re.search(r"job (\S+): \d+ ranks", log)
        job = found[1] if found and "still training" in log else None
        time.sleep(0.5)
    assert job, cluster.logs(cluster.master)[-3000:]
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

    assert cluster.wait_master(timeout_s=240) == 0, cluster.logs(cluster.master)[-4000:]
    log = cluster.logs(cluster.master)
    assert "succeeded: 3 ranks on 3 nodes" in log
    assert " failed: " not in log and "host intruder" not in log
    refused = [line for line in log.splitlines() if "control channel: refused" in line]
    worker_ip = cluster.ip_of(cluster.worker(1))
    assert any(worker_ip in line for line in refused), refused  # the worker's attempts
    assert any(worker_ip not in line for line in refused), refused  # the stranger's
