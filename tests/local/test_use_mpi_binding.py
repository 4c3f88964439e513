"""`gaudi_spawn.py --use_mpi` binds its ranks as optimum-habana's DistributedRunner does, for real.

On this node's own Open MPI (Debian's, version 4) and its own lscpu: two ranks, each bound to
sockets x cores per socket // 2 cores, mapped by socket (by slot with one core per socket), ranked with
this Open MPI's spelling, and mpirun's binding report in the job's log; the ranks still all-reduce.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gaudi_cluster.launch import tools
from gaudi_cluster.launch.plan import mpi_binding
from gaudi_cluster.nodes import probe
from gaudi_cluster.settings import profiles

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCE = ROOT / "tests" / "cluster" / "user" / "allreduce.py"

pytestmark = pytest.mark.slow


def test_two_use_mpi_ranks_are_bound_and_train(tmp_path, hold_port):
    results = tmp_path / "results"
    results.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env.update(
        GAUDI_CLUSTER_JOB_ROOT=str(tmp_path / "jobs"),
        GAUDI_CLUSTER_CONTROL_PORT=str(hold_port()),
        RESULT_DIR=str(results),
        PYTHONUNBUFFERED="1",
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "app" / "gaudi_spawn.py"), "--master_port", str(hold_port()),
         "--world_size", "2", "--use_mpi", str(ALLREDUCE)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    binding = mpi_binding(2, probe.cpu_topology())
    assert binding is not None, "lscpu gave no topology on this machine"
    rank_by = profiles.load().dialect(tools.openmpi_major()).rank_by
    expected = (
        f"--bind-to core --map-by {binding.map_by}:PE={binding.pe} --rank-by {rank_by} --report-bindings"
    )
    assert expected in done.stdout + done.stderr
    reports = [line for line in (done.stdout + done.stderr).splitlines() if "bound to" in line]
    assert len(reports) == 2 and all("MCW rank" in line for line in reports), reports
    ranks = [json.loads(p.read_text()) for p in sorted(results.glob("rank-*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == 3.0 for r in ranks)
