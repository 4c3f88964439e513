"""A swarm: one process playing N nodes x R rank agents against a master's control port.

Every simulated peer speaks the real protocol (`gaudi_cluster.wire.protocol`): the challenge, a
hello naming its node and host, the master's welcome checked against its node's key, the proof,
then sealed messages. With --relays (what the agents do since one connection per node) each node
is one peer, its relay: it joins its R ranks, sends once a second the node's `summary` (two steps a
second per rank, each agent's beat recorded into the real `rank.relay_beats.NodeBeats`) and answers
the master's stop with every rank's exit. Without it (what an older master speaks) every rank is a peer
of its own. Node i connects from its own loopback address (127.1.x.y), so the master's per-address
admission works as on a training network. One thread and a selector: 8,000 ranks fit one core,
where 8,000 agent processes would not fit the machine.

  SWARM_SECRET=<attempt secret> python -m gaudi_cluster_dev.swarm --port P --job J --nodes N [--relays]

Lines on stdin steer it: `reset I` (node I's connections reset, as when it crashes), `silence I`
(node I stops beating, as when it freezes), `exit` (every rank exits 0), `quit`. It says what
happened as JSON lines on stdout (`started`, `welcomed`, `stopped`, `reset`, `silenced`, `report`)
with CLOCK_MONOTONIC times, comparable with the master's on the same host; --report FILE gets the
final counts too.

--work sets the ranks' work per step: `healthy` (the default: a real job's spread, lognormal around
0.4 s, and a few per mille of ranks 1.6x slow, each a straggler the master names) or `stragglers`
(0.4 + 1e-4 x rank s: every rank past the first fifth more than 1.3x the median, a load no real job
has, for the master's straggler path at its worst).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.rank import agent_beat
from gaudi_cluster.rank.relay_beats import NodeBeats
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import LineBuffer, encode

from gaudi_cluster_dev.swarm_plan import SwarmPlan

RETRY_S = 0.5  # as the real agent: a refused or cut handshake is tried again after this
WORK_S = 0.4  # a rank's typical work per step
SPREAD = 0.05  # sigma of the lognormal spread, rank to rank and step to step
SLOW_SHARE = 0.003  # healthy: ranks 1.6x slow (a few per mille, as a worn device or a hot card)
SLOW_FACTOR = 1.6


class WorkTimes:
    """Each rank's seconds of work per step (seeded: one run's ranks are the next run's)."""

    def __init__(self, kind: str, ranks: int, seed: int = 33) -> None:
        self.kind, self.rng = kind, random.Random(seed)
        self.speed = [WORK_S * self.rng.lognormvariate(0.0, SPREAD) for _ in range(ranks)]
        for rank in self.rng.sample(range(ranks), math.ceil(SLOW_SHARE * ranks) if ranks >= 100 else 0):
            self.speed[rank] *= SLOW_FACTOR
        self.slow = sorted(r for r in range(ranks) if self.speed[r] > WORK_S * (SLOW_FACTOR - 0.2))

    def seconds(self, rank: int) -> float:
        if self.kind == "stragglers":
            return 0.4 + 0.0001 * rank
        return round(self.speed[rank] * self.rng.lognormvariate(0.0, SPREAD), 4)


_OVER = ("done", "reset")


@dataclass
class Counts:
    welcomed: int = 0  # ranks seated (their own handshake done, or their relay's and their join)
    handshake_failures: int = 0  # refused, cut or unproven handshakes (each retried)
    stops: int = 0  # ranks the master's sealed stop reached
    beats_sent: int = 0
    beats_received: int = 0
    dropped: int = 0  # master messages that failed their session check
    reset: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0


class Rank:
    """One connection: a rank's own, or (ranks of a whole node, rank NODE_RANK) its node relay's."""

    def __init__(self, number: int, node: int, ranks: list[int], local: int = 0, relay: bool = False) -> None:
        self.number, self.node, self.ranks, self.local, self.relay = number, node, ranks, local, relay
        self.rank = protocol.NODE_RANK if relay else ranks[0]
        self.sock: socket.socket | None = None
        self.lines = LineBuffer()
        self.state = "idle"  # connecting, welcome, joining (a relay), running, done
        self.master_nonce = self.nonce = ""
        self.session: protocol.Session | None = None
        self.step = self.sent_upto = self.seated = 0
        self.silent = False
        self.beats = NodeBeats()  # a relay's: what its node's summary says


class Swarm:
    def __init__(
        self, plan: SwarmPlan, port: int, job: str, secret: str, out: Any = sys.stdout, relays: bool = False,
        work: str = "healthy", heartbeat_timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.plan, self.port, self.job, self.out = plan, port, job, out
        # A relay's summary comes every few seconds, as the real relay's does; a rank on its own beats
        # every second, as an agent does.
        self.every = protocol.beat_every(heartbeat_timeout_s) if relays else 1
        self.work = WorkTimes(work, plan.ranks)
        self.keys = [protocol.node_key(secret, plan.node(i)) for i in range(plan.nodes)]
        per = plan.per_node
        if relays:
            self.ranks = [
                Rank(n, n, list(range(n * per, (n + 1) * per)), relay=True) for n in range(plan.nodes)
            ]
        else:
            self.ranks = [Rank(r, r // per, [r], r % per) for r in range(plan.ranks)]
        self.selector = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, str]] = []  # (when, rank, what): beats and retries
        self.counts = Counts()
        self.told_all = self.welcomed_all = False
        self.quitting = False  # SIGTERM: end the loop, the report is still written
        self.left = len(
            self.ranks
        )  # connections not yet done (stopped, exited, closed by the master) or reset
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
        rank.beats = NodeBeats()  # a new connection: the master knows nothing of it yet
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
        heapq.heappush(self.timers, (time.monotonic() + RETRY_S, rank.number, "connect"))

    def send(self, rank: Rank, message: messages.Message | dict[str, Any]) -> None:
        assert rank.sock is not None
        fields = message if isinstance(message, dict) else messages.render(message)
        line = rank.session.seal(fields) if rank.session is not None else encode(fields)
        with contextlib.suppress(OSError):  # a line of < 1 KB: the socket buffer takes it
            rank.sock.send(line)

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
            self.receive(rank, line)
            if rank.sock is None:
                return

    def receive(self, rank: Rank, line: bytes) -> None:
        try:
            body = rank.session.open(line) if rank.session is not None else line
            allowed = (
                (messages.TO_RELAY if rank.relay else messages.FROM_MASTER)
                if rank.session is not None
                else messages.FROM_MASTER_HANDSHAKE
            )
            message: messages.Message | None = messages.parse_line(body, allowed)
        except (protocol.Unsealed, messages.BadMessage):
            message = None
        key, node, host = self.keys[rank.node], self.plan.node(rank.node), self.plan.host(rank.node)
        job = self.job
        transcript = lambda: protocol.Transcript(rank.master_nonce, rank.nonce, job, node, host, rank.rank)  # noqa: E731
        if rank.state == "connecting":
            if not isinstance(message, messages.Challenge):
                self.failed(rank)
                return
            rank.master_nonce, rank.nonce, rank.state = message.nonce, protocol.new_nonce(), "welcome"
            hello = {"type": "hello", "job": self.job, "node": node, "host": host, "rank": rank.rank,
                     "local_rank": rank.local, "pid": os.getpid(), "nonce": rank.nonce}  # fmt: skip
            self.send(rank, {**hello, "role": "node"} if rank.relay else hello)
        elif rank.state == "welcome":
            if not isinstance(message, messages.Welcome) or not protocol.same_mac(
                protocol.welcome_mac(key, transcript()), message.mac
            ):
                self.failed(rank)
                return
            self.send(rank, {"type": "proof", "mac": protocol.proof_mac(key, transcript())})
            rank.session = protocol.Session(
                protocol.session_key(key, rank.master_nonce, rank.nonce, self.job, rank.rank), "agent"
            )
            if rank.relay:
                rank.state, rank.seated = "joining", 0
                for number in rank.ranks:
                    self.send(rank, {"type": "join", "rank": number, "host": host, "node": node,
                                     "pid": os.getpid(), "local_rank": number - rank.ranks[0]})  # fmt: skip
            else:
                self.running(rank, 1)
        elif message is None:
            self.counts.dropped += 1
        elif isinstance(message, messages.Seated):
            rank.seated += 1
            if rank.seated == len(rank.ranks):
                self.running(rank, rank.seated)
        elif isinstance(message, messages.Refused):
            self.failed(rank)
        elif isinstance(message, messages.Stop):
            self.counts.stops += len(rank.ranks)
            self.last_stop = time.monotonic()
            self.first_stop = self.first_stop or self.last_stop
            self.exit(rank, {"code": 143, "signal": 15, "tail": [], "stop_reason": "stopped"})
        elif isinstance(message, messages.Unstage):
            pass  # a swarm node has no private file to remove
        else:
            self.counts.beats_received += 1

    def running(self, rank: Rank, seated: int) -> None:
        rank.state = "running"
        self.counts.welcomed += seated
        heapq.heappush(self.timers, (time.monotonic() + self.every, rank.number, "beat"))
        if self.counts.welcomed == self.plan.ranks and not self.welcomed_all:
            self.welcomed_all = True
            self.say("welcomed", ranks=self.counts.welcomed)

    def exit(self, rank: Rank, how: dict[str, Any]) -> None:
        for number in rank.ranks:
            self.send(rank, {"type": "exit", **how, **({"rank": number} if rank.relay else {})})
        if rank.relay and how.get("stop_reason"):  # a relay's last word after the stop, as rank/relay's
            self.send(rank, {"type": "reaped", "killed": 0})
        self.drop(rank, "done")

    def beat(self, rank: Rank, now: float) -> None:
        if rank.state != "running":
            return
        if not rank.silent:
            steps = range(rank.step + 1, rank.step + 1 + 2 * self.every)  # two steps a second
            rank.step = steps[-1]
            entries = []
            for number in rank.ranks:
                work = [[s, self.work.seconds(number)] for s in steps]
                progress = {"step": rank.step, "t": time.time(), "max_steps": 10**6, "samples_per_step": 64}
                message, _ = agent_beat.beat(
                    {**progress, "work": work}, rank.sent_upto, 0.0, time.time(), "loss"
                )
                entries.append(message)
            rank.sent_upto = rank.step
            if rank.relay:
                for number, message in zip(rank.ranks, entries, strict=True):
                    rank.beats.record(number, message)
                self.send(rank, rank.beats.message(rank.ranks, now))
            else:
                self.send(rank, entries[0])
            self.counts.beats_sent += 1
        heapq.heappush(self.timers, (now + self.every, rank.number, "beat"))

    # --- commands -------------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """False on quit."""
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            return False
        if word in ("reset", "silence"):
            node = int(arg)
            for rank in (peer for peer in self.ranks if peer.node == node):
                if word == "reset" and rank.sock is not None:
                    self.drop(rank, "reset", reset=True)
                    self.counts.reset += len(rank.ranks)
                rank.silent = True
            self.say("reset" if word == "reset" else "silenced", node=node, host=self.plan.host(node))
        elif word == "exit":
            for rank in self.ranks:
                if rank.state == "running":
                    self.exit(rank, {"code": 0, "signal": None, "tail": [], "stop_reason": None})
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
    parser.add_argument("--relays", action="store_true", help="one connection per node, as the node relay")
    parser.add_argument("--work", choices=("healthy", "stragglers"), default="healthy", help="work per step")
    parser.add_argument(
        "--heartbeat-timeout", type=float, default=10.0, help="the master's: sets the beats' pace"
    )
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    plan, secret = SwarmPlan(args.nodes, args.per_node), os.environ["SWARM_SECRET"]
    swarm = Swarm(
        plan,
        args.port,
        args.job,
        secret,
        relays=args.relays,
        work=args.work,
        heartbeat_timeout_s=args.heartbeat_timeout,
    )
    swarm.say("slow_ranks", ranks=swarm.work.slow if args.work == "healthy" else [])
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
