"""Admission that cannot be jammed and integrity after it, against a real ControlServer on loopback.

Peers come from several loopback addresses (127.0.0.0/8 is all this host), so that planned nodes
and strangers are told apart by address as on a training network.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gaudi_cluster.rank import jobdir
from gaudi_cluster.supervise import admission
from gaudi_cluster.supervise.control import ControlServer, EventKind
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Identity, authenticate, connect_and_authenticate
from gaudi_cluster.wire.private_payload import PrivatePayload

JOB = "20261201-120000-abcdef"
NODE_A, NODE_B = "node-a", "node-b"
APP = Path(__file__).resolve().parents[2] / "app"


@pytest.fixture
def fast_handshake(monkeypatch):
    monkeypatch.setattr(protocol, "HANDSHAKE_TIMEOUT_S", 1.0)


@pytest.fixture
def server(fast_handshake):
    secret = protocol.new_token()
    made = ControlServer(
        "127.0.0.1",
        0,  # the kernel picks; the tests read server.port
        JOB,
        10.0,
        secret,
        {0: NODE_A, 1: NODE_A, 2: NODE_B},
        addresses={NODE_A: {"127.0.0.1"}, NODE_B: {"127.0.0.3"}},
    )
    made.start()
    made.secret = secret  # type: ignore[attr-defined]
    yield made
    made.close()


def me(server, rank: int = 0, node: str = NODE_A, key: str | None = None) -> Identity:
    return Identity(key or protocol.node_key(server.secret, node), node, JOB, node, rank, 4242)


def peer_socket(server, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0))


def join(server, rank: int = 0, node: str = NODE_A, source: str = "127.0.0.1") -> Channel:
    channel = Channel(peer_socket(server, source))
    authenticate(channel, me(server, rank, node))
    return channel


def events(server, timeout: float = 3.0) -> list:
    found = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found.append(server.events.get(timeout=0.1))
        except queue.Empty:
            if found:
                return found
    return found


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the master hung up, or None if it had not within `seconds`."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - started


def free_slots(server) -> bool:
    """Every unauthenticated slot given back (nothing leaked by what went wrong in a handshake)."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if not server.gate._unauthenticated:
            return True
        time.sleep(0.05)
    return False


def test_a_flood_of_nested_lines_leaks_no_slot_and_the_agents_get_in(server):
    for _ in range(3 + admission.SPARE_CONNECTIONS + 10):  # more than every slot of the address
        with peer_socket(server, "127.0.0.1") as sock:
            sock.sendall(b"[" * 2000 + b"\n")
            assert closed_within(sock, 5) is not None
    assert free_slots(server)
    admitted = [join(server, rank=0), join(server, rank=1)]
    assert [e.kind for e in events(server)] == [EventKind.HELLO, EventKind.HELLO]
    assert all(not channel.closed for channel in admitted)


def test_a_slowloris_is_cut_at_the_handshake_deadline(server):
    sock = peer_socket(server, "127.0.0.1")

    def trickle() -> None:
        try:
            for _ in range(40):
                sock.sendall(b"[")
                time.sleep(0.2)
        except OSError:
            pass

    threading.Thread(target=trickle, daemon=True).start()
    sock.makefile("rb").readline()  # the challenge
    # One byte every 0.2 s would have kept a per-recv timeout alive for 8 s.
    took = closed_within(sock, 6)
    assert took is not None and took < 4.0, took
    assert free_slots(server)


def test_strangers_share_a_small_pool_that_never_takes_a_planned_nodes_room(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    held = [peer_socket(server, "127.0.0.9") for _ in range(admission.PER_STRANGER)]
    time.sleep(0.2)
    extra = peer_socket(server, "127.0.0.9")
    assert closed_within(extra, 2) is not None  # this stranger's share is used up
    pool = [peer_socket(server, f"127.0.1.{i}") for i in range(1, admission.STRANGER_POOL + 4)]
    time.sleep(0.3)
    assert sum(closed_within(s, 0.2) is not None for s in pool) >= 3  # beyond the pool: turned away
    admitted = [join(server, rank=0), join(server, rank=2, node=NODE_B, source="127.0.0.3")]
    assert [e.kind for e in events(server)] == [EventKind.HELLO, EventKind.HELLO]  # their room is untouched
    assert all(not channel.closed for channel in admitted)
    for sock in [*held, *pool]:
        sock.close()
    assert any("too many unauthenticated connections" in r.getMessage() for r in caplog.records)


def test_a_node_key_from_another_address_is_refused(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    with pytest.raises(ConnectionError, match="refused this rank: rank 0 claims node 'node-a' but connects"):
        join(server, rank=0, source="127.0.0.5")
    assert not events(server, 0.5)


def test_an_agent_retries_a_jammed_master_until_it_gets_in(server):
    # Every slot of node-a's address held by silent peers: the agent is turned away at first.
    held = [peer_socket(server, "127.0.0.1") for _ in range(2 + admission.SPARE_CONNECTIONS)]
    time.sleep(0.2)
    got: list[Channel] = []
    agent = threading.Thread(
        target=lambda: got.append(connect_and_authenticate(f"127.0.0.1:{server.port}", me(server), 20))
    )
    agent.start()
    agent.join(25)
    for sock in held:
        sock.close()
    assert got, "the agent gave up"
    assert got[0].attempts > 1  # it was refused or cut, and tried again once the deadline freed a slot
    assert [e.kind for e in events(server)] == [EventKind.HELLO]


def test_an_unsealed_exit_on_an_admitted_connection_is_ignored_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    channel = join(server)
    assert [e.kind for e in events(server)] == [EventKind.HELLO]
    forged = {"type": "exit", "code": 0, "signal": None, "tail": [], "stop_reason": None}
    channel._sock.sendall((json.dumps(forged) + "\n").encode())  # as injected from the path
    assert events(server, 1.0) == []
    assert any("without a valid session MAC" in r.getMessage() for r in caplog.records)
    channel.send({"type": "beat", "step": 4, "progress_age": 0.0})
    time.sleep(0.3)
    assert [a.step for a in server.agents()] == [4]  # the real agent's messages still count


def test_a_replayed_sealed_message_is_dropped():
    key = protocol.new_token()
    agent, master = protocol.Session(key, "agent"), protocol.Session(key, "master")
    first = agent.seal({"type": "beat", "step": 1})
    assert master.open(first) == b'{"type":"beat","step":1,"seq":1}'
    with pytest.raises(protocol.Unsealed, match="sequence 1 where 2 was due"):
        master.open(first)
    tampered = agent.seal({"type": "beat", "step": 2}).replace(b'"step":2', b'"step":3')
    with pytest.raises(protocol.Unsealed, match="no valid session MAC"):
        master.open(tampered)
    with pytest.raises(protocol.Unsealed, match="no valid session MAC"):  # reflected to its sender
        protocol.Session(key, "master").open(master.seal({"type": "stop"}))


def test_refusals_are_logged_quoted_cut_and_bounded(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    for i in range(admission.MAX_LOGGED_REFUSALS + 40):
        with peer_socket(server, "127.0.0.1") as sock:
            sock.makefile("rb").readline()
            host = f"evil{i}\nFAKE LOG LINE" + "x" * 500
            hello = {"type": "hello", "job": JOB, "node": NODE_A, "host": host, "rank": 0, "pid": 1}
            sock.sendall((json.dumps({**hello, "nonce": "0" * 64}) + "\n").encode())
            closed_within(sock, 5)
    messages = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(messages) <= admission.MAX_LOGGED_REFUSALS + 1
    assert all("\n" not in m and len(m) < 500 for m in messages)
    assert server.gate.refusals_not_logged() >= 40


def test_an_injected_stop_never_reaches_a_real_agents_rank(tmp_path, fast_handshake):
    """A real agent behind its node's relay, admitted by the real server: an unsealed stop on the
    relay's connection is ignored (and said in the relay's log), the master's sealed one stops the rank."""
    secret, hostname = protocol.new_token(), socket.gethostname()
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE_A, token=protocol.node_key(secret, NODE_A)))
    server = ControlServer("127.0.0.1", 0, JOB, 30.0, secret, {0: hostname}, nodes={0: NODE_A})
    server.start()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gaudi_cluster.rank.agent", "--job-id", JOB, "--job-root", str(tmp_path),
         "--heartbeat-timeout", "30", "--control", f"127.0.0.1:{server.port}", "--",
         sys.executable, "-c", "import time; print('rank up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(APP), "RANK": "0", "WORLD_SIZE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(agent.stdout.readline, "")), daemon=True).start()
    try:
        assert server.events.get(timeout=30).kind is EventKind.HELLO, "".join(lines)
        deadline = time.monotonic() + 30
        while not any("rank up" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        relay = server._relays[NODE_A]
        relay.sock.sendall(b'{"type": "stop", "grace": 0}\n')  # unsealed: from the path
        time.sleep(1.5)
        assert agent.poll() is None, "".join(lines)
        relay_log = (tmp_path / JOB / "relay.log").read_text()
        assert "ignored a control message (without the session's MAC" in relay_log
        server.stop_all(0)  # sealed by the session: the master's own
        assert agent.wait(timeout=20) != 0
        assert any("stopping rank" in line for line in lines), "".join(lines)
    finally:
        agent.kill()
        server.close()


def relay_identity(server, node: str = NODE_A, key: str | None = None) -> Identity:
    key = key or protocol.node_key(server.secret, node)
    return Identity(key, node, JOB, node, protocol.NODE_RANK, 4243, role="node")


def test_a_node_relay_is_seated_once_and_seats_only_its_nodes_ranks(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    relay = Channel(peer_socket(server, "127.0.0.1"))
    authenticate(relay, relay_identity(server))
    relay.send({"type": "join", "rank": 2, "host": NODE_B, "node": NODE_A, "pid": 7, "local_rank": 0})
    refused = relay.receive()
    assert isinstance(refused, messages.Refused) and refused.rank == 2  # rank 2 is node-b's
    relay.send({"type": "join", "rank": 1, "host": NODE_A, "node": NODE_A, "pid": 7, "local_rank": 1})
    assert relay.receive() == messages.Seated(1)
    assert [(e.kind, e.rank) for e in events(server)] == [(EventKind.HELLO, 1)]
    with pytest.raises(ConnectionError, match="already connected"):
        authenticate(Channel(peer_socket(server, "127.0.0.1")), relay_identity(server))
    relay.send({"type": "exit", "rank": 1, "code": 3, "tail": ["bye"]})
    (exit_event,) = events(server)
    assert (exit_event.kind, exit_event.rank, exit_event.code) == (EventKind.EXIT, 1, 3)
    relay.close()
    assert events(server, timeout=1.5) == []  # its rank's end was reported: no loss


def test_a_node_relay_needs_its_nodes_key_and_address(server):
    with pytest.raises(ConnectionError, match="does not prove"):
        authenticate(Channel(peer_socket(server, "127.0.0.1")), relay_identity(server, key="ab" * 32))
    with pytest.raises(ConnectionError, match="not its address"):
        authenticate(Channel(peer_socket(server, "127.0.0.1")), relay_identity(server, node=NODE_B))
    with pytest.raises(ConnectionError, match="no rank of this job was launched there"):
        authenticate(Channel(peer_socket(server, "127.0.0.1")), relay_identity(server, node="node-z"))


@pytest.mark.parametrize(("timeout_s", "fewest", "most"), [(3.0, 3, 4), (10.0, 1, 2)])
def test_the_masters_beat_is_sealed_and_paced_by_the_timeout(fast_handshake, timeout_s, fewest, most):
    """The beat a node judges the master by: sealed under the session, every second under a 3 s
    timeout, every 2 s under the default 10 s (one a second to 1,000 nodes cost the master a sealed
    send a node each), so four reach a node within its timeout."""
    assert [protocol.beat_every(t) for t in (1.0, 3.0, 7.9, 8.0, 600.0)] == [1, 1, 1, 2, 2]
    secret = protocol.new_token()
    addresses = {NODE_A: {"127.0.0.1"}}
    server = ControlServer("127.0.0.1", 0, JOB, timeout_s, secret, {0: NODE_A}, addresses=addresses)
    server.start()
    server.secret = secret  # type: ignore[attr-defined]
    try:
        sock = peer_socket(server, "127.0.0.1")
        relay = Channel(sock)
        authenticate(relay, relay_identity(server))
        beats, deadline = 0, time.monotonic() + 3.5
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            message = relay.receive()
            if message is None:
                break
            assert message == messages.Beat(), message  # a Dropped here: a beat without a valid seal
            beats += 1
        assert fewest <= beats <= most
    finally:
        server.close()
