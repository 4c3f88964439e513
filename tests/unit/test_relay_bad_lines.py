"""One bad line never silences a node: a real ControlServer and a real node relay, in this process.

The relay's threads run as `Relay.run` starts them (its link from the master, its Unix socket, its
once-a-second summary); its agents are plain Channels on that socket. A line one agent (or its
rank's progress file) gets wrong costs that line, logged with the rank; the node's other ranks, its
relay and its one connection to the master go on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from gaudi_cluster.rank import agent_beat, jobdir
from gaudi_cluster.rank.relay import Relay, listen
from gaudi_cluster.supervise.control import ControlEvent, ControlServer, EventKind
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Unsendable, encode
from gaudi_cluster.wire.private_payload import PrivatePayload

JOB, NODE, HOST = "20261203-000000-badline", "node-a", "node-a"


@dataclass
class Node:
    server: ControlServer
    relay: Relay
    job_dir: Path
    threads: list[threading.Thread]

    def agent(self, rank: int) -> Channel:
        """A rank's agent on the relay's socket, seated by the master."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(jobdir.relay_socket_path(self.job_dir))
        channel = Channel(sock)
        channel.settimeout(10)
        channel.send(messages.Join(HOST, rank, 1000 + rank, NODE, rank))
        assert channel.receive(messages.FROM_MASTER) == messages.Seated(rank)
        return channel

    def events(self, count: int, timeout_s: float = 5.0) -> list[ControlEvent]:
        found, deadline = [], time.monotonic() + timeout_s
        while len(found) < count and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                found.append(self.server.events.get(timeout=0.1))
        return found

    def step_of(self, rank: int) -> int | None:
        return next((a.step for a in self.server.agents() if a.rank == rank), None)


@pytest.fixture
def node(tmp_path, capsys):
    secret = protocol.new_token()
    jobdir.stage(tmp_path, JOB, PrivatePayload(node=NODE, token=protocol.node_key(secret, NODE)))
    server = ControlServer("127.0.0.1", 0, JOB, 30.0, secret, {0: HOST, 1: HOST}, nodes={0: NODE, 1: NODE})
    server.start()
    relay = Relay(JOB, tmp_path / JOB, f"127.0.0.1:{server.port}", 30.0)
    relay.host = HOST
    relay.connect(10)
    listener = listen(relay.job_dir)
    threads = [
        threading.Thread(target=work, args=args, daemon=True)
        for work, args in ((relay.from_master, ()), (relay.accept, (listener,)), (relay.tick, ()))
    ]
    for thread in threads:
        thread.start()
    yield Node(server, relay, relay.job_dir, threads)
    relay.done.set()
    listener.close()
    server.close()
    if relay.master is not None:
        relay.master.close()


def until(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def assert_the_node_goes_on(node: Node, survivor: Channel, rank: int) -> None:
    """The relay and its connection live: another rank's beat still reaches the master, and no rank
    was lost."""
    assert not node.relay.done.is_set()
    assert all(thread.is_alive() for thread in node.threads)
    survivor.send(messages.Beat(step=41, progress_age=0.0))
    assert until(lambda: node.step_of(rank) == 41), node.server.agents()
    assert [e for e in node.events(1, 0.5) if e.kind is EventKind.LOST] == []
    assert len(node.server._relays) == 1


def test_each_agents_bad_lines_are_logged_with_its_rank_however_many_another_sent(node, capsys):
    first, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    for _ in range(10):
        first._sock.sendall(b"not json\n")
    second._sock.sendall(b'{"type":"launch"}\n')
    second.send(messages.Beat(step=2, progress_age=0.0))
    assert until(lambda: node.step_of(1) == 2)
    out = capsys.readouterr().out
    assert "dropped a line from an agent (rank 1: unknown message type 'launch')" in out
    assert out.count("dropped a line from an agent (rank 0: not JSON)") <= 3  # a flood stays short
    assert_the_node_goes_on(node, second, 1)


def test_an_over_long_line_closes_that_agents_link_alone_and_says_so(node, capsys):
    first, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    first._sock.sendall(b"x" * (protocol.MAX_LINE + 10) + b"\n")
    (lost,) = node.events(1)
    assert (lost.kind, lost.rank) == (EventKind.LOST, 0)
    assert f"a line over {protocol.MAX_LINE} bytes" in lost.reason
    said = capsys.readouterr().out
    assert f"closed the link of rank 0's agent: a line over {protocol.MAX_LINE} bytes" in said
    assert_the_node_goes_on(node, second, 1)


def test_a_master_line_that_ends_the_session_is_said_and_cuts_every_agent(node, capsys):
    """An over-long line on the master's link cannot be authentic: the session ends, as before, but
    the relay says why and cuts its agents (which stop their ranks) instead of ending unheard."""
    first, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    node.server._relays[NODE].sock.sendall(b"x" * (protocol.MAX_LINE + 10) + b"\n")  # from the path
    assert until(node.relay.done.is_set)
    assert first.receive(messages.FROM_MASTER) is None and second.receive(messages.FROM_MASTER) is None
    out = capsys.readouterr().out
    assert f"the master's link ended (a line over {protocol.MAX_LINE} bytes)" in out


def test_an_unsealed_line_from_the_path_is_ignored_and_the_session_goes_on(node, capsys):
    first = node.agent(0)
    assert len(node.events(1)) == 1
    node.server._relays[NODE].sock.sendall(b'{"type":"stop","grace":0}\n')
    node.server.stop_all(5.0)  # the master's own, sealed
    assert first.receive(messages.FROM_MASTER) == messages.Stop(5.0)
    assert "ignored a control message (without the session's MAC" in capsys.readouterr().out


def test_a_work_step_past_64_bits_from_a_progress_file_spares_the_node(node, capsys):
    """Before: the relay took it, and its summary's work bucket broke the master's history
    (OverflowError): the master cut the node's connection."""
    first, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    first.send(messages.Beat(step=3, progress_age=0.0, work=((2**63, 0.5),)))
    time.sleep(protocol.beat_every(30.0) + 0.5)  # a summary (with its work, at once the first time) went out
    assert_the_node_goes_on(node, second, 1)
    assert "dropped a line from an agent (rank 0: work" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"beat","progress_age":' + b"9" * 400 + b"}",  # an int no float holds
        b'{"type":"beat","step":' + b"9" * 400 + b"}",
        b'{"type":"beat","work":[[1,' + b"9" * 400 + b"]]}",
    ],
)
def test_a_number_too_big_for_the_wire_is_one_dropped_line(node, capsys, line):
    """Before: parsing it raised OverflowError (not BadMessage) out of the relay's reader, or passed
    a number the master cannot hold: the agent's link was closed and its rank stopped."""
    first, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    first._sock.sendall(line + b"\n")
    first.send(messages.Beat(step=7, progress_age=0.0))
    assert until(lambda: node.step_of(0) == 7)
    assert not first.closed
    assert_the_node_goes_on(node, second, 1)
    assert "dropped a line from an agent (rank 0: " in capsys.readouterr().out


def test_an_agent_sends_no_number_its_relay_would_drop():
    now = 1000.0
    for progress in (
        {"step": 2**63, "t": now},
        {"step": 1, "t": -1e308},
        {"step": 1, "t": now, "work": [[2**63, 1.0], [1, 1e12], [1, 0.5]], "max_steps": 2**64},
    ):
        beat, _ = agent_beat.beat(progress, -1, 0.0, now, None)
        line = encode(messages.render(beat))
        assert messages.parse_line(line, messages.FROM_AGENT) == beat
    assert beat.work == ((1, 0.5),) and beat.max_steps is None


def a_full_exit(size: int) -> messages.Exit:
    """An exit whose line is `size` bytes: what a rank whose last lines are long and not ASCII
    (each character escaped to six bytes) leaves its agent to send."""
    tail = ["é" * 1000] * 10
    exit_ = messages.Exit(1, tail=(*tail, ""))
    short = len(encode(messages.render(exit_)))
    last = "x" * (size - short)
    return messages.Exit(1, tail=(*tail, last))


def test_an_exit_that_fits_the_agents_line_but_not_the_sealed_one_still_spares_the_node(node):
    """Before: the relay forwarded it with its rank, seq and MAC, over MAX_LINE; the master cut the
    node's one connection, and every rank of the node was lost and stopped."""
    first, second = node.agent(0), node.agent(1)
    assert sorted(e.rank for e in node.events(2)) == [0, 1]
    exit_ = a_full_exit(protocol.MAX_LINE - 10)
    assert len(encode(messages.render(exit_))) == protocol.MAX_LINE - 10
    first.send(exit_)
    (event,) = node.events(1)
    assert (event.kind, event.rank, event.code) == (EventKind.EXIT, 0, 1)
    assert event.tail[-1] == exit_.tail[-1][: protocol.TAIL_MAX_CHARS]  # the newest lines are kept
    assert_the_node_goes_on(node, second, 1)


def test_a_message_no_line_holds_is_refused_before_its_seal_and_the_session_stays_in_order():
    """Before: it went out over MAX_LINE (its reader then cut the connection); skipped after its seal,
    every later line would be out of order."""
    key = protocol.new_token()
    mine, theirs = socket.socketpair()
    sender, reader = Channel(mine), Channel(theirs)
    sender.session, reader.session = protocol.Session(key, "agent"), protocol.Session(key, "master")
    reader.settimeout(5)
    steady = (messages.Beat(rank=0, last_line="é" * 160),)
    summary = messages.Summary((0,), (1,), (0.0,), (None,), steady=steady)
    assert len(encode(messages.render(summary))) < protocol.MAX_SEALED_BODY  # this one fits
    too_long = messages.Exit(1, tail=("é" * 20000,))
    with pytest.raises(Unsendable, match="over the"):
        sender.send(too_long)
    with pytest.raises(Unsendable, match="number JSON has not"):
        sender.send(messages.Beat(progress_age=float("inf")))
    sender.send(summary)
    assert reader.receive(messages.FROM_RELAY_SESSION) == summary  # sequence 1: nothing was skipped


def test_an_exit_keeps_its_newest_lines_that_fit():
    tail = tuple(f"{i:02d}" + "é" * 3000 for i in range(30))
    fitted = messages.fitted_exit(messages.Exit(3, 9, tail, "stop", rank=2), protocol.MAX_SEALED_BODY)
    assert len(encode(messages.render(fitted))) - 1 <= protocol.MAX_SEALED_BODY
    assert (fitted.code, fitted.signal, fitted.stop_reason, fitted.rank) == (3, 9, "stop", 2)
    assert fitted.tail and fitted.tail[-1] == tail[-1][: protocol.TAIL_MAX_CHARS]
    assert [line[:2] for line in fitted.tail] == [f"{i:02d}" for i in range(30 - len(fitted.tail), 30)]
    short = messages.Exit(0, tail=("bye",))
    assert messages.fitted_exit(short, protocol.MAX_SEALED_BODY) == short


def test_a_message_the_master_fails_to_apply_costs_the_line_not_the_node(node, monkeypatch, caplog):
    """Whatever one of a relay's lines breaks in the master's bookkeeping, the node's connection (and
    its other ranks) stay: the line is dropped and logged with the node."""
    caplog.set_level(logging.WARNING, "gaudi_cluster.supervise.control")
    _, second = node.agent(0), node.agent(1)
    assert len(node.events(2)) == 2
    real = node.server.ranks.heard_summary
    failed: list[int] = []

    def once(*args: object) -> None:
        if not failed:
            failed.append(1)
            raise OverflowError("a bug")
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(node.server.ranks, "heard_summary", once)
    assert until(lambda: failed)
    assert_the_node_goes_on(node, second, 1)
    logged = [r.getMessage() for r in caplog.records]
    assert any("relay of node node-a" in m and "OverflowError" in m for m in logged), logged
