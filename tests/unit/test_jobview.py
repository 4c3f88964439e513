"""What the operator sees: the live line, stragglers, `gaudi-cluster status`, the final report."""

from __future__ import annotations

import io
import json
import socket

import pytest
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.rank import agent_beat
from gaudi_cluster.view import report, status
from gaudi_cluster.view.jobview import (
    AgentState,
    RateMeter,
    StragglerWatch,
    live_line,
    render_table,
    status_rows,
)
from gaudi_cluster.view.liveview import LiveView
from gaudi_cluster.wire import messages
from gaudi_cluster.wire.work_window import WINDOW

from tests.support.reports import as_reports


def agent_state(host: str, rank: int, local_rank: int = 0, step: int | None = None, **fields) -> AgentState:
    """The control server's record of one rank, in a job of 100 steps of 12 samples."""
    fields = {"max_steps": 100, "samples_per_step": 12, **fields}
    return AgentState(host, rank, pid=1000 + rank, last_seen=0.0, local_rank=local_rank, step=step, **fields)


def agents(
    slow_rank: int | None, steps: int = 10, slow: float = 0.8, warmup: float = 0.4
) -> list[AgentState]:
    """Four ranks on two hosts at `steps` steps; steps 1-3 (warm-up) take `warmup` seconds."""
    out = []
    for rank in range(4):
        seconds = slow if rank == slow_rank else 0.4 + 0.01 * rank
        work = tuple((s, warmup if s <= 3 else seconds) for s in range(1, steps + 1))
        out.append(agent_state(f"w{rank // 2}", rank, rank % 2, steps, recent_work=work))
    return out


def test_the_slow_rank_is_named_once_after_it_stayed_slow_over_new_steps():
    watch = StragglerWatch()
    flagged = [watch.check(agents(slow_rank=3, steps=step)) for step in range(6, 12)]
    assert [len(new) for new in flagged] == [0, 0, 0, 0, 1, 0]
    (straggler,) = flagged[4]
    assert (straggler.host, straggler.rank, straggler.local_rank) == ("w1", 3, 1)
    assert straggler.line().startswith("straggler: host w1 rank 3 (device 1) takes 2.0x")


def test_a_summary_carrying_several_new_steps_counts_each_of_them():
    """A node's summary every 2 s brings a rank's steps two or three at a time: the rank is named after
    SUSTAIN slow steps (its first judgment counts one), not after SUSTAIN summaries."""
    watch = StragglerWatch()
    flagged = [watch.check(agents(slow_rank=3, steps=step)) for step in (6, 9, 12)]
    assert [len(new) for new in flagged] == [0, 0, 1]
    assert watch.streak[3] == 1 + 3 + 3
    watch = StragglerWatch()
    watch.check(agents(slow_rank=3, steps=6))
    assert watch.check(agents(slow_rank=3, steps=6 + 100)) != []  # a jump counts WINDOW steps at most
    assert watch.streak[3] == 1 + WINDOW


def test_checks_that_see_no_new_step_do_not_count():
    watch = StragglerWatch()
    for _ in range(20):  # a long step: the master checks every second, the rank is still on step 8
        assert watch.check(agents(slow_rank=3, steps=8)) == []
    assert watch.streak[3] == 1


def test_no_rank_is_named_when_none_is_slow_or_slowness_does_not_last_or_is_warm_up():
    watch = StragglerWatch()
    for step in range(6, 16):
        assert watch.check(agents(slow_rank=None, steps=step)) == []
    for step in range(16, 26):  # slow every other step: never SUSTAIN in a row
        assert watch.check(agents(slow_rank=2 if step % 2 else None, steps=step)) == []
    watch = StragglerWatch()
    for step in range(4, 12):  # rank 1's warm-up steps took 10x: not a straggler
        slow_start = agents(slow_rank=None, steps=step)
        slow_start[1].recent_work = tuple((s, 4.0 if s <= 3 else w) for s, w in slow_start[1].recent_work)
        assert watch.check(slow_start) == []


def test_the_live_line_has_progress_rate_eta_and_the_slowest_rank():
    rate = RateMeter()
    rate.add(0.0, 10)
    rate.add(10.0, 30)  # 2 steps/s
    line = live_line(agents(slow_rank=2, steps=30), 75.0, rate)
    assert (
        line == "step 30/100 (30%) · 24.0 samples/s · elapsed 1:15 · ETA 0:35 · slowest: rank 2 on w1 0.80s"
    )
    assert live_line([], 3.0, RateMeter()).startswith("waiting for the first step")


def test_on_a_terminal_the_line_is_redrawn_in_place_and_rank_lines_stay_above_it():
    out, now = io.StringIO(), [0.0]
    view = LiveView(out, 30.0, lambda: now[0], tty=True)
    now[0] = 2.0
    view.tick(agents(slow_rank=None))
    view.write("[w0 rank 0] loss 3.2")
    text = out.getvalue()
    assert text.startswith("\r\x1b[Kgaudi-cluster: step 10/100")
    assert "\r\x1b[K[w0 rank 0] loss 3.2\ngaudi-cluster: step 10/100" in text


def test_off_a_terminal_the_line_is_printed_at_the_first_step_then_every_interval():
    out, now = io.StringIO(), [0.0]
    view = LiveView(out, 30.0, lambda: now[0], tty=False)
    waiting = [agent_state(f"w{rank // 2}", rank, rank % 2) for rank in range(4)]
    for second in range(1, 5):  # ranks checked in, no step yet: quiet until the interval
        now[0] = float(second)
        view.tick(waiting)
    assert out.getvalue() == ""
    for second in range(5, 66):
        now[0] = float(second)
        view.tick(agents(slow_rank=None))
    lines = out.getvalue().splitlines()
    # At second 5 (first step), then 30 s after it (35) and again (65): a short job still shows one.
    assert [line.split(" · elapsed ")[1].split(" ")[0] for line in lines] == ["0:05", "0:35", "1:05"], lines
    assert all(line.startswith("gaudi-cluster: step 10/100") for line in lines)
    assert "\r" not in out.getvalue()


def test_status_rows_and_table():
    rows = status_rows(agents(slow_rank=1), now=3.0)
    assert rows[1]["step_time_s"] == 0.8 and rows[1]["heartbeat_age_s"] == 3.0
    table = render_table(rows).splitlines()
    assert table[0].split()[:4] == ["HOST", "RANK", "DEVICE", "STATE"] and len(table) == 5


def test_status_command_reads_the_running_masters_socket(short_tmp):
    job_dir = short_tmp / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    server = status.StatusServer(
        job_dir, lambda: {"job": "j1", "state": "running", "line": "step 3", "ranks": []}
    )
    server.start()
    try:
        assert (job_dir / "status.sock").stat().st_mode & 0o077 == 0
        out = io.StringIO()
        assert status.main(short_tmp / "jobs", None, as_json=True, out=out) == 0
        assert json.loads(out.getvalue())["line"] == "step 3"
    finally:
        server.close()


def test_status_errors_are_one_line(short_tmp):
    (short_tmp / "jobs" / "old").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no job 'nope' under .*; fix: --job-id old \(the newest here"):
        status.find_socket(short_tmp / "jobs", "nope")
    with pytest.raises(ClusterNotReady, match="no running job under"):
        status.find_socket(short_tmp / "jobs", None)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_tmp / "jobs" / "old" / "status.sock"))
    stale.close()  # the socket file stays, nobody listens
    with pytest.raises(ClusterNotReady, match="left from a master that is gone"):
        status.main(short_tmp / "jobs", "old", as_json=False)


def test_the_report_holds_phases_names_and_stragglers(tmp_path):
    built = report.build(
        job_id="j1",
        state="succeeded",
        exit_code=0,
        reports=as_reports({"10.0.0.1": {"hostname": "m", "versions": {"torch": "2"}, "build_id": "b"}}),
        ranks_by_host={"10.0.0.1": 2},
        rank_hosts={0: "m", 1: "m"},
        preset_names=["DS_ACCELERATOR"],
        private_names=["HF_TOKEN"],
        points={"container_start": 100.0, "master_start": 101.5, "launch": 102.0, "start": 102.5,
                "imports_done": 110.0, "model_ready": 111.0, "first_step": 113.0},
        events=[{"event": "train_done", "train_samples_per_second": 42.0, "step": 40}],
        stragglers=["straggler: host m rank 1"],
        failure=None,
    )  # fmt: skip
    assert built["phases_s"]["container_start_to_first_step"] == 13.0
    assert built["phases_s"]["imports"] == 7.5
    assert built["private_env_names"] == ["HF_TOKEN"] and "hf_" not in json.dumps(built)
    assert built["throughput"]["train_samples_per_second"] == 42.0
    written = report.write(built, {0: [(1, 0.4), (2, 0.41)], 1: [(1, 0.9), (2, 0.95)]}, {1}, tmp_path)
    assert [p.name for p in written] == ["job_report.json", "job_report.png"]
    assert (tmp_path / "job_report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_beat_carries_each_step_once_and_stays_under_1_kb():
    progress = {"step": 20, "t": 99.5, "max_steps": 40, "samples_per_step": 12,
                "work": [[s, 0.123456] for s in range(13, 21)]}  # fmt: skip
    first, sent = agent_beat.beat(progress, 15, 0.0, 100.0, "x" * 500)
    assert [s for s, _ in first.work] == [16, 17, 18, 19, 20] and sent == 20
    again, _ = agent_beat.beat(progress, sent, 0.0, 101.0, None)
    assert again.work == () and again.progress_age == 1.5
    assert messages.parse(json.loads(json.dumps(messages.render(first)))) == first
    worst, _ = agent_beat.beat(
        {**progress, "work": [[10**6 + s, 12345.678] for s in range(16)]}, -1, 0, 0, "y" * 200
    )
    assert len(json.dumps(messages.render(worst))) < 1024


def test_verbose_logging_adds_our_debug_lines_only_and_libraries_say_only_warnings(monkeypatch):
    import logging

    from gaudi_cluster.view.logs import configure_logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    ours = logging.getLogger("gaudi_cluster")
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    configure_logging(verbose=True)
    assert logging.getLogger("gaudi_cluster.supervise.supervisor").isEnabledFor(logging.DEBUG)
    # "generated new fontManager" (INFO) is noise on a job's console; a library's warning is not.
    assert not logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.INFO)
    assert logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.WARNING)
    configure_logging(verbose=False)
    assert logging.getLogger("gaudi_cluster.master").isEnabledFor(logging.INFO)
    assert not logging.getLogger("gaudi_cluster.master").isEnabledFor(logging.DEBUG)
