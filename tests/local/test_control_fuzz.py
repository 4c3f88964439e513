"""The control port under fire during a real job: random bytes, a 10 MB line, thousands of half-open
connections, wrong types and the old forged exit. The job must succeed and the master's memory stay
bounded (a single-node job: the master and its control port on this host)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support import attacks
from tests.support.host_tools import require

ROOT = Path(__file__).resolve().parents[2]
SLOW = ROOT / "tests" / "cluster" / "user" / "slow.py"

pytestmark = pytest.mark.slow


def test_the_job_survives_the_attacks_and_memory_stays_bounded(tmp_path, hold_port):
    require("mpirun")
    port = hold_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env.update(
        GAUDI_CLUSTER_JOB_ROOT=str(tmp_path / "jobs"),
        GAUDI_CLUSTER_CONTROL_PORT=str(port),
        SLOW_S="120",  # a cap: the test ends the job (STOP_FILE) once the attacks and its figures are done
        STOP_FILE=str(tmp_path / "stop"),
        PYTHONUNBUFFERED="1",
    )
    master = subprocess.Popen(
        [sys.executable, str(ROOT / "app" / "gaudi_spawn.py"), "--master_port", str(hold_port()),
         "--world_size", "2", "--use_mpi", str(SLOW)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(master.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("still training" in line for line in lines) and time.monotonic() < deadline:
        assert master.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.2)
    job = next(m[1] for line in lines if (m := re.search(r"job (\S+): 2 ranks", line)))
    rss_before = psutil.Process(master.pid).memory_info().rss

    try:
        report = {
            "forged_exit_closed": attacks.forged_exit("127.0.0.1", port, job),
            "garbage_dropped": attacks.garbage("127.0.0.1", port, job, count=40),
            "huge_line_closed": attacks.huge_line("127.0.0.1", port, megabytes=10),
            "half_open": attacks.half_open("127.0.0.1", port, 2000),
        }
    except OSError as error:
        master.kill()
        pytest.fail(f"the control port stopped answering ({error}):\n{''.join(lines)[-4000:]}")
    rss_after = psutil.Process(master.pid).memory_info().rss
    (tmp_path / "stop").touch()
    assert master.wait(timeout=180) == 0, "".join(lines)[-4000:]
    reader.join(5)
    log = "".join(lines)
    assert report["forged_exit_closed"] and report["huge_line_closed"]
    assert report["garbage_dropped"] == 40
    assert "succeeded: 2 ranks on 1 nodes" in log
    assert "control channel: refused 127.0.0.1" in log
    assert " failed: " not in log and "host intruder" not in log
    assert rss_after - rss_before < 50 * 2**20, (rss_before, rss_after)
