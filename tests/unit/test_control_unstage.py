"""The master's unstage to the node relays when one relay's connection breaks as it is sent to.

Seen at 64 Slurm nodes (two jobs in 24): the stub ranks had already exited, a node's relay closed its
connection, and the write of `unstage` to it failed; the failed write forgets that relay, and the
loop that was sending to every relay then broke on the changed dict and took the control channel
(and the job) down with it.
"""

from __future__ import annotations

import socket

import pytest
from gaudi_cluster.supervise.control import ControlServer, _Agent
from gaudi_cluster.wire import protocol


@pytest.fixture
def server():
    made = ControlServer(
        "127.0.0.1", 0, "20261207-000000-unstg0", 30.0, protocol.new_token(), {0: "a", 1: "b"}
    )
    made.call = lambda work: work()  # the loop's thread, run here and now
    sockets: list[socket.socket] = []

    def relay(node: str, broken: bool) -> None:
        ours, theirs = socket.socketpair()
        sockets.extend((ours, theirs))
        if broken:
            ours.shutdown(socket.SHUT_WR)  # its next write fails (EPIPE), as to a relay gone
        conn = _Agent(ours, f"peer-{node}", None, 0.0)  # type: ignore[arg-type]
        conn.handshake, conn.node = None, node
        made._relays[node] = conn
        made._sessions.add(conn)

    yield made, relay
    made.close()
    for sock in sockets:
        sock.close()


def test_a_relay_whose_write_fails_is_not_told_and_the_others_are(server):
    made, relay = server
    relay("node-a", broken=False)
    relay("node-b", broken=True)
    relay("node-c", broken=False)
    assert made.unstage_on_relays(1.0) == {"node-a", "node-c"}
    assert sorted(made._relays) == ["node-a", "node-c"]  # the broken one is forgotten, its node the master's
