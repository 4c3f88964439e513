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
    from gaudi_cluster.wire import protocol
    from gaudi_cluster.wire.channel import Identity, authenticate, connect

    channels = []
    started = time.perf_counter()
    for rank in range(ranks):
        channel = connect(f"127.0.0.1:{server.port}", 5)
        key = protocol.node_key(token, "bench-host")
        authenticate(channel, Identity(key, "bench-host", server.job_id, "bench-host", rank, 1))
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
    return run_handshake(ctx) + run_view(ctx)


def run_handshake(ctx: Ctx) -> list[Row]:
    import logging

    from gaudi_cluster.supervise.control import ControlServer
    from gaudi_cluster.wire import protocol

    logging.getLogger("gaudi_cluster.supervise.control").setLevel(logging.ERROR)
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
            f"Control channel handshake per rank ({ranks} agents, loopback, node keys, mutual proof, sealed)",
            "ms",
            stat(ours),
            stat(theirs),
            "unauthenticated hello (previous protocol)",
            Target("ours", "<=", 10.0, "≤ 10 ms per rank"),
        )
    ]


_AGENTS = """
import json, sys, threading, time
sys.path.insert(0, sys.argv[4])
from gaudi_cluster.rank import agent_beat
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Identity, authenticate, connect
port, token, ranks, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[5])
sizes = []
def agent(rank):
    channel = connect(f"127.0.0.1:{port}", 10)
    key = protocol.node_key(token, "bench-host")
    authenticate(channel, Identity(key, "bench-host", "bench-job", "bench-host", rank, 1, rank % 8))
    sent, step, end = -1, 0, time.time() + seconds
    while time.time() < end:
        step += 2  # two steps a second, each with its work time
        progress = {"step": step, "t": time.time(), "max_steps": 10**6, "samples_per_step": 64,
                    "work": [[s, 0.4 + 0.001 * rank] for s in range(max(0, step - 8), step + 1)]}
        message, sent = agent_beat.beat(progress, sent, 0.0, time.time(), f"step {step} loss 2.31")
        sizes.append(len(json.dumps(messages.render(message))) + 1)
        channel.send(message)
        time.sleep(1.0)
threads = [threading.Thread(target=agent, args=(r,)) for r in range(ranks)]
[t.start() for t in threads]; [t.join() for t in threads]
print("beat-bytes", sorted(sizes)[len(sizes) // 2], max(sizes), flush=True)
"""


def master_cpu(ranks: int = 32, seconds: float = 20.0) -> tuple[float, float, float]:
    """(master CPU % of one core, median and largest beat in bytes) with `ranks` agents beating."""
    import io
    import logging
    import subprocess
    import sys

    from gaudi_cluster.supervise.control import ControlServer
    from gaudi_cluster.view.liveview import LiveView
    from gaudi_cluster.wire import protocol

    from bench.common import APP

    logging.getLogger("gaudi_cluster.supervise.control").setLevel(logging.ERROR)
    token = protocol.new_token()
    server = ControlServer(
        "127.0.0.1", 0, "bench-job", 30.0, token, dict.fromkeys(range(ranks), "bench-host")
    )
    server.start()
    view = LiveView(io.StringIO(), 30.0, time.monotonic, tty=False)
    agents = subprocess.Popen(
        [sys.executable, "-c", _AGENTS, str(server.port), token, str(ranks), str(APP), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # handshakes done; measure the steady state only
    cpu0, wall0 = time.process_time(), time.monotonic()
    while agents.poll() is None:
        view.tick(server.agents())  # what the supervisor does between events
        time.sleep(0.2)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    out = agents.communicate()[0]
    server.close()
    _, median, largest = next(line.split() for line in out.splitlines() if line.startswith("beat-bytes"))
    return cpu / wall * 100, float(median), float(largest)


def run_view(ctx: Ctx) -> list[Row]:
    runs = [master_cpu() for _ in range(2 if not ctx.quick else 1)]
    return [
        Row(
            "control.master_cpu_32",
            "Master CPU with 32 ranks beating (control server + live view), % of one core",
            "%",
            stat([r[0] for r in runs]),
            target=Target("ours", "<=", 2.0, "< 2 % of a core"),
        ),
        Row(
            "control.beat_bytes",
            "Heartbeat size per rank per second (median; largest in details)",
            "bytes",
            stat([r[1] for r in runs]),
            target=Target("ours", "<=", 1024.0, "< 1 KB"),
            details={"largest": [r[2] for r in runs]},
        ),
    ]
