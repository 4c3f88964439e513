"""A swarm: one process playing N nodes x R rank agents against a master's control port.

Every simulated rank speaks the real protocol (`gaudi_cluster.wire.protocol`): the challenge, a
hello naming its node, host and rank, the master's welcome checked against its node's key, the
proof, then sealed beats every second carrying work times (two steps a second), and its exit when
the master's sealed stop arrives. Node i connects from its own loopback address (127.1.x.y), so
the master's per-address admission works as on a training network. One thread and a selector:
8,000 ranks fit one core, where 8,000 agent processes would not fit the machine.

  SWARM_SECRET=<attempt secret> python -m gaudi_cluster_dev.swarm --port P --job J --nodes N

Lines on stdin steer it: `reset I` (node I's connections reset, as when it crashes), `silence I`
(node I stops beating, as when it freezes), `exit` (every rank exits 0), `quit`. It says what
happened as JSON lines on stdout (`started`, `welcomed`, `stopped`, `reset`, `silenced`, `report`)
with CLOCK_MONOTONIC times, comparable with the master's on the same host; --report FILE gets the
final counts too.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.channel import LineBuffer, decode, encode

from gaudi_cluster_dev.swarm_plan import SwarmPlan

RETRY_S = 0.5  # as the real agent: a refused or cut handshake is tried again after this
_OVER = ("done", "reset")


@dataclass
class Counts:
    welcomed: int = 0  # ranks whose handshake completed (the master proved itself, they proved back)
    handshake_failures: int = 0  # refused, cut or unproven handshakes (each retried)
    stops: int = 0  # ranks that received the master's sealed stop
    beats_sent: int = 0
    beats_received: int = 0
    dropped: int = 0  # master messages that failed their session check
    reset: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0


class Rank:
    def __init__(self, rank: int, node: int, local: int) -> None:
        self.rank, self.node, self.local = rank, node, local
        self.sock: socket.socket | None = None
        self.lines = LineBuffer()
        self.state = "idle"  # connecting, welcome, running, done
        self.master_nonce = self.nonce = ""
        self.session: protocol.Session | None = None
        self.step = self.sent_upto = 0
        self.silent = False


class Swarm:
    def __init__(self, plan: SwarmPlan, port: int, job: str, secret: str, out: Any = sys.stdout) -> None:
        self.plan, self.port, self.job, self.out = plan, port, job, out
        self.keys = [protocol.node_key(secret, plan.node(i)) for i in range(plan.nodes)]
        self.ranks = [Rank(r, r // plan.per_node, r % plan.per_node) for r in range(plan.ranks)]
        self.selector = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, str]] = []  # (when, rank, what): beats and retries
        self.counts = Counts()
        self.told_all = self.welcomed_all = False
        self.quitting = False  # SIGTERM: end the loop, the report is still written
        self.left = plan.ranks  # ranks not yet done (stopped, exited, closed by the master) or reset
        self.first_stop = self.last_stop = 0.0

    def say(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"event": event, "at": time.monotonic(), **fields}) + "\n")
        self.out.flush()

    # --- connections ----------------------------------------------------------------------------

    def connect(self, rank: Rank) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.plan.address(rank.node), 0))
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", self.port))
        rank.sock, rank.state, rank.lines, rank.session = sock, "connecting", LineBuffer(), None
        self.selector.register(sock, selectors.EVENT_READ, rank)

    def drop(self, rank: Rank, state: str, reset: bool = False) -> None:
        if rank.sock is not None:
            self.selector.unregister(rank.sock)
            if reset:  # linger 0: the close sends a reset, as a crashed node's kernel would
                rank.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            rank.sock.close()
            rank.sock = None
        if state in _OVER and rank.state not in _OVER:
            self.left -= 1
        rank.state = state

    def failed(self, rank: Rank) -> None:
        self.counts.handshake_failures += 1
        self.drop(rank, "idle")
        heapq.heappush(self.timers, (time.monotonic() + RETRY_S, rank.rank, "connect"))

    def send(self, rank: Rank, message: dict[str, Any]) -> None:
        assert rank.sock is not None
        sealed = rank.session.seal(message) if rank.session is not None else message
        with contextlib.suppress(OSError):  # a line of < 1 KB: the socket buffer takes it
            rank.sock.send(encode(sealed))

    def read(self, rank: Rank) -> None:
        assert rank.sock is not None
        try:
            data = rank.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if rank.state in ("connecting", "welcome"):
                self.failed(rank)
            else:
                self.drop(rank, "done")
            return
        for line in rank.lines.feed(data):
            self.receive(rank, decode(line))
            if rank.sock is None:
                return

    def receive(self, rank: Rank, message: Any) -> None:
        if not isinstance(message, dict):
            message = {}
        names = lambda: (rank.master_nonce, rank.nonce, self.job, self.plan.node(rank.node),  # noqa: E731
                         self.plan.host(rank.node), rank.rank)  # fmt: skip
        key = self.keys[rank.node]
        if rank.state == "connecting":
            if message.get("type") != "challenge":
                self.failed(rank)
                return
            rank.master_nonce, rank.nonce, rank.state = (
                str(message.get("nonce"))[:64],
                protocol.new_nonce(),
                "welcome",
            )
            node, host = self.plan.node(rank.node), self.plan.host(rank.node)
            self.send(rank, {"type": "hello", "job": self.job, "node": node, "host": host, "rank": rank.rank,
                             "local_rank": rank.local, "pid": os.getpid(), "nonce": rank.nonce})  # fmt: skip
        elif rank.state == "welcome":
            if message.get("type") != "welcome" or not protocol.same_mac(
                protocol.welcome_mac(key, *names()), message.get("mac")
            ):
                self.failed(rank)
                return
            self.send(rank, {"type": "proof", "mac": protocol.proof_mac(key, *names())})
            rank.session = protocol.Session(
                protocol.session_key(key, rank.master_nonce, rank.nonce, self.job, rank.rank), "agent"
            )
            rank.state = "running"
            self.counts.welcomed += 1
            heapq.heappush(self.timers, (time.monotonic() + 1.0, rank.rank, "beat"))
            if self.counts.welcomed == self.plan.ranks and not self.welcomed_all:
                self.welcomed_all = True
                self.say("welcomed", ranks=self.counts.welcomed)
        else:
            assert rank.session is not None
            if rank.session.open(message) is not None:
                self.counts.dropped += 1
            elif message.get("type") == "stop":
                self.counts.stops += 1
                self.last_stop = time.monotonic()
                self.first_stop = self.first_stop or self.last_stop
                exit_ = {"type": "exit", "code": 143, "signal": 15, "tail": [], "stop_reason": "stopped"}
                self.send(rank, exit_)
                self.drop(rank, "done")
            else:
                self.counts.beats_received += 1

    def beat(self, rank: Rank, now: float) -> None:
        if rank.state != "running":
            return
        if not rank.silent:
            rank.step += 2  # two steps a second, each with its work time
            work = [[s, 0.4 + 0.0001 * rank.rank] for s in (rank.step - 1, rank.step)]
            progress = {"step": rank.step, "t": time.time(), "max_steps": 10**6, "samples_per_step": 64}
            progress["work"] = work
            message, rank.sent_upto = protocol.beat(progress, rank.sent_upto, 0.0, time.time(), "loss 2.31")
            self.send(rank, message)
            self.counts.beats_sent += 1
        heapq.heappush(self.timers, (now + 1.0, rank.rank, "beat"))

    # --- commands -------------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """False on quit."""
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            return False
        if word in ("reset", "silence"):
            node = int(arg)
            for rank in self.ranks[node * self.plan.per_node : (node + 1) * self.plan.per_node]:
                if word == "reset" and rank.sock is not None:
                    self.drop(rank, "reset", reset=True)
                    self.counts.reset += 1
                rank.silent = True
            self.say("reset" if word == "reset" else "silenced", node=node, host=self.plan.host(node))
        elif word == "exit":
            for rank in self.ranks:
                if rank.state == "running":
                    self.send(
                        rank, {"type": "exit", "code": 0, "signal": None, "tail": [], "stop_reason": None}
                    )
                    self.drop(rank, "done")
        return True

    # --- the loop -------------------------------------------------------------------------------

    def run(self, deadline_s: float, stdin: Any = None) -> Counts:
        cpu0, wall0 = time.process_time(), time.monotonic()
        end = wall0 + deadline_s
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)
            self.selector.register(stdin, selectors.EVENT_READ, "stdin")
        for rank in self.ranks:
            self.connect(rank)
        self.say("started", ranks=self.plan.ranks)
        pending, going = "", True
        while going and self.left and not self.quitting and time.monotonic() < end:
            wait = 0.1 if not self.timers else min(0.1, max(0.0, self.timers[0][0] - time.monotonic()))
            for key, _ in self.selector.select(wait):
                if key.data == "stdin":
                    chunk = os.read(stdin.fileno(), 4096).decode()
                    if not chunk:
                        self.selector.unregister(stdin)  # no one steers: the master's stop ends it
                        continue
                    *lines, pending = (pending + chunk).split("\n")
                    going = all(self.command(line) for line in lines) and going
                elif key.data.sock is not None:
                    self.read(key.data)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, number, what = heapq.heappop(self.timers)
                rank = self.ranks[number]
                if what == "beat":
                    self.beat(rank, now)
                elif rank.state == "idle":
                    self.connect(rank)
            self.stopped_all()
        self.counts.cpu_s, self.counts.wall_s = time.process_time() - cpu0, time.monotonic() - wall0
        for rank in self.ranks:
            self.drop(rank, rank.state)
        return self.counts

    def stopped_all(self) -> None:
        told = self.counts.stops
        if told and not self.told_all and told + self.counts.reset >= self.counts.welcomed:
            self.told_all = True
            self.say("stopped", ranks=told, first=self.first_stop, last=self.last_stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster_dev.swarm", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds before it gives up")
    parser.add_argument("--report", type=Path, help="where the final counts go (JSON)")
    parser.add_argument("--cpu", type=int, help="pin to this core")
    parser.add_argument("--steer", action="store_true", help="take commands on stdin")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    swarm = Swarm(SwarmPlan(args.nodes, args.per_node), args.port, args.job, os.environ["SWARM_SECRET"])
    signal.signal(signal.SIGTERM, lambda *_: setattr(swarm, "quitting", True))
    try:
        swarm.run(args.deadline, sys.stdin if args.steer else None)
    finally:
        report = asdict(swarm.counts)
        swarm.say("report", **report)
        if args.report is not None:
            args.report.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
