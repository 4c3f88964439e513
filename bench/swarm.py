"""The control plane at 64, 256 and 1,000 nodes x 8 ranks: the master's ControlServer + Supervisor in
one process pinned to core 0, a swarm (`gaudi_cluster_dev.swarm`, every rank on the real protocol)
in another pinned to core 1; threads, descriptors, memory and CPU read from /proc.

Two runs per size, each against this tree's server and the old one (SWARM_OLD_APP, default
/tmp/old-control/app: `git worktree add /tmp/old-control 96699ce`), interleaved: the first resets
one node's connections after a steady window (CPU over STEADY_S), the second makes a node silent.
The ranks are healthy (`swarm --work healthy`: a lognormal spread, a few per mille slow); at the
largest size one more reset run has the straggler scenario (`--work stragglers`: a fifth of the
ranks past 1.3x the median), its CPU its own row (swarm.master_cpu_pct_stragglers).

  python -m bench --only swarm
  python -m bench.swarm master ...   (the master's side of one run; the bench starts it)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import swarm_fanout
from bench.common import ROOT, Ctx, Row, log
from bench.swarm_plot import keep_earlier, plot_rows
from bench.swarm_rows import build
from bench.swarm_soak import SOAK_S, BeatSampler

JOB = "20261202-000000-swarm0"
SIZES = (64, 256, 1000)
ONLY = tuple(int(n) for n in os.environ.get("SWARM_SIZES", "").split(",") if n)  # a rerun of some sizes
PER_NODE = 8
HEARTBEAT_S = 10.0  # the default --heartbeat-timeout
STEADY_S = 20.0
ALL_PARTS = ("fanout", "scenarios", "checkins", "soak")  # SWARM_PARTS: a rerun of some of them
PARTS = {part for part in os.environ.get("SWARM_PARTS", ",".join(ALL_PARTS)).split(",") if part}
CHECKINS = int(os.environ.get("SWARM_CHECKINS", "10"))  # check-in-only runs at the largest size
CHECKIN_CAP_S = 90.0  # the old server at 8,000 ranks would need minutes: capped, and said so
# The bench's share: the scenario runs (480 s), the fan-out (~90 s), the check-in-only runs (~25 s each
# at 1,000 nodes) and the two soaks with their check-ins.
SHORT_SOAK_S = min(SOAK_S, 120.0)  # the soak again without jobview's straggler check: its share of the ages
BUDGET_S = 480 + 90 + 25 * CHECKINS + SOAK_S + SHORT_SOAK_S + 90
VICTIM = 7  # the node reset or silenced
DEV = ROOT / "dev"
NEW_APP = ROOT / "app"
OLD_APP = Path(os.environ.get("SWARM_OLD_APP", "/tmp/old-control/app"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
RESULTS = Path(__file__).resolve().parent / "results"


# --- the master's side (a process of its own, with the app under test first on its path) ---------


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "at": time.monotonic(), **fields}), flush=True)


class _Console:
    """The supervisor's console: says when the first line naming a lost host came."""

    def __init__(self) -> None:
        self.named = False

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def write(self, text: str) -> int:
        if not self.named and "lost contact" in text:
            self.named = True
            say("named", line=text.strip()[:300])
        return len(text)


def master(nodes: int, cpu: int, start_timeout: float, straggler_check: bool, soak: bool = False) -> int:
    import logging
    import resource

    from gaudi_cluster.launch.plan import LaunchPlan
    from gaudi_cluster.supervise.control import ControlServer
    from gaudi_cluster.supervise.supervisor import Supervisor, SupervisorSettings
    from gaudi_cluster_dev.swarm_plan import SwarmPlan

    os.sched_setaffinity(0, {cpu})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as master.py does
    logging.getLogger("gaudi_cluster").setLevel(logging.ERROR)
    plan = SwarmPlan(nodes, PER_NODE)
    server = ControlServer(
        "127.0.0.1", 0, JOB, HEARTBEAT_S, os.environ["SWARM_SECRET"], plan.expected(),
        nodes=plan.rank_nodes(), addresses=plan.addresses(),
    )  # fmt: skip
    stop_all = server.stop_all

    def timed_stop_all(grace_s: float) -> None:
        say("stop_all")
        stop_all(grace_s)
        say("stop_all_returned")

    server.stop_all = timed_stop_all  # type: ignore[method-assign]
    server.start()
    say("port", port=server.port)
    idle = LaunchPlan(argv=(sys.executable, "-c", "import time; time.sleep(3600)"), env={}, launcher="bench")
    settings = SupervisorSettings(start_timeout_s=start_timeout, stop_grace_s=1.0)
    sampler = BeatSampler(server) if soak else None  # the soak's beat ages and LOST events
    if sampler is not None:  # the bench asks for the figures at the soak's end (or they come at the job's)
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: say("soak", **sampler.stop()))

    def all_started() -> None:
        say("all_started")
        if sampler is not None:
            sampler.start()

    supervisor = Supervisor(
        JOB, idle, server, plan.slots_by_host(), settings, out=_Console(),  # type: ignore[arg-type]
        on_all_started=all_started,
    )  # fmt: skip
    if not straggler_check:  # what the rest costs once jobview's O(N^2) check is gone (another branch)
        supervisor.view.watch.check = lambda agents: []  # type: ignore[method-assign]
    outcome = supervisor.run()
    if sampler is not None and not sampler.stopped:
        say("soak", **sampler.stop())
    server.close()
    say("done", state=outcome.state.value)
    return 0


# --- the bench's side -----------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _footprint(pid: int) -> dict[str, float]:
    import psutil

    process = psutil.Process(pid)
    rss = process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))
    return {
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss_mb": rss / 2**20,
    }


class _Run:
    """One master and one swarm, their JSON lines merged into one queue."""

    def __init__(
        self, app: Path, nodes: int, straggler_check: bool = True, soak: bool = False, work: str = "healthy"
    ) -> None:
        # Ours speaks as the node relays do (one connection per node); the old server knows only ranks.
        env = {**os.environ, "SWARM_SECRET": secrets.token_hex(32), "PYTHONUNBUFFERED": "1"}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.seen: dict[tuple[str, str], dict[str, Any]] = {}
        self.master = subprocess.Popen(
            [sys.executable, "-m", "bench.swarm", "master", "--nodes", str(nodes), "--cpu", "0",
             "--start-timeout", str(CHECKIN_CAP_S + 60),
             *([] if straggler_check else ["--no-straggler-check"]), *(["--soak"] if soak else [])],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**env, "PYTHONPATH": f"{app}:{DEV}:{ROOT}"},
        )  # fmt: skip
        self._follow("master", self.master)
        port = self.wait("master", "port", 30)["port"]
        self.swarm = subprocess.Popen(
            [sys.executable, "-m", "gaudi_cluster_dev.swarm", "--port", str(port), "--job", JOB,
             "--nodes", str(nodes), "--per-node", str(PER_NODE), "--cpu", "1", "--steer",
             "--deadline", str(400 + SOAK_S * soak), "--work", work, "--heartbeat-timeout", str(HEARTBEAT_S),
             *(["--relays"] if app == NEW_APP else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**env, "PYTHONPATH": f"{NEW_APP}:{DEV}"},
        )  # fmt: skip
        self._follow("swarm", self.swarm)

    def _follow(self, name: str, process: subprocess.Popen[str]) -> None:
        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("{"):
                    self.events.put((name, json.loads(line)))

        threading.Thread(target=read, daemon=True).start()

    def wait(self, source: str, event: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (source, event) not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {event} from the {source} within {timeout_s:.0f}s")
            try:
                name, found = self.events.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.setdefault((name, found["event"]), found)
        return self.seen[(source, event)]

    def tell(self, line: str) -> None:
        assert self.swarm.stdin is not None
        self.swarm.stdin.write(line + "\n")
        self.swarm.stdin.flush()

    def end(self) -> dict[str, Any]:
        """The swarm's final counts."""
        for process in (self.master, self.swarm):
            try:
                if process is self.swarm:
                    self.tell("quit")
                elif process.poll() is None:
                    process.terminate()  # a run cut short (check-in capped): the master is done
                process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        try:
            return self.wait("swarm", "report", 5)
        except TimeoutError:
            return {}


def one_run(
    app: Path, nodes: int, scenario: str, straggler_check: bool = True, work: str = "healthy"
) -> dict[str, Any]:
    """checkin_s and the rest for one master of `app` against the swarm; scenario: reset or silence,
    checkin (check-in, then the run ends) or soak (the same after SOAK_S of beats, sampled)."""
    scenario = scenario.split(maxsplit=1)[0]  # "checkin 3": the third check-in-only run
    run = _Run(app, nodes, straggler_check, soak=scenario == "soak", work=work)  # checkin, soak: ours only
    figures: dict[str, Any] = {}
    try:
        started = run.wait("swarm", "started", 60)["at"]
        try:
            figures["checkin_s"] = run.wait("master", "all_started", CHECKIN_CAP_S)["at"] - started
        except TimeoutError:
            figures["checkin_s"], figures["checkin_capped"] = CHECKIN_CAP_S, True
        if scenario == "reset":
            time.sleep(2.0)  # the last beats of the check-in settle
            master0, swarm0, wall0 = _cpu_s(run.master.pid), _cpu_s(run.swarm.pid), time.monotonic()
            time.sleep(STEADY_S)
            wall = time.monotonic() - wall0
            figures["master_cpu_pct"] = (_cpu_s(run.master.pid) - master0) / wall * 100
            figures["swarm_cpu_pct"] = (_cpu_s(run.swarm.pid) - swarm0) / wall * 100
            if run.master.poll() is None:
                figures.update({f"master_{k}": v for k, v in _footprint(run.master.pid).items()})
            else:  # ended before the window did: its figures would be a dead process's
                del figures["master_cpu_pct"]
                figures["master_died_at_s"] = time.monotonic() - started
        if figures.get("checkin_capped"):
            return figures
        if scenario == "soak":
            master0, swarm0, wall0 = _cpu_s(run.master.pid), _cpu_s(run.swarm.pid), time.monotonic()
            length = SOAK_S if straggler_check else SHORT_SOAK_S
            figures["soak_s"] = length
            with contextlib.suppress(TimeoutError):  # a LOST event ends the job, and the soak early
                figures["soak_ended_at_s"] = run.wait("master", "done", length)["at"] - started
            wall = time.monotonic() - wall0
            with contextlib.suppress(OSError):  # the soak's CPU: a swarm at 100 % of its core does not count
                figures["soak_master_cpu_pct"] = (_cpu_s(run.master.pid) - master0) / wall * 100
                figures["soak_swarm_cpu_pct"] = (_cpu_s(run.swarm.pid) - swarm0) / wall * 100
            if run.master.poll() is None:
                run.master.send_signal(signal.SIGUSR1)  # the master says its soak figures
            figures.update(
                {k: v for k, v in run.wait("master", "soak", 10).items() if k not in ("event", "at")}
            )
        if scenario in ("checkin", "soak"):
            return figures  # the ranks and the master are ended by run.end()
        run.tell(f"{scenario} {VICTIM}")
        cut = run.wait("swarm", "reset" if scenario == "reset" else "silenced", 10)["at"]
        named = run.wait("master", "named", HEARTBEAT_S + 30)
        figures[f"{scenario}_named_s"] = named["at"] - cut
        figures["named_line"] = named["line"]
        stop = run.wait("master", "stop_all", 30)["at"]
        told = run.wait("swarm", "stopped", 30)
        figures["stop_all_s"], figures["first_stop_s"] = told["last"] - stop, told["first"] - stop
        run.wait("master", "done", 60)
    finally:
        counts = run.end()
        figures["handshake_failures"] = counts.get("handshake_failures")
        figures["welcomed"] = counts.get("welcomed")
    return figures


def run(ctx: Ctx) -> list[Row]:
    apps = {"ours": NEW_APP, **({"theirs": OLD_APP} if (OLD_APP / "gaudi_cluster").is_dir() else {})}
    results: dict[tuple[str, int, str], dict[str, Any]] = {}

    def measure(
        side: str, nodes: int, scenario: str, straggler_check: bool = True, work: str = "healthy"
    ) -> None:
        if not ctx.can_start(60 + (SOAK_S if straggler_check else SHORT_SOAK_S) * (scenario == "soak")):
            return
        key = scenario if straggler_check else f"{scenario}, no straggler check"
        key += ", stragglers" if work == "stragglers" else ""
        log(f"swarm: {nodes} nodes x {PER_NODE}, {key}, {side}")
        try:
            found = one_run(apps[side], nodes, scenario, straggler_check, work)
        except Exception as error:  # one failed run is said in its rows, the others still count
            found = {"error": f"{type(error).__name__}: {error}"}
        results[(side, nodes, key)] = found
        log(f"swarm: {json.dumps(found)[:400]}")

    sizes = ONLY or SIZES
    fanout = swarm_fanout.measure(ctx, sizes) if "fanout" in PARTS else {}
    for nodes in sizes if "scenarios" in PARTS else ():
        for scenario in ("reset", "silence"):
            for side in apps:  # interleaved: ours, then the old server, at the same size
                if not results.get((side, nodes, "reset"), {}).get("checkin_capped"):
                    measure(side, nodes, scenario)
    if SIZES[-1] in sizes and "scenarios" in PARTS:
        measure("ours", SIZES[-1], "reset", work="stragglers")  # the straggler path at its worst
        measure("ours", SIZES[-1], "reset", straggler_check=False)
        measure("ours", SIZES[-1], "silence", straggler_check=False)
    for i in range(CHECKINS if "checkins" in PARTS else 0):  # handshake failures over many runs
        measure("ours", sizes[-1], f"checkin {i + 1}")
    if "soak" in PARTS:
        measure("ours", sizes[-1], "soak")
        if SIZES[-1] in sizes:
            measure("ours", SIZES[-1], "soak", straggler_check=False)
    rows = build(
        results,
        sizes,
        PER_NODE,
        HEARTBEAT_S,
        CHECKIN_CAP_S,
        swarm_fanout.held_per_node(fanout),
        PARTS,
        swarm_fanout.held_per_node(fanout, "held_at_launch"),
        swarm_fanout.held_per_node(fanout, "sessions_peak"),
    )
    rows += swarm_fanout.rows(fanout)
    if ONLY or set(ALL_PARTS) != PARTS:
        rows = keep_earlier(rows, RESULTS)
    return rows + plot_rows(rows, RESULTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.swarm")
    sub = parser.add_subparsers(dest="what", required=True)
    side = sub.add_parser("master")
    side.add_argument("--nodes", type=int, required=True)
    side.add_argument("--cpu", type=int, default=0)
    side.add_argument("--start-timeout", type=float, default=120.0)
    side.add_argument("--no-straggler-check", action="store_true")
    side.add_argument("--soak", action="store_true", help="sample beat ages and count LOST events")
    args = parser.parse_args(argv)
    return master(args.nodes, args.cpu, args.start_timeout, not args.no_straggler_check, args.soak)


if __name__ == "__main__":
    sys.exit(main())
