"""Supervision end to end on one host: real rank agents, a real control channel, real processes.

The "launcher" is bash starting two rank agents, which is what pdsh + deepspeed's launch.py amount
to on a node. No Docker needed; each test finishes in a few seconds.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from gaudi_cluster.launch.plan import LaunchPlan
from gaudi_cluster.rank import jobdir
from gaudi_cluster.supervise.console import RankLogs, RankOutput
from gaudi_cluster.supervise.control import ControlServer, EventKind
from gaudi_cluster.supervise.outcome import FailureCause, JobState
from gaudi_cluster.supervise.supervisor import Supervisor, SupervisorPhase, SupervisorSettings
from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.private_payload import PrivatePayload

from tests.support.ports import held_port

HOST = socket.gethostname()


def launcher_for(
    job_id: str, port: int, programs: list[str], job_root: Path, hands_over: bool = False
) -> LaunchPlan:
    """bash that starts one rank agent per program with RANK set, like launch.py does; handing over
    (the direct launcher over ssh), the agents send their lines through the node relay and bash ends
    once they are seated, as a node process does."""
    agents = []
    relay = "--output-relay " if hands_over else ""
    for rank, program in enumerate(programs):
        agents.append(
            f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE={len(programs)} "
            f"{sys.executable} -u -m gaudi_cluster.rank.agent --job-id {job_id} --job-root {job_root} "
            f"--heartbeat-timeout 5 --control 127.0.0.1:{port} {relay}-- bash -c {program!r} &"
        )
    end = f"sleep 2; ls {job_root}/{job_id}/control.sock >/dev/null" if hands_over else "wait"
    return LaunchPlan(argv=("bash", "-c", " ".join(agents) + f" {end}"), hands_over=hands_over)


def control_server(
    job_root: Path, job_id: str, port: int, ranks: int, heartbeat: float = 5.0
) -> ControlServer:
    """A master's control server for `ranks` agents on this host, its secret staged for them."""
    token = protocol.new_token()
    jobdir.stage(job_root, job_id, PrivatePayload(node=HOST, token=protocol.node_key(token, HOST)))
    return ControlServer("127.0.0.1", port, job_id, heartbeat, token, dict.fromkeys(range(ranks), HOST))


def supervise(
    tmp_path: Path,
    programs: list[str],
    tee: bool = False,
    hands_over: bool = False,
    plan_says: bool = True,
    **settings: float,
):
    job_id = "job-" + str(time.monotonic_ns())
    server = control_server(tmp_path / "jobs", job_id, 0, len(programs), settings.pop("heartbeat", 5.0))
    port = server.port
    server.start()
    out = io.StringIO()
    supervisor = Supervisor(
        job_id,
        dataclasses.replace(
            launcher_for(job_id, port, programs, tmp_path / "jobs", hands_over),
            hands_over=hands_over and plan_says,
        ),
        server,
        {HOST: len(programs)},
        SupervisorSettings(
            start_timeout_s=20, stuck_timeout_s=settings.pop("stuck", 60), stop_grace_s=3, tee=tee
        ),
        out=out,
        rank_logs=RankLogs(tmp_path / "ranks"),
    )
    started = time.monotonic()
    try:
        outcome = supervisor.run()
    finally:
        server.close()
    return outcome, out.getvalue(), time.monotonic() - started, job_id


def leftover(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_rank_0_on_the_console_every_rank_in_its_file_and_every_rank_with_tee(tmp_path):
    programs = ["echo hello-from-0; echo; echo 'saving: 50%|#  | 1/2 [00:01<00:01]'", "echo hello-from-1"]
    outcome, out, _, _ = supervise(tmp_path / "plain", programs)
    assert outcome.exit_code == 0, out
    assert outcome.failure is None
    assert sorted(outcome.ranks_seen) == [0, 1]
    # One line per event: rank 1 says the same as rank 0; the blank line and the bar stay off it.
    assert [line for line in out.splitlines() if "rank" in line] == [f"[{HOST} rank 0] hello-from-0"]
    logs = tmp_path / "plain" / "ranks"
    assert (logs / "rank-0.log").read_text().splitlines() == [
        "hello-from-0",
        "",
        "saving: 50%|#  | 1/2 [00:01<00:01]",
    ]
    assert (logs / "rank-1.log").read_text() == "hello-from-1\n"
    _, teed, _, _ = supervise(tmp_path / "tee", programs, tee=True)
    assert f"[{HOST} rank 0] hello-from-0" in teed and f"[{HOST} rank 1] hello-from-1" in teed


def test_ranks_handed_over_to_their_relay_run_on_after_the_launcher_ends_and_their_lines_arrive(tmp_path):
    """The direct launcher over ssh: the node process (here bash) ends once its ranks are seated; the
    ranks' lines then come through the relay, to the console and the rank files as before."""
    programs = ["echo early-0; sleep 5; echo late-0", "sleep 5; echo late-1; seq 1 3000"]
    outcome, out, _, _ = supervise(tmp_path / "over", programs, hands_over=True)
    assert outcome.exit_code == 0 and outcome.failure is None, out
    assert [line for line in out.splitlines() if "rank" in line] == [
        f"[{HOST} rank 0] early-0",
        f"[{HOST} rank 0] late-0",
    ]
    logs = tmp_path / "over" / "ranks"
    assert (logs / "rank-0.log").read_text().splitlines() == ["early-0", "late-0"]
    assert (logs / "rank-1.log").read_text().splitlines() == ["late-1", *map(str, range(1, 3001))]
    # The same launcher under a plan that does not say it hands over: its early end is a failure.
    programs = ["sleep 6", "sleep 6"]
    failed, _, _, _ = supervise(tmp_path / "not", programs, hands_over=True, plan_says=False)
    assert failed.failure is not None and failed.failure.cause is FailureCause.LAUNCHER, failed


def test_a_relayed_last_line_still_being_routed_reaches_the_console(tmp_path, monkeypatch):
    """A busy core: the batch is off the queue but not yet on the console when the ranks have exited.
    The end of the attempt waits for it to be routed, not merely taken (a rank's only line was lost)."""
    route = RankOutput.route_rank

    def slow_route(console: RankOutput, host: str, rank: int, lines) -> None:
        time.sleep(0.5)
        route(console, host, rank, lines)

    monkeypatch.setattr(RankOutput, "route_rank", slow_route)
    outcome, out, _, _ = supervise(
        tmp_path, ["sleep 2; echo bye-0", "sleep 2; echo bye-1"], tee=True, hands_over=True
    )
    assert outcome.exit_code == 0, out
    assert f"[{HOST} rank 0] bye-0" in out and f"[{HOST} rank 1] bye-1" in out, out


def test_first_failure_stops_the_other_ranks_and_is_named(tmp_path):
    marker = f"sleep-marker-{time.monotonic_ns()}"
    outcome, out, elapsed, _ = supervise(
        tmp_path, [f"exec -a {marker} sleep 60", "echo about to fail; sleep 0.5; exit 3"]
    )
    assert outcome.exit_code == 3
    assert outcome.failure is not None
    assert (outcome.failure.host, outcome.failure.rank) == (HOST, 1)
    assert outcome.failure.cause is FailureCause.EXITED and outcome.lost_host is None
    summary = [line for line in out.splitlines() if line.startswith("gaudi-cluster: job")]
    assert len(summary) == 1 and "rank 1 exited with code 3" in summary[0] and "about to fail" in summary[0]
    assert elapsed < 15
    assert leftover(marker) == []


def test_signal_death_is_never_exit_zero(tmp_path):
    outcome, _, _, _ = supervise(tmp_path, ["sleep 30", "kill -9 $$"])
    assert outcome.failure is not None and "SIGKILL" in outcome.failure.what
    assert (outcome.failure.cause, outcome.failure.signum) == (FailureCause.SIGNALLED, signal.SIGKILL)
    assert outcome.exit_code == 137


def test_stuck_rank_is_reported(tmp_path):
    outcome, _, elapsed, _ = supervise(tmp_path, ["echo start; sleep 60", "echo start; sleep 60"], stuck=2)
    assert outcome.failure is not None and "stuck" in outcome.failure.what
    assert outcome.failure.cause is FailureCause.STUCK
    assert elapsed < 15


def test_a_vanished_agent_is_a_lost_contact_with_its_host(tmp_path):
    # The rank kills its own agent: the connection closes with no exit report, as when a node dies.
    outcome, out, elapsed, _ = supervise(tmp_path, ["sleep 30", "kill -9 $PPID; sleep 1"])
    assert outcome.failure is not None and outcome.failure.cause is FailureCause.LOST_CONTACT
    assert (outcome.failure.rank, outcome.lost_host) == (1, HOST)
    assert f"host {HOST} rank 1 lost contact: connection closed" in out
    assert elapsed < 15


def test_the_supervisor_phase_is_what_status_shows():
    server = ControlServer("127.0.0.1", 0, "j", 5, protocol.new_token(), {})
    try:
        supervisor = Supervisor(
            "j", LaunchPlan(argv=("true",)), server, {}, SupervisorSettings(), io.StringIO()
        )
        assert supervisor.state is SupervisorPhase.STARTING
        assert supervisor.snapshot()["state"] == "starting"
    finally:
        server.close()
    # An attempt's last phase is named as its outcome; a failure is "aborting" while ranks are killed.
    assert [SupervisorPhase.ended(state).value for state in JobState] == [state.value for state in JobState]


def test_sigterm_to_master_stops_job_with_143(tmp_path):
    marker = f"term-marker-{time.monotonic_ns()}"
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        job_id = "term-job"
        server = control_server(tmp_path / "jobs", job_id, 0, 2)
        port = server.port
        server.start()
        supervisor = Supervisor(
            job_id,
            launcher_for(
                job_id, port, [f"exec -a {marker} sleep 60", f"exec -a {marker} sleep 60"], tmp_path / "jobs"
            ),
            server,
            {HOST: 2},
            SupervisorSettings(start_timeout_s=20, stop_grace_s=3),
            out=io.StringIO(),
        )
        supervisor.install_signal_handlers()
        timer.start()
        outcome = supervisor.run()
        server.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert outcome.exit_code == 143
    assert leftover(marker) == []


def test_rank_dies_with_its_master(tmp_path):
    """The master vanishing (connection closed) ends the rank within seconds."""
    server = control_server(tmp_path, "orphan-job", 0, 1)
    port = server.port
    server.start()
    marker = f"orphan-marker-{time.monotonic_ns()}"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gaudi_cluster.rank.agent",
            "--job-id",
            "orphan-job",
            "--heartbeat-timeout",
            "5",
            "--control",
            f"127.0.0.1:{port}",
            "--job-root",
            str(tmp_path),
            "--",
            "bash",
            "-c",
            f"exec -a {marker} sleep 60",
        ],
        stdout=subprocess.DEVNULL,
    )
    event = server.events.get(timeout=10)
    assert event.kind is EventKind.HELLO
    closed_at = time.monotonic()
    server.close()
    assert agent.wait(timeout=10) != 0
    assert time.monotonic() - closed_at < 8
    assert leftover(marker) == []


def test_agent_refuses_to_run_unsupervised(tmp_path):
    with held_port() as port:  # held, never listening: a connection is refused
        jobdir.stage(tmp_path, "x", PrivatePayload(node="x-node", token=protocol.new_token()))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gaudi_cluster.rank.agent",
                "--job-id",
                "x",
                "--heartbeat-timeout",
                "5",
                "--control",
                f"127.0.0.1:{port}",
                "--job-root",
                str(tmp_path),
                "--connect-timeout",
                "2",
                "--",
                "touch",
                str(tmp_path / "ran"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            check=False,
        )
    assert done.returncode == 1
    assert "cannot reach the master's control channel" in done.stdout
    assert not (tmp_path / "ran").exists()


def test_control_port_is_free_again_right_after_close():
    """--max-restarts relaunches on the same control port at once."""
    first = ControlServer("127.0.0.1", 0, "a", 5, protocol.new_token(), {})
    port = first.port
    first.start()
    time.sleep(0.2)  # the accept thread is now blocked in accept()
    first.close()
    second = ControlServer("127.0.0.1", port, "b", 5, protocol.new_token(), {})
    second.close()
