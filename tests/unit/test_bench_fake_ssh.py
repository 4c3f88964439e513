"""The swarm bench's fake ssh (bench/fake_ssh/ssh) under the master's real fan-out code: every stub
answers its probe with its own node report, every reap lands, every control master ends; pdsh drives
the same fake. Its figures are bench rows, nothing here is timed."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from bench import swarm_fanout
from bench.swarm_soak import percentile
from tests.support.host_tools import require

FAKE = swarm_fanout.FAKE_SSH / "ssh"


def test_the_master_fan_out_runs_unchanged_over_the_fake_ssh():
    found = swarm_fanout.ours(12)
    assert "error" not in found, found
    assert found["reports"] == 12 and found["unreachable"] == 0  # every stub answered with a valid report
    assert found["held_at_launch"] == 12  # a control master per node while the launch rides them
    assert found["held"] == 0  # none once the ranks are in (Reach.release: ssh -O stop)
    assert found["launch_code"] == 0 and found["launched"] == 12  # the real fan-out reached every node
    assert 1 <= found["sessions_peak"] <= min(12, found["launch_wave"])
    assert found["reaped"] == 12 and found["left"] == 0  # the teardown reached every node, none left
    assert not found["teardown_capped"]


def test_pdsh_drives_the_same_fake_ssh():
    require("pdsh")  # a missing pdsh fails here, naming it (the README's promise: no skips)
    found = swarm_fanout.pdsh(12, 4)
    assert found.get("answered") == 12, found


def test_the_fake_ssh_refuses_a_host_it_cannot_keep_state_for(tmp_path):
    done = subprocess.run([str(FAKE), "-F", "cfg", "--", "../x", "true"], env={"FAKE_SSH_DIR": str(tmp_path)},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 255 and "bad host name" in done.stderr
    done = subprocess.run([str(FAKE), "host", "true"], env={}, capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "FAKE_SSH_DIR" in done.stderr


def test_the_soak_percentile_reads_the_histogram():
    ages = Counter({i: 1 for i in range(100)})  # 0.00 .. 0.99 s, one sample per 10 ms bin
    assert percentile(ages, 0.99) == pytest.approx(0.99)
    assert percentile(ages, 0.5) == pytest.approx(0.50)
    assert percentile(Counter(), 0.99) is None
