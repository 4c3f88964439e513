"""A node relay's end must not reset its connection to the master.

Seen at 64 Slurm nodes (1 job in about 10): a node's stub rank exited, its relay sent the exit and its
node process ended while a line of the master's was still unread. A TCP socket closed with bytes
unread sends a reset instead of a FIN, and a reset throws away what the closing side had not yet
delivered: the master saw "connection closed (broken)" and reported the rank lost, not exited.
"""

from __future__ import annotations

import socket
import threading
import time

from gaudi_cluster.rank.relay import Relay
from gaudi_cluster.wire.channel import Channel

LINES, LINE = 8, b"x" * 50_000


def test_a_relay_ends_with_everything_delivered_even_with_the_masters_line_unread(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a master slow to read: its window fills
    ours = socket.create_connection(listener.getsockname())
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    master, _ = listener.accept()
    relay = Relay("20261207-000000-close0", tmp_path, "unused:0", 30.0)
    relay.master = Channel(ours)

    # The relay's reader is slow to come back for the master's next line (a starved node): the
    # second line stays unread in the socket while the relay ends.
    reading = threading.Event()

    def slow_handler(message: object) -> None:
        reading.set()
        time.sleep(0.5)

    relay._from_master = slow_handler  # type: ignore[method-assign]
    serving = threading.Thread(target=relay.serve, args=(False,), daemon=True)
    serving.start()
    assert relay.listening.wait(5)
    master.sendall(b'{"type":"beat"}\n')
    assert reading.wait(5)
    master.sendall(b'{"type":"beat"}\n')  # unread: the reader is still busy with the first
    for _ in range(LINES):  # the node's last lines, most of them still queued on the relay's side
        ours.sendall(LINE + b"\n")
    heard: list[bytes | Exception] = []

    def master_reads() -> None:  # busy for a moment, then everything until the end or an error
        time.sleep(0.3)
        try:
            while chunk := master.recv(65536):
                heard.append(chunk)
        except OSError as error:  # a reset: ConnectionResetError
            heard.append(error)
        master.close()

    reads = threading.Thread(target=master_reads, daemon=True)
    reads.start()
    relay.end("the test ends it")
    serving.join(10)
    assert not serving.is_alive()
    relay.master._reader.close()  # what the node process's exit does to the socket right after
    reads.join(10)
    errors = [item for item in heard if isinstance(item, Exception)]
    assert not errors, f"the master's side was reset: {errors}"
    lines = b"".join(item for item in heard if isinstance(item, bytes)).splitlines()
    # Every line arrived whole, the relay's last word last (the node is clean: no rank, no pid file).
    assert lines[:LINES] == [LINE] * LINES and b'"reaped"' in lines[-1]
    listener.close()
