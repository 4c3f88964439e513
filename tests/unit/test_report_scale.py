"""The report of a big job: per-node lines and the slowest ranks by name, not a line per rank."""

from __future__ import annotations

import json
import random
from pathlib import Path

from gaudi_cluster.view import report, report_plot
from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.wire.workload_events import WorkloadEvent


def job(ranks: int, per_node: int, slow: dict[int, float], steps: int = 3000) -> dict[int, WorkHistory]:
    rng = random.Random(ranks)
    histories = {}
    for rank in range(ranks):
        base = slow.get(rank, 0.4)
        histories[rank] = WorkHistory((s, base * rng.uniform(0.95, 1.05)) for s in range(1, steps + 1))
    return histories


def test_nodes_get_the_median_and_the_max_of_their_ranks_step_by_step():
    histories = job(64, 8, {37: 0.9})
    hosts = {rank: f"node-{rank // 8:02d}" for rank in histories}
    series = {s.host: s for s in report_plot.node_series(histories, hosts)}
    assert sorted(series) == [f"node-{i:02d}" for i in range(8)]
    slow_node, calm_node = series["node-04"], series["node-00"]
    assert len(slow_node.steps) == len(histories[37]) and slow_node.steps == tuple(s for s, _ in histories[0])
    assert all(0.85 < m < 0.95 for m in slow_node.max_s[1:]) and all(
        0.37 < m < 0.43 for m in slow_node.median_s
    )
    assert all(m < 0.43 for m in calm_node.max_s)


def test_the_slowest_ranks_are_named_slowest_first():
    histories = job(64, 8, {37: 0.9, 5: 0.7, 60: 0.6})
    hosts = {rank: f"node-{rank // 8:02d}" for rank in histories}
    named = report.slowest_ranks(histories, hosts, count=3)
    assert [(r["rank"], r["host"]) for r in named] == [(37, "node-04"), (5, "node-00"), (60, "node-07")]
    assert 0.85 < named[0]["median_work_s"] < 0.95


def test_a_big_job_is_written_with_per_node_lines_and_named_ranks(tmp_path: Path):
    histories = job(200, 8, {123: 1.0}, steps=500)
    built = {"job": "j", "ranks": [{"rank": r, "hostname": f"node-{r // 8:02d}"} for r in histories]}
    written = report.write(built, histories, {123}, tmp_path)
    assert written == [tmp_path / report.JSON_NAME, tmp_path / report.PNG_NAME]
    assert (tmp_path / report.PNG_NAME).read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / report.JSON_NAME).read_text())
    assert saved["slowest_ranks"][0] == {
        "rank": 123,
        "host": "node-15",
        "median_work_s": saved["slowest_ranks"][0]["median_work_s"],
    }
    assert len(saved["slowest_ranks"]) == report.SLOWEST_NAMED


def test_a_small_job_keeps_one_line_per_rank(tmp_path: Path, monkeypatch):
    drawn = []

    def drawing(name: str):
        return lambda ax, *_: (drawn.append(name), ax.plot([0], [0], label=name))

    monkeypatch.setattr(report_plot, "_plot_nodes", drawing("nodes"))
    monkeypatch.setattr(report_plot, "_plot_ranks", drawing("ranks"))
    small = {0: [(1, 0.4), (2, 0.41)], 1: [(1, 0.9), (2, 0.95)]}
    assert report_plot.plot(small, {1}, tmp_path / "a.png", {0: "m", 1: "w"})
    assert report_plot.plot(job(17, 8, {}, steps=10), set(), tmp_path / "b.png", {r: "h" for r in range(17)})
    assert drawn == ["ranks", "nodes"]


def test_the_startup_points_are_each_events_first_time_and_the_events_are_written_as_their_names():
    lines = [
        json.dumps({"event": WorkloadEvent.START, "t": 1.0}),
        json.dumps({"event": WorkloadEvent.FIRST_STEP, "t": 5.0}),
        json.dumps({"event": WorkloadEvent.FIRST_STEP, "t": 9.0}),  # a later attempt's
    ]
    assert lines[1] == '{"event": "first_step", "t": 5.0}'  # what train/ writes, as the master reads it
    points = report.startup_points([json.loads(line) for line in lines])
    assert points == {"start": 1.0, "imports_done": None, "model_ready": None, "first_step": 5.0}
    assert report.phase_timings({**points, "launch": 0.5}) == {"launch": 0.5}
