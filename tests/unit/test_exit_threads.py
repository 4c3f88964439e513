"""No thread of ours is alive when the master's interpreter exits (the smoke job's SIGABRT, exit 134).

The race is forced: a rank floods the console while the console drains slowly, and the job ends
while the console is still behind (as the first step's plotting warm-up once made it, holding the
CPU while a 5-step job finished). The old reader thread, a daemon left running after a 2 s join, was
then still writing when the interpreter exited. Now every attempt's thread ends before run() returns.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gaudi_cluster.supervise import lifetime

from tests.support.ports import held_port
from tests.unit.test_supervise import supervise

LINES = 1000
FLOOD = "yes " + "x" * 200 + f" | head -n {LINES}"


class SlowConsole(io.StringIO):
    """A console that takes its time with every line (a slow terminal, a full log pipe)."""

    def write(self, text: str) -> int:
        time.sleep(0.01)
        return super().write(text)


def test_a_flooding_job_leaves_no_thread_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.test_supervise.io.StringIO", SlowConsole)
    before = set(lifetime.others())  # other tests' leftovers are not this job's
    outcome, out, _, _ = supervise(tmp_path, [FLOOD, "echo done"])
    assert outcome.exit_code == 0
    assert lifetime.join_all(timeout_s=3, existing=before) == []
    # What reached the master is in the rank's file, whatever the console kept up with (an agent
    # still writing 5 s after its rank ended drops the rest on its side: rank/agent.py).
    shown = sum(line.endswith("x" * 200) for line in out.splitlines())
    assert shown <= len((tmp_path / "ranks" / "rank-0.log").read_text().splitlines()) <= LINES
    assert (tmp_path / "ranks" / "rank-1.log").read_text() == "done\n"


def test_the_master_process_exits_0_with_no_thread_left(tmp_path):
    """The whole master in a child interpreter: a local job, its report plotted, then the exit."""
    # A short job root: the job's status socket must fit AF_UNIX's 108 bytes, and pytest-xdist's
    # tmp_path (.../popen-gw0/test_the_master_process_exits_0) is longer than that leaves room for.
    jobs = Path(tempfile.mkdtemp(prefix="gc-jobs-"))
    job = tmp_path / "job.py"
    job.write_text("import sys\nfor i in range(3000):\n    print('line', i)\nsys.exit(0)\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "app"),
        "GAUDI_CLUSTER_JOB_ROOT": str(jobs),
        "GAUDI_CLUSTER_OUTPUT_DIR": str(tmp_path / "out"),
        "GAUDI_CLUSTER_SKIP_DOCTOR": "1",
        "MPLCONFIGDIR": str(tmp_path / "mpl"),  # a fresh font cache: the slow first import
    }
    with held_port() as control, held_port() as master:
        env["GAUDI_CLUSTER_CONTROL_PORT"] = str(control)
        env["GAUDI_CLUSTER_MASTER_PORT"] = str(master)
        done = subprocess.run(
            [sys.executable, "-m", "gaudi_cluster", "master", "--slots", "2", "--", sys.executable, str(job)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )
    shutil.rmtree(jobs)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert lifetime.LEFT_AT_EXIT not in done.stderr, done.stderr[-2000:]
    assert "succeeded: 2 ranks on 1 nodes" in done.stdout
    assert "generated new fontManager" not in done.stdout + done.stderr
    assert done.stdout.count("] line 2999") == 1  # rank 0's line; rank 1's is in its file
