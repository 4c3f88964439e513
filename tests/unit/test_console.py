"""The master's console: one line per event, every rank's lines in its file, bars in the live line."""

from __future__ import annotations

import io

from gaudi_cluster.supervise.console import RankLogs, RankOutput, progress_text, rank_line
from gaudi_cluster.view.jobview import AgentState
from gaudi_cluster.view.liveview import LiveView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def routed(tmp_path, lines, tee=False):
    shown: list[str] = []
    bars: list[str] = []
    logs = RankLogs(tmp_path / "ranks", max_open=2)
    output = RankOutput(shown.append, bars.append, logs, tee=tee)
    for line in lines:
        output.route(line)
    logs.close()
    return shown, bars, logs


TRAINING = [
    "[master rank 0] {'loss': '8.067', 'epoch': '0.1429'}",
    "[worker-1 rank 1] {'loss': '8.067', 'epoch': '0.1429'}",
    "worker-2: [worker-2 rank 2] {'loss': '8.067', 'epoch': '0.1429'}",  # through pdsh
    "[master rank 0] ",
    "[master rank 0] Writing model shards:   0%|          | 0/1 [00:00<?, ?it/s]",
    "[master rank 0] Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 109.63it/s]",
    "[2026-12-01 10:00:00,000] [INFO] [runner.py:1] cmd = pdsh -S -w a,b export A=1",
    "worker-1: ssh: connect to host worker-1 port 3022: Connection refused",
]


def test_rank_0_and_the_launcher_on_the_console_every_rank_in_its_file(tmp_path):
    shown, bars, logs = routed(tmp_path, TRAINING)
    assert shown == [
        "[master rank 0] {'loss': '8.067', 'epoch': '0.1429'}",
        "[launcher] [2026-12-01 10:00:00,000] [INFO] [runner.py:1] cmd = pdsh -S -w a,b export A=***",
        "[worker-1] ssh: connect to host worker-1 port 3022: Connection refused",
    ]
    assert bars == ["rank 0: Writing model shards 0% 0/1", "rank 0: Writing model shards 100% 1/1"]
    # Every line of every rank, bars and blank lines included, the prefix left out (the file names it).
    assert logs.path(0).read_text().splitlines()[0] == "{'loss': '8.067', 'epoch': '0.1429'}"
    assert len(logs.path(0).read_text().splitlines()) == 4
    assert logs.path(1).read_text() == "{'loss': '8.067', 'epoch': '0.1429'}\n"
    assert logs.path(2).read_text() == "{'loss': '8.067', 'epoch': '0.1429'}\n"


def test_tee_shows_every_rank_but_still_folds_the_bars(tmp_path):
    shown, bars, _ = routed(tmp_path, TRAINING, tee=True)
    assert [line for line in shown if "loss" in line] == [
        "[master rank 0] {'loss': '8.067', 'epoch': '0.1429'}",
        "[worker-1 rank 1] {'loss': '8.067', 'epoch': '0.1429'}",
        "[worker-2 rank 2] {'loss': '8.067', 'epoch': '0.1429'}",
    ]
    assert len(bars) == 2 and not any("%|" in line for line in shown)


def test_thousands_of_ranks_keep_a_bounded_number_of_files_open(tmp_path):
    logs = RankLogs(tmp_path / "ranks", max_open=8)
    for round_ in range(3):
        for rank in range(500):
            logs.write(rank, f"line {round_}")
        assert len(logs._open) <= 8
    logs.close()
    assert logs.path(499).read_text() == "line 0\nline 1\nline 2\n"
    assert len(list((tmp_path / "ranks").iterdir())) == 500


def test_parsing_rank_lines_and_bars():
    assert rank_line("[n-1.x rank 12] a [b] c") is not None
    assert rank_line("[n-1.x rank 12] a [b] c").rank == 12  # type: ignore[union-attr]
    assert rank_line("host: [n1 rank 3] hi").host == "n1"  # type: ignore[union-attr]
    assert rank_line("plain launcher text") is None
    assert progress_text(" 45%|████▌     | 18/40 [00:10<00:12,  1.8it/s]") == "45% 18/40"
    assert progress_text("loss 3.2 (45% done)") is None


def test_a_bar_shows_in_the_live_line_while_it_runs_and_drops_when_done():
    clock = Clock()
    out = io.StringIO()
    view = LiveView(out, interval_s=1.0, clock=clock, tty=False)
    agent = AgentState(host="m", rank=0, pid=1, last_seen=clock.now, step=3, max_steps=40)
    view.progress("rank 0: Writing model shards 0% 0/1")
    view.tick([agent])
    assert view.line.endswith("· rank 0: Writing model shards 0% 0/1"), view.line
    clock.now += 1.5
    view.progress("rank 0: Writing model shards 100% 1/1")
    view.tick([agent])
    assert "Writing" not in view.line
    view.progress("rank 0: Writing model shards 0% 0/1")
    clock.now += 10  # never redrawn again: ended or stalled, not shown for ever
    view.tick([agent])
    assert "Writing" not in view.line
