"""The node relay, for real: agents of one node share one connection to the master's ControlServer.

Real agent and relay processes on this machine (one node, several ranks) against the real server:
one relay per job and node, one seated connection, every rank's hello, beats and exit through it;
an agent killed, the relay killed, the master gone, a rank the plan did not put there.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from gaudi_cluster.rank import jobdir, relay_host, relay_join
from gaudi_cluster.rank import relay as node_relay
from gaudi_cluster.rank.relay import PID_NAME
from gaudi_cluster.supervise import admission
from gaudi_cluster.supervise.control import ControlServer, EventKind
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel
from gaudi_cluster.wire.node_spec import NodeRelaySpec, NodeSpec
from gaudi_cluster.wire.private_payload import PrivatePayload

from tests.support.waiting import wait_for

JOB = "20261202-000000-relay0"
NODE = "node-a"
APP = Path(__file__).resolve().parents[2] / "app"
HOST = socket.gethostname()


@pytest.fixture
def cluster(tmp_path):
    """A master expecting ranks 0-3 on this host (node-a) and rank 4 elsewhere, the node's key staged."""
    secret = protocol.new_token()
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE, token=protocol.node_key(secret, NODE)))
    expected = {rank: HOST for rank in range(4)} | {4: "elsewhere"}
    nodes = {rank: NODE for rank in range(4)} | {4: "node-b"}
    server = ControlServer("127.0.0.1", 0, JOB, 30.0, secret, expected, nodes=nodes)
    server.start()
    started: list[subprocess.Popen[str]] = []

    def agent(rank: int, program: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "gaudi_cluster.rank.agent", "--job-id", JOB, "--job-root", str(tmp_path),
             "--heartbeat-timeout", "30", "--connect-timeout", "10", "--control", f"127.0.0.1:{server.port}",
             "--", "sh", "-c", program],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
            env={"PYTHONPATH": str(APP), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "4",
                 "PATH": os.environ["PATH"]},
        )  # fmt: skip
        started.append(process)
        return process

    yield server, agent, tmp_path / JOB
    for process in started:
        process.kill()
    server.close()
    relay = relay_process(tmp_path / JOB)
    if relay is not None:
        relay.kill()


def relay_process(job_dir: Path) -> psutil.Process | None:
    try:
        return psutil.Process(int((job_dir / PID_NAME).read_text().split()[1]))
    except (OSError, ValueError, psutil.NoSuchProcess):
        return None


def take(server: ControlServer, count: int, timeout_s: float = 20.0) -> list:
    found, deadline = [], time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            found.append(server.events.get(timeout=0.2))
    return found


def seated_connections(server: ControlServer) -> int:
    return len(server._sessions)


def test_the_ranks_of_a_node_share_one_connection_and_end_through_it(cluster):
    server, agent, job_dir = cluster
    agents = [agent(rank, f"echo up; sleep 2; exit {rank}") for rank in range(4)]
    hellos = take(server, 4)
    assert sorted(e.rank for e in hellos) == [0, 1, 2, 3] and {e.kind for e in hellos} == {EventKind.HELLO}
    assert seated_connections(server) == 1  # not four
    relay = relay_process(job_dir)
    assert relay is not None and relay.is_running()
    exits = take(server, 4)
    assert {e.rank: e.code for e in exits} == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [process.wait(timeout=10) for process in agents] == [0, 1, 2, 3]
    relay.wait(timeout=10)  # the relay ends once its last agent has left
    assert not (job_dir / PID_NAME).exists()


def test_beats_carry_each_ranks_step_and_a_killed_agent_is_lost_alone(cluster):
    server, agent, _ = cluster
    progress = 'echo "{\\"step\\": 7, \\"t\\": $(date +%s)}" > "$GAUDI_CLUSTER_PROGRESS_FILE"; sleep 30'
    agents = [agent(rank, progress) for rank in range(3)]
    assert len(take(server, 3)) == 3
    steps, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline and steps != [7, 7, 7]:
        time.sleep(0.2)
        steps = [a.step for a in sorted(server.agents(), key=lambda a: a.rank)]
    assert steps == [7, 7, 7]
    agents[1].send_signal(signal.SIGKILL)  # the agent dies, its rank's process group lives on for now
    (lost,) = take(server, 1)
    assert (lost.kind, lost.rank) == (EventKind.LOST, 1) and "connection closed" in lost.reason
    assert sorted(server.running()) == [0, 2]


def test_a_killed_relay_loses_every_rank_of_its_node_and_its_agents_stop(cluster):
    server, agent, job_dir = cluster
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    relay = relay_process(job_dir)
    assert relay is not None
    relay.kill()
    lost = take(server, 2)
    assert sorted((e.kind, e.rank) for e in lost) == [(EventKind.LOST, 0), (EventKind.LOST, 1)]
    assert all(process.wait(timeout=10) != 0 for process in agents)  # cut off: the ranks were stopped


def test_the_master_gone_stops_every_rank(cluster):
    server, agent, _ = cluster
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    server.close()
    assert all(process.wait(timeout=10) != 0 for process in agents)
    out = agents[0].stdout.read()
    assert "the master closed the control channel" in out


def test_a_rank_not_planned_on_this_node_is_refused_with_the_reason(cluster):
    _, agent, _ = cluster
    stray = agent(4, "echo should not run")
    assert stray.wait(timeout=20) == 1
    out = stray.stdout.read()
    assert "was not launched on node 'node-a'" in out and "should not run" not in out


def test_a_silent_master_is_lost_by_the_relay_within_the_heartbeat_timeout(tmp_path):
    """A master that seats the rank and then says nothing (a partition, not a close): the relay gives
    up after the heartbeat timeout instead of waiting on TCP, and the rank is stopped."""
    secret = protocol.new_token()
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE, token=protocol.node_key(secret, NODE)))
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[Channel] = []

    def silent_master() -> None:
        sock, _ = listener.accept()
        channel = Channel(sock)
        gate = admission.Gate(JOB, secret, {0: HOST}, {0: NODE}, None)
        channel.session = gate.admit(channel, "127.0.0.1", lambda _seat: False).session
        join = channel.receive(messages.FROM_RELAY_SESSION)
        assert isinstance(join, messages.Join)
        channel.send(messages.Seated(join.rank))
        held.append(channel)  # and never a beat again

    threading.Thread(target=silent_master, daemon=True).start()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gaudi_cluster.rank.agent", "--job-id", JOB, "--job-root", str(tmp_path),
         "--heartbeat-timeout", "2", "--control", f"127.0.0.1:{listener.getsockname()[1]}", "--",
         "sleep", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(APP), "RANK": "0", "WORLD_SIZE": "1", "PATH": os.environ["PATH"]},
    )  # fmt: skip
    try:
        assert agent.wait(timeout=20) != 0
        deadline = time.monotonic() + 10
        while (tmp_path / JOB / PID_NAME).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (tmp_path / JOB / PID_NAME).exists()  # the relay ended too
        assert held, agent.stdout.read()
    finally:
        agent.kill()
        listener.close()


def test_a_stop_signal_to_the_whole_node_still_carries_the_ranks_exits(cluster):
    """scancel or docker stop signals every process of the node, the relay included: the ranks get
    their grace, and their exits still reach the master through the relay."""
    server, agent, job_dir = cluster
    saving = "trap 'echo saved; exit 0' TERM; sleep 60 & wait"
    agents = [agent(rank, saving) for rank in range(2)]
    assert len(take(server, 2)) == 2
    relay = relay_process(job_dir)
    assert relay is not None
    time.sleep(0.5)  # the ranks' traps are set
    relay.send_signal(signal.SIGTERM)
    for process in agents:
        process.send_signal(signal.SIGTERM)
    exits = take(server, 2)
    assert sorted((e.kind, e.rank) for e in exits) == [(EventKind.EXIT, 0), (EventKind.EXIT, 1)], exits
    assert all(e.code == 143 for e in exits)
    assert all(process.wait(timeout=10) == 143 for process in agents)
    assert "saved" in agents[0].stdout.read()


def test_a_relay_still_connecting_ends_with_the_agent_that_started_it(tmp_path):
    """A job that ends before the master admitted this node (another rank failed at once) kills the
    node's agents: their relay, retrying a master that is gone, must not outlive them."""
    secret = protocol.new_token()
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE, token=protocol.node_key(secret, NODE)))
    with socket.socket() as closed:  # a port nothing listens on: the master is gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    agent = subprocess.Popen(
        [sys.executable, "-m", "gaudi_cluster.rank.agent", "--job-id", JOB, "--job-root", str(tmp_path),
         "--heartbeat-timeout", "30", "--connect-timeout", "60", "--control", f"127.0.0.1:{port}", "--",
         "sleep", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env={"PYTHONPATH": str(APP), "RANK": "0", "WORLD_SIZE": "1", "PATH": os.environ["PATH"]},
    )  # fmt: skip
    relays: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 20
        while not relays and time.monotonic() < deadline:
            children = psutil.Process(agent.pid).children()
            relays = [p for p in children if "gaudi_cluster.rank.relay" in p.cmdline()]
            time.sleep(0.05)
        assert relays, "the agent started no relay"
        agent.kill()
        agent.wait()
        _, alive = psutil.wait_procs(relays, timeout=5)
        assert not alive, [p.cmdline() for p in alive]
        assert "left before the master admitted the node" in (tmp_path / JOB / "relay.log").read_text()
    finally:
        agent.kill()
        for process in relays:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def test_an_agent_handing_over_sends_its_lines_through_the_relay_and_says_when_seated(cluster):
    """--output-relay: once seated, the rank's lines go over the relay (in order, a long one cut to fit a
    line of the channel, none on the agent's stdout, which the node process's ssh session carries) and
    the agent writes one byte on --ready-fd; its stdout and stderr then hold no descriptor of ours."""
    server, _, job_dir = cluster
    ours, theirs = os.pipe()
    program = "echo first; python3 -c 'print(\"x\" * 100000)'; seq 1 2000; echo last >&2"
    agent = subprocess.Popen(
        [sys.executable, "-m", "gaudi_cluster.rank.agent", "--job-id", JOB, "--job-root", str(job_dir.parent),
         "--heartbeat-timeout", "30", "--connect-timeout", "10", "--control", f"127.0.0.1:{server.port}",
         "--output-relay", "--ready-fd", str(theirs), "--", "sh", "-c", program],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=job_dir.parent, pass_fds=(theirs,),
        env={"PYTHONPATH": str(APP), "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
             "PATH": os.environ["PATH"]},
    )  # fmt: skip
    os.close(theirs)
    assert os.read(ours, 1) == b"1" and os.read(ours, 1) == b""  # seated, then its end closed
    os.close(ours)
    stdout, _ = agent.communicate(timeout=30)
    assert agent.returncode == 0 and stdout == "", stdout
    assert [e.kind for e in take(server, 2)] == [EventKind.HELLO, EventKind.EXIT]
    lines = []
    while not server.output.empty():
        batch = server.output.get()
        assert (batch.host, batch.rank) == (HOST, 1)
        lines += batch.lines
    assert lines[0] == "first" and lines[2:] == [*map(str, range(1, 2001)), "last"]
    assert set(lines[1]) == {"x"} and 40_000 < len(lines[1]) < 100_000  # cut to fit one line
    # The node keeps the whole line in the agent's own log.
    assert "x" * 100000 in (job_dir / "rank1.log").read_text()


def test_the_relay_sends_its_nodes_summary_at_the_pace_of_the_heartbeat_timeout(cluster):
    """Under a 30 s timeout a relay sums its node up every 2 s (protocol.beat_every), not every second:
    1,000 nodes' summaries each second were most of the master's CPU; its ranks stay heard."""
    server, agent, _ = cluster
    heard: list[float] = []
    apply = server.ranks.heard_summary

    def counted(*args, **kwargs):
        heard.append(time.monotonic())
        apply(*args, **kwargs)

    server.ranks.heard_summary = counted
    agent(0, "sleep 20")
    assert len(take(server, 1)) == 1
    deadline = time.monotonic() + 12
    while len(heard) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    gaps = [later - earlier for earlier, later in itertools.pairwise(heard)]
    assert len(gaps) >= 3 and all(1.6 < gap < 2.6 for gap in gaps), gaps
    assert server.running() == [0]


def test_once_every_rank_is_in_the_relay_removes_its_nodes_private_file_on_the_masters_word(cluster):
    """Issue 33: the relay, not the master's ssh (or srun), removes the node's private file once every
    rank has checked in (each agent read it before its hello); the ranks run on."""
    server, agent, job_dir = cluster
    agents = [agent(rank, "sleep 2; exit 0") for rank in range(4)]
    assert {e.rank for e in take(server, 4)} == {0, 1, 2, 3}
    assert (job_dir / jobdir.PRIVATE_FILE).exists()
    assert server.unstage_on_relays() == {NODE}
    deadline = time.monotonic() + 5
    while (job_dir / jobdir.PRIVATE_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (job_dir / jobdir.PRIVATE_FILE).exists()
    assert [process.wait(timeout=10) for process in agents] == [0, 0, 0, 0]
    assert {e.rank: e.code for e in take(server, 4)} == {0: 0, 1: 0, 2: 0, 3: 0}


def test_no_relay_told_when_none_is_seated(cluster):
    server, _agent, _job_dir = cluster
    assert server.unstage_on_relays() == frozenset()


def gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not gone_or_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone_or_zombie(pid)


def host_relay(server: ControlServer, job_dir: Path) -> relay_host.HostedRelay:
    """This job's relay in this process, as a node process hosts it (the master's own node, srun)."""
    hosted = relay_host.host(JOB, job_dir.parent, f"127.0.0.1:{server.port}", 30.0, 10.0)
    assert hosted is not None
    return hosted


def wait_for_rank(job_dir: Path, rank: int) -> int:
    """The rank's process group, from its pid file (written once the rank started; read once its
    words are there: the file exists a moment before they are)."""
    pid_file, deadline = job_dir / f"rank{rank}.pid", time.monotonic() + 10
    words: list[str] = []
    while not words and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            words = pid_file.read_text().split()
        if not words:
            time.sleep(0.05)
    assert words, f"no pid file for rank {rank}"
    return int(words[0])


def test_after_the_stop_the_relay_reaps_a_rank_whose_agent_was_killed_and_says_so(cluster):
    """Issue 33: the relay, not the master's ssh (or srun), kills what the job's pid files still name
    once the master said stop and its agents have left, and tells the master."""
    server, agent, job_dir = cluster
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    relay = relay_process(job_dir)
    assert relay is not None
    orphan = wait_for_rank(job_dir, 1)
    agents[1].send_signal(signal.SIGKILL)  # its rank's process group lives on
    assert [e.kind for e in take(server, 1)] == [EventKind.LOST]
    assert not gone_or_zombie(orphan)
    server.stop_all(0.0)
    assert server.reaped_by_relays(10.0) == {NODE}
    assert wait_gone(orphan), "the orphaned rank outlived the relay's reap"
    assert agents[0].wait(timeout=10) != 0
    relay.wait(timeout=10)  # it ends with its reap, no linger
    assert not (job_dir / "rank1.pid").exists() and not (job_dir / jobdir.PRIVATE_FILE).exists()


def test_an_agent_that_does_not_end_is_killed_at_the_stops_deadline(cluster):
    server, agent, job_dir = cluster
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    rank = wait_for_rank(job_dir, 0)
    agents[0].send_signal(signal.SIGSTOP)  # it cannot act on the stop
    server.stop_all(0.0)
    began = time.monotonic()
    assert server.reaped_by_relays(10.0) == {NODE}
    assert 1.0 < time.monotonic() - began < 8.0  # the relay waited out the stop's margin, not more
    assert agents[0].wait(timeout=10) == -signal.SIGKILL
    assert wait_gone(rank)


def test_a_stop_that_finds_every_agent_gone_is_reaped_at_once(cluster, monkeypatch):
    """Ranks that failed on their own (a peer's crash breaks their collective) leave before the
    master's stop: no agent's leave follows it, so the reap must not wait for the relay's next tick
    (up to a second of the master's exit) or the stop's margin. Here the relay never ticks and the
    margin is far off: only the stop itself can reap."""
    monkeypatch.setattr(node_relay.Relay, "_tick", lambda self, summary=True: None)
    monkeypatch.setattr(protocol, "RELAY_STOP_MARGIN_S", 60.0)
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    agents = [agent(rank, "exit 3") for rank in range(2)]
    assert [process.wait(timeout=20) for process in agents] == [3, 3]
    assert wait_for(lambda: not hosted.relay.all_links(), 10)
    server.stop_all(0.0)
    assert server.reaped_by_relays(5.0) == {NODE}
    hosted.end()


def test_the_relay_reaps_at_the_stops_deadline_not_at_its_next_tick(cluster, monkeypatch):
    """Issue 37: the master waits only a little past the stop's margin for a node's word before it
    reaps the node itself (and, for its own node, kills the node process hosting the relay): the
    relay reaps at the deadline itself. Here it never ticks, so only that deadline can reap."""
    monkeypatch.setattr(node_relay.Relay, "_tick", lambda self, summary=True: None)
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    rank = wait_for_rank(job_dir, 0)
    agents[0].send_signal(signal.SIGSTOP)  # it cannot act on the stop: its link stays
    server.stop_all(0.0)
    assert server.reaped_by_relays(protocol.RELAY_STOP_MARGIN_S + 5.0) == {NODE}
    assert agents[0].wait(timeout=10) == -signal.SIGKILL
    assert wait_gone(rank)
    hosted.end()
    assert not hosted.thread.is_alive()


def test_a_node_process_ending_while_its_relay_reaps_waits_for_the_relays_word(cluster, monkeypatch):
    """Issue 37's killed-worker race: on the master's own node the node process ends its relay as soon
    as its agents have exited. After the stop that may fall while the relay is still reaping: the relay
    must not close the master's link before its word that the node is reaped has gone out, or the
    master reaps the node itself. A slow reap (as under load) makes the window wide here."""
    real_reap = node_relay.reap.reap_dir

    def slow_reap(job_dir: Path, keep: object = ()) -> list[int]:
        time.sleep(1.0)
        return real_reap(job_dir, keep=keep)  # type: ignore[arg-type]

    monkeypatch.setattr(node_relay.reap, "reap_dir", slow_reap)
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    server.stop_all(0.0)
    assert [process.wait(timeout=10) for process in agents] == [128 + signal.SIGKILL] * 2
    hosted.end()  # what launch/node does once its agents are done: the reap is still under way
    assert server.reaped_by_relays(5.0) == {NODE}
    assert not hosted.thread.is_alive()
    log = (job_dir / relay_join.LOG_NAME).read_text()
    assert "ended: the node reaped after the master's stop" in log, log


def test_the_relays_reap_is_in_its_log_before_the_master_hears_it(cluster, monkeypatch):
    """On the master's own node the supervisor kills the launcher's group, the node process hosting
    the relay among them, as soon as every relay's word is in: the relay's last line would be lost, so
    its reap is logged before the word goes out (its last line never comes here)."""
    monkeypatch.setattr(node_relay.Relay, "_say_end", lambda self: None)
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    server.stop_all(0.0)
    assert server.reaped_by_relays(10.0) == {NODE}
    log = (job_dir / relay_join.LOG_NAME).read_text()
    assert "the node reaped after the master's stop (" in log, log
    for process in agents:  # stopped by the master, or by the reap if one had not ended yet
        process.wait(timeout=10)
    hosted.end()


def test_no_reap_is_awaited_without_a_stop(cluster):
    server, agent, _ = cluster
    agent(0, "sleep 60")
    assert len(take(server, 1)) == 1
    began = time.monotonic()
    assert server.reaped_by_relays(5.0) == frozenset()
    assert time.monotonic() - began < 5.5


def test_a_silent_node_is_not_waited_for(cluster):
    """A node cut off (its relay silent past the heartbeat timeout) cannot answer the stop: the master
    does not wait for its reap (its own agents end its ranks once the master's beats stop)."""
    server, agent, job_dir = cluster
    server.heartbeat_timeout_s = 3.0
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    relay = relay_process(job_dir)
    assert relay is not None
    relay.suspend()
    lost = take(server, 2, timeout_s=15)
    assert sorted((e.kind, e.rank) for e in lost) == [(EventKind.LOST, 0), (EventKind.LOST, 1)]
    server.stop_all(0.0)
    began = time.monotonic()
    assert server.reaped_by_relays(10.0) == frozenset()
    assert time.monotonic() - began < 2.0
    relay.kill()
    assert all(process.wait(timeout=10) != 0 for process in agents)


def relay_processes(job_root: Path) -> list[psutil.Process]:
    """Relay processes of this test's job (an agent starts one where no relay listens)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        words = process.info["cmdline"] or []
        if "gaudi_cluster.rank.relay" in words and str(job_root) in words:
            found.append(process)
    return found


def test_a_node_process_runs_the_relay_itself_and_its_agents_join_it(cluster):
    """Where the node process outlives its ranks (an srun task, the master's own node), it runs their
    relay in-process: the agents join that one (no relay process is started), the node still speaks
    over one connection, and the relay ends once its agents have, their exits sent."""
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    assert relay_host.host(JOB, job_dir.parent, f"127.0.0.1:{server.port}", 30.0, 10.0) is None  # one a job
    agents = [agent(rank, f"echo up; sleep 1; exit {rank}") for rank in range(3)]
    hellos = take(server, 3)
    assert sorted(e.rank for e in hellos) == [0, 1, 2] and seated_connections(server) == 1
    assert relay_processes(job_dir.parent) == [] and relay_process(job_dir) is None
    exits = take(server, 3)
    assert {e.rank: e.code for e in exits} == {0: 0, 1: 1, 2: 2}
    assert [process.wait(timeout=10) for process in agents] == [0, 1, 2]
    started = time.monotonic()
    hosted.end()
    assert not hosted.thread.is_alive() and time.monotonic() - started < node_relay.LINGER_S  # no lingering
    assert not (job_dir / jobdir.RELAY_SOCKET).exists()


def test_a_node_whose_ranks_all_failed_before_the_stop_is_reported_clean(cluster):
    """The CI case of stop 50: the master's own node process ran the relay, its rank failed on its
    own (a peer died) and the relay ended before the master's stop. It says the node is clean, so the
    master does not reach that node to reap it."""
    server, agent, job_dir = cluster
    hosted = host_relay(server, job_dir)
    agents = [agent(rank, "exit 3") for rank in range(2)]
    kinds = sorted(e.kind.value for e in take(server, 4))
    assert kinds == sorted([EventKind.HELLO.value] * 2 + [EventKind.EXIT.value] * 2)
    assert [process.wait(timeout=10) for process in agents] == [3, 3]
    hosted.end()
    server.stop_all(0.0)
    began = time.monotonic()
    assert server.reaped_by_relays(5.0) == {NODE}
    assert time.monotonic() - began < 1.0  # nothing left to wait for


def test_a_relay_that_ends_with_a_pid_file_left_leaves_its_node_to_the_master(cluster):
    """An agent killed leaves its pid file (its rank may live on): the relay that ends without a stop
    does not call that node clean."""
    server, agent, job_dir = cluster
    agents = [agent(rank, "sleep 60") for rank in range(2)]
    assert len(take(server, 2)) == 2
    relay = relay_process(job_dir)
    assert relay is not None
    orphans = [wait_for_rank(job_dir, rank) for rank in range(2)]
    for process in agents:
        process.send_signal(signal.SIGKILL)
    assert [e.kind for e in take(server, 2)] == [EventKind.LOST] * 2
    relay.wait(timeout=10)  # it lingers, then ends: no agent is left
    server.stop_all(0.0)
    assert server.reaped_by_relays(2.0) == frozenset()
    for orphan in orphans:
        os.killpg(orphan, signal.SIGKILL)


def test_a_node_process_relay_the_master_refuses_leaves_the_reason_in_its_log(cluster, tmp_path):
    """The master does not admit the node: the relay's reason goes to the relay's log, as a relay
    process's does, and the lock is let go (an agent would start a relay and meet the same refusal)."""
    server, _agent, _job_dir = cluster
    jobdir.stage(tmp_path, "other-job", PrivatePayload(node=NODE, token="not-the-key"))
    hosted = relay_host.host("other-job", tmp_path, f"127.0.0.1:{server.port}", 30.0, 3.0)
    assert hosted is not None
    hosted.thread.join(timeout=15)
    assert not hosted.thread.is_alive()
    log = (tmp_path / "other-job" / relay_join.LOG_NAME).read_text()
    assert "gaudi-cluster[relay]: error:" in log, log
    assert (
        relay_host.host("other-job", tmp_path, f"127.0.0.1:{server.port}", 30.0, 0.1) is not None
    )  # lock free


def test_a_node_process_that_runs_the_relay_runs_its_agents_too(cluster):
    """Under srun and on the master's node, the node process (launch/node) holds the node's relay and
    its ranks' agents as threads: one interpreter for the node besides the ranks, each rank still
    seated, its output and exit code carried, its pid file naming the node process as its agent."""
    server, _agent, job_dir = cluster
    agent_args = ["--job-id", JOB, "--job-root", str(job_dir.parent), "--heartbeat-timeout", "30",
                  "--control", f"127.0.0.1:{server.port}", "--output-relay",
                  "--", "sh", "-c", 'echo "up $RANK in $PWD"; sleep 2; exit $RANK']  # fmt: skip
    spec = NodeSpec(
        node_rank=0, nnodes=2, first_rank=0, slots=(0, 1, 2), world_size=5, master_addr="127.0.0.1",
        master_port=29500, cwd=str(job_dir.parent), env={}, python=sys.executable,
        agent_args=tuple(agent_args), preimport=False,
        relay=NodeRelaySpec(JOB, str(job_dir.parent), f"127.0.0.1:{server.port}", 30.0),
    )  # fmt: skip
    node = subprocess.Popen(
        [sys.executable, "-m", "gaudi_cluster.launch.node"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={"PYTHONPATH": str(APP), "PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert node.stdin is not None
    node.stdin.write(spec.to_json())
    node.stdin.close()
    hellos = take(server, 3)
    assert sorted(e.rank for e in hellos) == [0, 1, 2] and seated_connections(server) == 1
    assert {e.pid for e in hellos} == {node.pid}  # every rank's agent is the node process
    assert gaudi_cluster_children(node.pid) == [], "no agent or relay process beside the node process"
    assert relay_process(job_dir) is None
    pid_files = {int(path.read_text().split()[1]) for path in job_dir.glob("rank*.pid")}
    assert pid_files == {node.pid}
    exits = take(server, 3)
    assert {e.rank: e.code for e in exits} == {0: 0, 1: 1, 2: 2}
    assert node.wait(timeout=20) == 1  # the first failing agent's code
    lines = [line for item in drain(server.output) for line in item.lines]
    ups = {line for line in lines if "up " in line}
    assert ups == {f"up {rank} in {job_dir.parent}" for rank in range(3)}  # in the spec's directory
    assert "rank agent" not in (node.stdout.read() if node.stdout else "")  # no agent slipped


def gaudi_cluster_children(pid: int) -> list[list[str]]:
    """The command lines of pid's descendants that run one of our modules (an agent, a relay). By the
    module, not the name: a rank's shell between its fork and its exec still shows the node process's
    name and command line."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            argv = child.cmdline()
            if any(arg.startswith("gaudi_cluster.") and arg != "gaudi_cluster.launch.node" for arg in argv):
                found.append(argv)
    return found


def drain(source: queue.Queue) -> list:
    found = []
    with contextlib.suppress(queue.Empty):
        while True:
            found.append(source.get_nowait())
    return found
