"""The control server at scale: a swarm of 2,000 simulated ranks on the real server and supervisor,
and a master out of file descriptors that keeps serving.

The swarm (`gaudi_cluster_dev.swarm`) is one process speaking the real protocol for every rank; it
is the supervisor's launcher here, as deepspeed or pdsh would be.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gaudi_cluster.launch.plan import LaunchPlan
from gaudi_cluster.supervise.control import ControlServer
from gaudi_cluster.supervise.outcome import JobState
from gaudi_cluster.supervise.supervisor import Supervisor, SupervisorSettings
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Identity, authenticate, connect, connect_and_authenticate
from gaudi_cluster_dev.swarm_plan import SwarmPlan

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = f"{ROOT / 'app'}:{ROOT / 'dev'}"
JOB = "20261201-230000-swarm0"


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.timeout(180)  # a hang fails here; no time is asserted
@pytest.mark.parametrize("relays", [True, False], ids=["a-relay-per-node", "a-connection-per-rank"])
def test_a_swarm_of_2000_ranks_checks_in_beats_and_is_stopped(tmp_path, caplog, relays):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    plan = SwarmPlan(nodes=250)
    secret = protocol.new_token()
    server = ControlServer(
        "127.0.0.1", 0, JOB, 30.0, secret, plan.expected(), nodes=plan.rank_nodes(),
        addresses=plan.addresses(),
    )  # fmt: skip
    report = tmp_path / "swarm.json"
    swarm = LaunchPlan(
        argv=(sys.executable, "-m", "gaudi_cluster_dev.swarm", "--port", str(server.port), "--job", JOB,
              "--nodes", str(plan.nodes), "--report", str(report), "--deadline", "150",
              *(["--relays"] if relays else [])),
        env={"SWARM_SECRET": secret, "PYTHONPATH": PYTHONPATH},
        launcher="swarm",
    )  # fmt: skip
    before = threads()
    seen: dict[str, int] = {}

    def all_in() -> None:
        """Every rank admitted: wait for each one's beats (with work times), then stop the job."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(agent.work_history for agent in server.agents()):
            time.sleep(0.2)
        seen["threads"] = threads()
        seen["beating"] = sum(bool(agent.work_history) for agent in server.agents())
        seen["connections"] = len(server._sessions)
        os.kill(os.getpid(), signal.SIGTERM)

    server.start()
    supervisor = Supervisor(
        JOB, swarm, server, plan.slots_by_host(), SupervisorSettings(start_timeout_s=90, stop_grace_s=5),
        out=io.StringIO(), on_all_started=all_in,
    )  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    try:
        supervisor.install_signal_handlers()
        outcome = supervisor.run()
    finally:
        server.close()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    counts = json.loads(report.read_text())
    assert (outcome.state, outcome.exit_code) == (JobState.STOPPED, 143), outcome
    assert sorted(outcome.ranks_seen) == list(range(plan.ranks))  # every rank admitted
    assert seen["beating"] == plan.ranks
    assert seen["connections"] == (plan.nodes if relays else plan.ranks)
    assert counts["welcomed"] == plan.ranks and counts["handshake_failures"] == 0, counts
    assert counts["stops"] == plan.ranks, counts  # every rank got its stop
    assert not [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    # One thread serves the sockets; the others are the supervisor's own (output pump, callback).
    assert seen["threads"] - before <= 6, (before, seen)


_CROWDED_MASTER = """
import os, sys
from gaudi_cluster.supervise.control import ControlServer
server = ControlServer("127.0.0.1", 0, "job", 30.0, os.environ["SECRET"], {0: "h", 1: "h"})
server.start()
print(server.port, flush=True)
event = server.events.get(timeout=30)
print(event.kind.value, event.rank, flush=True)
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError as error:
    print("full", error.errno, flush=True)
sys.stdin.readline()
for fd in held:
    os.close(fd)
event = server.events.get(timeout=30)
print(event.kind.value, event.rank, flush=True)
"""


@pytest.mark.timeout(120)
def test_a_master_out_of_descriptors_keeps_serving_and_admits_once_they_are_back():
    secret = protocol.new_token()
    master = subprocess.Popen(
        [sys.executable, "-c", _CROWDED_MASTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "SECRET": secret, "PYTHONPATH": PYTHONPATH},
    )  # fmt: skip
    try:
        assert master.stdout is not None and master.stdin is not None
        address = f"127.0.0.1:{int(master.stdout.readline())}"
        key = protocol.node_key(secret, "h")
        first = connect(address, 10)
        authenticate(first, Identity(key, "h", "job", "h", 0, 1))
        assert master.stdout.readline().split() == ["hello", "0"]
        assert master.stdout.readline().startswith("full")  # every descriptor of the master taken
        got: list[Channel] = []
        rank_1 = Identity(key, "h", "job", "h", 1, 2)
        second = threading.Thread(target=lambda: got.append(connect_and_authenticate(address, rank_1, 40)))
        second.start()
        first.settimeout(5)
        beats = [first.receive() for _ in range(2)]  # the admitted agent is still served meanwhile
        assert beats == [messages.Beat(), messages.Beat()], beats
        master.stdin.write("\n")
        master.stdin.flush()
        second.join(60)
        assert got, "the second agent was never admitted"
        assert master.stdout.readline().split() == ["hello", "1"]
        first.close()
        got[0].close()
    finally:
        master.kill()
        _, err = master.communicate(timeout=10)
    assert "accept failed (EMFILE)" in err, err[-2000:]
