"""The control channel lets no one in: the handshake, identity bound to the plan, bounded typed input.

A real ControlServer on loopback; the peers are real sockets speaking the protocol (or not).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
import time

import pytest
from gaudi_cluster.supervise.control import ControlServer, EventKind
from gaudi_cluster.view.jobview import AgentState
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Identity, authenticate, connect

JOB = "20261130-120000-abcdef"
HOST = "node-a"


@pytest.fixture
def server():
    token = protocol.new_token()
    made = ControlServer("127.0.0.1", 0, JOB, 10.0, token, {0: HOST, 1: HOST, 2: "node-b"})
    made.start()
    made.token = token  # type: ignore[attr-defined]
    yield made
    made.close()


def address(server: ControlServer) -> str:
    return f"127.0.0.1:{server.port}"


def key_of(server: ControlServer, node: str = HOST) -> str:
    return protocol.node_key(server.token, node)  # type: ignore[attr-defined]


def join(
    server: ControlServer, rank: int = 0, host: str = HOST, key: str | None = None, node: str | None = None
) -> Channel:
    channel = connect(address(server), 5)
    authenticate(channel, Identity(key or key_of(server, node or host), node or host, JOB, host, rank, 4242))
    return channel


def next_event(server: ControlServer, timeout: float = 3.0):
    try:
        return server.events.get(timeout=timeout)
    except queue.Empty:
        return None


def test_the_right_secret_is_admitted(server):
    channel = join(server)
    event = next_event(server)
    assert (event.kind, event.host, event.rank, event.pid) == (EventKind.HELLO, HOST, 0, 4242)
    channel.send({"type": "exit", "code": 0, "signal": None, "tail": ["done"], "stop_reason": None})
    assert next_event(server).kind is EventKind.EXIT


def test_a_wrong_key_is_refused_and_logged_once_with_the_peer(server, caplog):
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    for _ in range(3):
        with pytest.raises(ConnectionError, match="does not prove this job's key"):
            join(server, key=protocol.new_token())
    time.sleep(0.3)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused == ["control channel: refused 127.0.0.1: no proof within 5s (closed by the peer)"]
    assert next_event(server, 0.5) is None


def test_another_nodes_key_cannot_claim_this_nodes_seat(server, caplog):
    """node-b's agents hold node-b's key only: with it they cannot sit as rank 0 of node-a."""
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    with pytest.raises(ConnectionError, match="does not prove this job's key"):
        join(server, rank=0, host=HOST, key=key_of(server, "node-b"))
    assert next_event(server, 0.5) is None


def raw(server: ControlServer) -> tuple[socket.socket, dict]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    challenge = json.loads(sock.makefile("rb").readline())
    return sock, challenge


def send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def closed(sock: socket.socket, timeout: float = 8.0) -> bool:
    sock.settimeout(timeout)
    try:
        while data := sock.recv(65536):
            if b'"refused"' in data:
                continue
        return True
    except OSError:
        return True


AGENT_NONCE = "0" * 64


def hello(rank: int = 0, host: str = HOST, job: str = JOB) -> dict:
    return {
        "type": "hello",
        "job": job,
        "node": host,
        "host": host,
        "rank": rank,
        "pid": 1,
        "nonce": AGENT_NONCE,
    }


def proof(server, master_nonce: str, rank: int = 0, host: str = HOST) -> dict:
    mac = protocol.proof_mac(
        key_of(server, host), protocol.Transcript(master_nonce, AGENT_NONCE, JOB, host, host, rank)
    )
    return {"type": "proof", "mac": mac}


def test_a_replayed_answer_fails_on_a_new_challenge(server):
    sock, challenge = raw(server)
    recorded = [hello(), proof(server, challenge["nonce"])]
    for message in recorded:
        send(sock, message)
    assert next_event(server).kind is EventKind.HELLO
    sock.close()
    assert next_event(server).kind is EventKind.LOST
    replay, _ = raw(server)
    for message in recorded:  # same bytes, new challenge: the proof no longer matches
        send(replay, message)
    assert closed(replay)
    assert next_event(server, 0.5) is None


def test_a_late_or_silent_peer_is_dropped(server, monkeypatch):
    monkeypatch.setattr(protocol, "HANDSHAKE_TIMEOUT_S", 0.5)
    sock, _ = raw(server)
    started = time.monotonic()
    assert closed(sock)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("rank", "host", "why"),
    [(7, HOST, "not launched"), (2, HOST, "not launched"), (0, "intruder", "not launched")],
)
def test_only_the_pairs_the_master_launched_get_in(server, rank, host, why):
    with pytest.raises(ConnectionError, match=why):
        join(server, rank=rank, host=host)


def test_a_second_hello_for_a_connected_rank_never_replaces_it(server):
    first = join(server, rank=1)
    assert next_event(server).kind is EventKind.HELLO
    with pytest.raises(ConnectionError, match="rank 1 is already connected"):
        join(server, rank=1)
    first.send(hello(rank=1))  # a second hello on the same line
    first.send({"type": "beat", "step": 5, "progress_age": 0.1})
    time.sleep(0.3)
    (agent,) = server.agents()
    assert (agent.rank, agent.pid, agent.step) == (1, 4242, 5)
    assert type(agent) is AgentState  # the one record of a rank, shared with what the operator sees


def test_the_old_attack_cannot_stop_the_job(server):
    """hello with the job id from the logs, then exit: now turned away before any event."""
    sock, _ = raw(server)
    send(sock, {"type": "hello", "job": JOB, "host": "intruder", "rank": 1})
    send(sock, {"type": "exit", "code": 1})
    assert closed(sock)
    assert next_event(server, 1.0) is None


def test_a_line_over_64_kb_closes_the_connection(server):
    channel = join(server)
    assert next_event(server).kind is EventKind.HELLO
    channel._sock.sendall(b"x" * (protocol.MAX_LINE + 10))
    assert next_event(server).kind is EventKind.LOST


def test_connections_beyond_the_budget_are_refused(server):
    held = [raw(server)[0] for _ in range(3 + 8)]
    extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    assert closed(extra, 5)
    for sock in held:
        sock.close()


def test_a_master_without_the_secret_cannot_command_an_agent():
    """An impostor on the control address (same job id, no secret) gets no welcome accepted, so the
    agent never starts its rank and never takes a `stop` from it."""
    listener = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []

    def impostor() -> None:
        sock, _ = listener.accept()
        send(sock, {"type": "challenge", "nonce": "1" * 64, "job": JOB})
        reader = sock.makefile("rb")
        answers.append(reader.readline())  # the hello: names and a nonce, no MAC to relay
        send(sock, {"type": "welcome", "mac": "2" * 64})
        send(sock, {"type": "stop", "grace": 0})
        sock.settimeout(1)
        with contextlib.suppress(OSError):
            answers.append(reader.readline())
        sock.close()

    threading.Thread(target=impostor, daemon=True).start()
    channel = connect(f"127.0.0.1:{listener.getsockname()[1]}", 5)
    with pytest.raises(ConnectionError, match="does not prove this job's key"):
        authenticate(channel, Identity(protocol.new_token(), HOST, JOB, HOST, 0, 1))
    time.sleep(1.2)
    hello, *after = answers
    assert "mac" not in json.loads(hello) and json.loads(hello)["node"] == HOST
    assert after in ([], [b""])  # the agent never proved anything to it: no MAC to relay
    listener.close()


def bad_hello(**over) -> dict:
    return {
        "type": "hello",
        "job": JOB,
        "host": HOST,
        "rank": 0,
        "pid": 1,
        "node": HOST,
        "nonce": "0" * 64,
        **over,
    }


BAD_MESSAGES = [
    ("not a dict", [1, 2]),
    ("no type", {"step": 1}),
    ("unknown type", {"type": "shutdown"}),
    ("rank not int", bad_hello(rank="1")),
    ("rank bool", bad_hello(rank=True)),
    ("negative rank", bad_hello(rank=-1)),
    ("empty host", bad_hello(host="")),
    ("long host", bad_hello(host="h" * 300)),
    ("short nonce", bad_hello(nonce="ab")),
    ("no node", bad_hello(node="")),
    ("short proof", {"type": "proof", "mac": "ab"}),
    ("step text", {"type": "beat", "step": "12"}),
    ("step negative", {"type": "beat", "step": -3}),
    ("age nan", {"type": "beat", "progress_age": float("nan")}),
    ("age text", {"type": "beat", "progress_age": "1"}),
    ("code text", {"type": "exit", "code": "1"}),
    ("signal out of range", {"type": "exit", "code": 137, "signal": 999}),
    ("tail not list", {"type": "exit", "code": 1, "tail": "boom"}),
    ("tail too long", {"type": "exit", "code": 1, "tail": ["x"] * 31}),
    ("tail of numbers", {"type": "exit", "code": 1, "tail": [1, 2]}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "message"), BAD_MESSAGES, ids=[c for c, _ in BAD_MESSAGES])
def test_malformed_and_hostile_messages_are_named_and_dropped(case, message):
    assert problem(message) is not None, case


def problem(message: object) -> str | None:
    try:
        messages.parse_line(json.dumps(message).encode())
    except messages.BadMessage as error:
        return str(error)
    return None


def test_well_formed_messages_pass():
    assert problem({"type": "beat", "step": None, "progress_age": 0.5}) is None
    assert problem({"type": "exit", "code": 0, "signal": None, "tail": [], "stop_reason": None}) is None


def test_hostile_messages_after_the_handshake_never_kill_the_server(server):
    channel = join(server)
    assert next_event(server).kind is EventKind.HELLO
    for _, message in BAD_MESSAGES:
        if isinstance(message, dict):
            channel.send(message)  # sealed: an agent holding the key, sending nonsense
        channel._sock.sendall((json.dumps(message) + "\n").encode())  # and unsealed, as from the path
    channel.send({"type": "beat", "step": 3, "progress_age": 0.0})
    time.sleep(0.3)
    assert [a.step for a in server.agents()] == [3]
    assert join(server, rank=1) is not None  # the server still admits agents
