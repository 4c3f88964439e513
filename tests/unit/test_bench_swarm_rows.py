"""The swarm bench's rows: the straggler scenario has a row of its own, and a partial rerun never
rewrites a row from fewer parts (the RSS row needs the fan-out's ssh clients and the scenarios)."""

from __future__ import annotations

import json

import pytest

from bench import ssh_rss
from bench.common import Row, stat
from bench.swarm_plot import keep_earlier
from bench.swarm_rows import build


def results(with_stragglers: bool = True) -> dict:
    healthy = {"checkin_s": 1.0, "master_cpu_pct": 8.0, "master_threads": 3.0, "master_fds": 1009.0,
               "master_rss_mb": 52.0, "reset_named_s": 0.01, "stop_all_s": 0.3}  # fmt: skip
    found = {("ours", 1000, "reset"): dict(healthy), ("ours", 1000, "silence"): {"silence_named_s": 10.5}}
    if with_stragglers:
        found[("ours", 1000, "reset, stragglers")] = {
            **healthy,
            "master_cpu_pct": 12.0,
            "swarm_cpu_pct": 30.0,
        }
    return found


def by_key(rows: list[Row]) -> dict[str, Row]:
    return {row.key: row for row in rows}


def test_the_straggler_scenario_is_its_own_row_and_the_healthy_one_the_main_row():
    rows = by_key(build(results(), [1000], 8, 10.0, 90.0, {1000: 1.0}))
    assert rows["swarm.master_cpu_pct"].ours.values == [8.0]
    assert rows["swarm.master_cpu_pct_stragglers"].ours.values == [12.0]
    assert rows["swarm.master_cpu_pct_stragglers"].target.value == 15.0
    assert rows["swarm.master_own_rss_mb"].ours.values == [52.0]
    assert "swarm.master_cpu_pct_stragglers" not in by_key(build(results(False), [1000], 8, 10.0, 90.0))


def test_a_rerun_without_the_fanout_keeps_the_earlier_rss_row(tmp_path):
    earlier = Row("swarm.master_rss_mb", "Master RSS with its children", "MB", stat([3667.0]), note="full")
    (tmp_path / "latest.json").write_text(json.dumps({"rows": [earlier.as_dict()]}))
    rows = by_key(build(results(), [1000], 8, 10.0, 90.0, held_per_node={}, parts={"scenarios"}))
    assert rows["swarm.master_rss_mb"].ours.values == []  # never the process alone
    assert "fan-out" in rows["swarm.master_rss_mb"].note
    kept = by_key(keep_earlier(list(rows.values()), tmp_path))
    assert kept["swarm.master_rss_mb"].ours.values == [3667.0]
    assert "kept from an earlier run" in kept["swarm.master_rss_mb"].note
    assert kept["swarm.master_own_rss_mb"].ours.values == [52.0]  # what this run did measure
    assert kept["swarm.master_cpu_pct"].ours.values == [8.0]
    assert rows["swarm.checkin_s"].ours.values == []  # the check-in-only runs' row, not the scenarios'
    assert "check-in-only" in rows["swarm.checkin_s"].note


def test_the_master_keeps_no_ssh_client_after_the_launch_and_the_launch_peak_counts_them_all():
    """Issue 33: control masters are stopped once the ranks are in (the fan-out's `held` is 0 then), so the
    job's RSS row is the process alone; the launch peak counts a master per node and the sessions the
    fan-out held at once (48 of 1,000 here: its waves)."""
    client = ssh_rss.load()
    rows = by_key(build(results(), [1000], 8, 10.0, 90.0, {1000: 0.0}, at_launch_per_node={1000: 1.0},
                        sessions_per_node={1000: 0.048}))  # fmt: skip
    assert rows["swarm.master_rss_mb"].ours.values == [52.0]
    peak = 52.0 + 1000 * client["control_master"]["rss_mb"] + 48 * client["session"]["rss_mb"]
    assert rows["swarm.launch_peak_rss_mb"].ours.values == [pytest.approx(peak)]
    assert rows["swarm.launch_peak_rss_mb"].target.value == 4096.0


def test_no_launch_peak_without_the_sessions_the_fan_out_held():
    """An older fan-out result (no sessions_peak) writes no launch peak: never a row from fewer parts."""
    rows = by_key(build(results(), [1000], 8, 10.0, 90.0, {1000: 0.0}, at_launch_per_node={1000: 1.0}))
    assert rows["swarm.launch_peak_rss_mb"].ours.values == []
