"""Every control-plane reader under random and adversarial lines (tests/support/fuzz_lines, a fixed
seed): the master's admission and its sessions (a rank's and a node relay's), the relay's link from
the master, the agent's handshake and the relay's Unix socket. For each: every line is dropped and
logged, no exception escapes a reader thread (threading.excepthook) or the master's loop, and the
connection and the job go on: a good message afterwards still works.

GAUDI_CLUSTER_FUZZ_LINES=200000 runs it longer by hand (10,000 lines a reader in CI, about 45 s).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from gaudi_cluster.rank import jobdir
from gaudi_cluster.rank.relay import Relay, _Link
from gaudi_cluster.supervise import admission
from gaudi_cluster.supervise.control import ControlServer, EventKind
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Identity, authenticate, connect, encode
from gaudi_cluster.wire.private_payload import PrivatePayload

from tests.support.fuzz_lines import LINES, lines, sealable

JOB, NODE, HOST = "fuzz-job", "node-a", "node-a"


@pytest.fixture
def escaped(monkeypatch) -> list[threading.ExceptHookArgs]:
    """Every exception that ends a thread (none may)."""
    found: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", found.append)
    return found


@pytest.fixture
def server():
    secret = protocol.new_token()
    server = ControlServer("127.0.0.1", 0, JOB, 30, secret, {0: HOST, 1: HOST}, nodes={0: NODE, 1: NODE})
    server.secret = secret  # type: ignore[attr-defined]
    server.start()
    yield server
    server.close()


def accepted(line: bytes, allowed: frozenset[messages.MessageType]) -> bool:
    """Whether a line happens to be a well-formed message of these kinds (then it is no attack)."""
    try:
        messages.parse_line(line, allowed)
    except messages.BadMessage:
        return False
    return True


def join(server, rank: int = 0, role: str = "rank") -> Channel:
    channel = connect(f"127.0.0.1:{server.port}", 5)
    key = protocol.node_key(server.secret, NODE)
    me = Identity(key, NODE, JOB, HOST, rank if role == "rank" else protocol.NODE_RANK, 4242, role=role)
    authenticate(channel, me)
    return channel


def until(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def refusals(server, caplog) -> int:
    logged = [r for r in caplog.records if "control channel: refused" in r.getMessage()]
    return len(logged) + server.gate.refusals_not_logged()


def assert_the_loop_never_failed(server, caplog, escaped) -> None:
    assert server._thread.is_alive()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records[-3:]
    assert escaped == []


def test_the_masters_admission_refuses_every_line_and_still_admits(server, caplog, escaped):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    sent = 0
    for line in lines("admission"):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        reader = sock.makefile("rb")
        assert b'"challenge"' in reader.readline()
        sock.sendall(line + b"\n")
        answer = reader.readline()  # a refusal, then the close
        assert answer == b"" or b'"refused"' in answer, answer[:200]
        assert reader.readline() == b""
        sock.close()
        sent += 1
    assert until(lambda: refusals(server, caplog) >= sent), (refusals(server, caplog), sent)
    channel = join(server)  # the way in still works
    assert next(iter([server.events.get(timeout=5)])).kind is EventKind.HELLO
    channel.send(messages.Beat(step=7, progress_age=0.0))
    assert until(lambda: [a.step for a in server.agents()] == [7])
    assert_the_loop_never_failed(server, caplog, escaped)


@pytest.mark.parametrize("role", ["rank", "node"])
def test_the_masters_session_drops_every_line_and_the_seat_stays(server, caplog, escaped, role):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    channel = join(server, role=role)
    if role == "node":
        channel.send(messages.Join(HOST, 0, 7, NODE))
        assert channel.receive(messages.FROM_MASTER) == messages.Seated(0)
    assert server.events.get(timeout=5).kind is EventKind.HELLO
    allowed = messages.FROM_RELAY_SESSION if role == "node" else messages.FROM_AGENT_SESSION
    assert channel.session is not None
    before, sent = refusals(server, caplog), 0
    for line in lines(f"session-{role}"):
        channel._sock.sendall(line + b"\n")  # injected on the path: no session MAC
        sent += 1
        if not accepted(sealable(line), allowed):  # and from the node itself, holding the key
            with channel._send_lock:
                channel._sock.sendall(channel.session.seal_line(sealable(line)))
            sent += 1
    assert until(lambda: refusals(server, caplog) - before >= sent), (refusals(server, caplog) - before, sent)
    beat = messages.Beat(step=9, progress_age=0.0)
    channel.send(messages.Summary((0,), (9,), (0.0,), (None,)) if role == "node" else beat)
    assert until(lambda: [a.step for a in server.agents()] == [9])
    assert server.events.empty()  # no exit, no loss: the job goes on
    assert not channel.closed
    assert_the_loop_never_failed(server, caplog, escaped)


def staged_relay(tmp_path: Path, secret: str) -> Relay:
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE, token=protocol.node_key(secret, NODE)))
    relay = Relay(JOB, tmp_path / JOB, "", 30)
    relay.host = HOST
    relay.node = NODE
    return relay


def test_the_relays_link_from_the_master_drops_every_line_and_still_stops(tmp_path, escaped, capsys):
    secret = protocol.new_token()
    listener = socket.create_server(("127.0.0.1", 0))
    masters: list[Channel] = []

    def master() -> None:
        sock, _ = listener.accept()
        channel = Channel(sock)
        gate = admission.Gate(JOB, secret, {0: HOST}, {0: NODE}, None)
        channel.session = gate.admit(channel, "127.0.0.1", lambda _seat: False).session
        masters.append(channel)

    threading.Thread(target=master, daemon=True).start()
    relay = staged_relay(tmp_path, secret)
    relay.control = f"127.0.0.1:{listener.getsockname()[1]}"
    relay.connect(10)
    assert until(lambda: masters)
    (master_link,) = masters
    agent_side, relay_side = socket.socketpair()
    relay.links[0] = _Link(Channel(relay_side))
    reader = threading.Thread(target=relay.from_master, daemon=True)
    reader.start()
    sent = 0
    for line in lines("relay-from-master"):
        master_link._sock.sendall(line + b"\n")
        sent += 1
        if not accepted(sealable(line), messages.FROM_MASTER):
            assert master_link.session is not None
            master_link._sock.sendall(master_link.session.seal_line(sealable(line)))
            sent += 1
    master_link.send(messages.Stop(grace=3.0, reason="the fuzz is over"))
    agent = Channel(agent_side)
    agent.settimeout(10)
    assert agent.receive(messages.FROM_MASTER) == messages.Stop(3.0, "the fuzz is over")
    assert reader.is_alive() and not relay.done.is_set()
    assert relay.ignored == sent
    assert "ignored a control message" in capsys.readouterr().out
    assert escaped == []
    master_link.close()
    assert until(relay.done.is_set)  # the master gone: the relay ends as it should
    listener.close()


def test_the_agents_handshake_turns_every_line_into_a_connection_error(escaped):
    me = Identity(protocol.new_token(), NODE, JOB, HOST, 0, 1)
    challenge = encode(messages.render(messages.Challenge(HEX_NONCE, JOB)))
    for step in ("challenge", "welcome"):
        for line in lines(f"handshake-{step}", LINES // 2):
            if step == "challenge" and accepted(line, frozenset({messages.MessageType.CHALLENGE})):
                continue  # a good challenge: the agent waits for the welcome
            master_side, agent_side = socket.socketpair()
            master_side.sendall((challenge if step == "welcome" else b"") + line + b"\n")
            master_side.shutdown(socket.SHUT_WR)
            with pytest.raises(ConnectionError):
                authenticate(Channel(agent_side), me)
            master_side.close()
            agent_side.close()
    assert escaped == []


HEX_NONCE = "cd" * 32


def test_the_relays_unix_socket_drops_every_line_and_still_joins(tmp_path, escaped, capsys):
    relay = staged_relay(tmp_path, protocol.new_token())
    to_master, master_side = socket.socketpair()
    relay.master = Channel(to_master)
    master = Channel(master_side)
    master.settimeout(10)
    agent_side, relay_side = socket.socketpair()
    serving = threading.Thread(target=relay.serve_agent, args=(Channel(relay_side),), daemon=True)
    serving.start()
    sent = 0
    for line in lines("relay-socket"):
        if not accepted(line, messages.FROM_AGENT):
            agent_side.sendall(line + b"\n")
            sent += 1
    agent_side.sendall(encode(messages.render(messages.Join(HOST, 3, 77, "elsewhere"))))
    assert master.receive(messages.FROM_RELAY_SESSION) == messages.Join(HOST, 3, 77, NODE)
    for line in lines("relay-socket-joined"):  # and once joined: beats and exits of its own
        if not accepted(line, messages.FROM_AGENT):
            agent_side.sendall(line + b"\n")
            sent += 1
    agent_side.sendall(encode(messages.render(messages.Exit(5, tail=("done",)))))
    assert master.receive(messages.FROM_RELAY_SESSION) == messages.Exit(5, tail=("done",), rank=3)
    assert serving.is_alive() and relay.dropped == sent
    assert "dropped a line from an agent" in capsys.readouterr().out
    assert escaped == []
    agent_side.close()
    serving.join(5)
    assert not serving.is_alive()
