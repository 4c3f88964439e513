"""The smoke job a new user runs first: 5 steps of the default workload in fresh containers, which must
exit 0 every time (it once aborted after success, SIGABRT, exit 134: a thread of the master was still
at work when its interpreter exited). Each run gets new containers, so the master's first matplotlib
import and every start-up cost are those of a fresh cluster, and the master starts right after the
workers, as a script or the benchmark starts it."""

from __future__ import annotations

import os

import pytest
from gaudi_cluster.supervise.lifetime import LEFT_AT_EXIT

pytestmark = [pytest.mark.docker, pytest.mark.slow]

APP = "/opt/gaudi-cluster/app/train"
FIVE_STEPS = [
    f"{APP}/run_clm.py", "--do_train", "--output_dir", "/workspace/output", "--deepspeed",
    f"{APP}/configs/ds_cpu.json", "--max_steps", "5",
]  # fmt: skip
# Two by default (each run is 15 s of the suite); set more to hunt a rare exit race.
RUNS = int(os.environ.get("GAUDI_CLUSTER_TEST_SHORT_RUNS", "2"))


def test_a_5_step_job_in_fresh_containers_exits_0_every_time(make_cluster, tmp_path):
    for run in range(RUNS):
        cluster = make_cluster(workers=2, output_dir=tmp_path / f"output-{run}")
        cluster.start_workers()
        cluster.start_master(FIVE_STEPS)
        code = cluster.wait_master(timeout_s=600)
        log = cluster.logs(cluster.master)
        assert code == 0, f"run {run + 1} of {RUNS} exited {code}:\n{log[-4000:]}"
        assert "succeeded: 3 ranks on 3 nodes" in log
        assert LEFT_AT_EXIT not in log, log[-2000:]
        cluster.remove()
