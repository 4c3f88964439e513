"""The control channel's authenticated handshake at start-up, in-process on loopback.

Each agent connects and proves it holds the job's secret (challenge, HMAC hello, HMAC welcome)
before the master accepts anything from it. Measured per rank, against the unauthenticated hello
of the previous protocol (connect + one line), on the same machine, interleaved.
"""

from __future__ import annotations

import json
import socket
import time

from bench.common import Ctx, Row, Target, stat


def _authenticated(server, token: str, ranks: int) -> float:
    from gaudi_cluster.channel import authenticate, connect

    channels = []
    started = time.perf_counter()
    for rank in range(ranks):
        channel = connect(f"127.0.0.1:{server.port}", 5)
        authenticate(channel, token, server.job_id, "bench-host", rank, 1)
        channels.append(channel)
    elapsed = time.perf_counter() - started
    for channel in channels:
        channel.close()
    return elapsed


def _plain(listener: socket.socket, ranks: int) -> float:
    """connect + one hello line + the server reading it (what the old protocol did before trusting)."""
    started = time.perf_counter()
    clients = []
    for rank in range(ranks):
        client = socket.create_connection(listener.getsockname(), timeout=5)
        client.sendall(
            (json.dumps({"type": "hello", "job": "j", "host": "bench-host", "rank": rank}) + "\n").encode()
        )
        conn, _ = listener.accept()
        conn.makefile("rb").readline()
        clients += [client, conn]
    elapsed = time.perf_counter() - started
    for sock in clients:
        sock.close()
    return elapsed


def run(ctx: Ctx) -> list[Row]:
    import logging

    from gaudi_cluster import protocol
    from gaudi_cluster.control import ControlServer

    logging.getLogger("gaudi_cluster.control").setLevel(logging.ERROR)
    ranks, rounds = 32, (10 if not ctx.quick else 3)
    ours, theirs = [], []
    listener = socket.create_server(("127.0.0.1", 0))
    for _ in range(rounds):
        token = protocol.new_token()
        server = ControlServer(
            "127.0.0.1", 0, "bench-job", 10.0, token, dict.fromkeys(range(ranks), "bench-host")
        )
        server.start()
        try:
            ours.append(_authenticated(server, token, ranks) / ranks * 1000)
        finally:
            server.close()
        theirs.append(_plain(listener, ranks) / ranks * 1000)
    listener.close()
    return [
        Row(
            "control.handshake",
            f"Control channel handshake per rank ({ranks} agents, loopback, authenticated HMAC challenge)",
            "ms",
            stat(ours),
            stat(theirs),
            "unauthenticated hello (previous protocol)",
            Target("ours", "<=", 10.0, "≤ 10 ms per rank"),
        )
    ]
