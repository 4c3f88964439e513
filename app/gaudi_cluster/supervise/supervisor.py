"""Master: run a LaunchPlan and watch every rank through the control channel until the job ends.

The first failure anywhere (non-zero exit, signal, closed connection, silent node, stuck rank,
launcher error) stops THIS job's ranks on every node through their agents, and ends in one summary
line: host, rank, exit code or signal, and the last lines of that rank's output.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import gc
import logging
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

from gaudi_cluster.env.envfile import launcher_environment
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.launch.plan import LaunchPlan
from gaudi_cluster.rank import procgroup
from gaudi_cluster.supervise.console import RankLogs, RankOutput
from gaudi_cluster.supervise.control import ControlEvent, ControlServer, EventKind
from gaudi_cluster.supervise.outcome import JobOutcome, JobState, RankFailure, signal_name
from gaudi_cluster.view.figures import JobFigures
from gaudi_cluster.view.jobview import RankSnapshot
from gaudi_cluster.view.liveview import LiveView
from gaudi_cluster.wire import protocol

log = logging.getLogger("gaudi_cluster.supervise.supervisor")

LOOK_INTERVAL_S = 1.0  # how often the whole job's state is read (live view, stuck ranks)
# After the ranks' exits, how long the relays get (beyond the stop's grace) to reap their nodes and
# say so: their agents have left by then, so it takes milliseconds unless a node is in trouble; one
# whose agents have not ended is reaped by its relay at the margin, and its word needs a moment more.
RELAY_REAP_S = protocol.RELAY_STOP_MARGIN_S + 1.5
GC_YOUNG_THRESHOLD = 50_000  # Python's 700 made ~58 young collections a second at 8,000 ranks


def settle_the_heap() -> None:
    """Once every rank is in, what the master has built (plan, seats, connections) lives as long as
    the attempt: out of the cyclic collector's sight (gc.freeze), and fewer young collections."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class SupervisorPhase(enum.Enum):
    """Where one attempt is (`gaudi-cluster status` shows the value as the job's state)."""

    STARTING = "starting"  # the launcher is being started
    RUNNING = "running"  # ranks are checking in and working
    ABORTING = "aborting"  # a failure: the ranks are being killed on every node
    STOPPED = "stopped"  # told to stop: the ranks get their grace to save, then the attempt is over
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @classmethod
    def ended(cls, state: JobState) -> SupervisorPhase:
        return cls(state.value)


@dataclass(frozen=True)
class SupervisorSettings:
    """What supervising an attempt reads of the cluster's settings, and nothing else."""

    start_timeout_s: float = 120.0
    stuck_timeout_s: float = 600.0
    stop_grace_s: float = 8.0
    status_interval_s: float = 30.0  # how often the status line is printed when not on a terminal
    tee: bool = False  # every rank's lines on the console, not only rank 0's
    # An abort (a rank failed, a node was lost) cannot checkpoint: every other rank waits in a
    # collective on the dead one. Ranks are killed at once; this is how long the supervisor waits
    # for the reachable agents to confirm before it kills the launcher too.
    abort_wait_s: float = 1.0


class Supervisor:
    def __init__(
        self,
        job_id: str,
        plan: LaunchPlan,
        server: ControlServer,
        slots_by_host: Mapping[str, int],
        settings: SupervisorSettings,
        out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic,
        on_all_started: Callable[[], None] | None = None,
        on_first_step: Callable[[], None] | None = None,
        rank_logs: RankLogs | None = None,
    ) -> None:
        self.job_id = job_id
        self.plan = plan
        self.server = server
        self.slots_by_host = dict(slots_by_host)
        self.expected = sum(self.slots_by_host.values())
        self.settings = settings
        self.out = out
        self.clock = clock
        # Called once, when every rank has checked in (each agent has read its private file by then).
        self.on_all_started = on_all_started
        self._heap_settled = False
        # Called once, in this thread, when a rank reports its first step (the ranks' imports are done
        # by then, so work done here does not slow their start). Never in a thread of its own: an
        # import still running in another thread when a short job ends races the interpreter's exit.
        self.on_first_step = on_first_step
        self._all_started_work: threading.Thread | None = None
        self._pump_stop = threading.Event()
        self.lost_hosts: set[str] = set()  # host names of nodes whose agents went silent or away
        self.launcher: subprocess.Popen[bytes] | None = None
        self.launcher_tail: collections.deque[str] = collections.deque(maxlen=30)
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.view = LiveView(out, settings.status_interval_s, clock)
        self.rank_logs = rank_logs
        self.console = RankOutput(
            self._print, self.view.progress, rank_logs, settings.tee, self.launcher_tail
        )
        self.state = SupervisorPhase.STARTING

    # --- output ---------------------------------------------------------------------------------

    def _print(self, line: str) -> None:
        self.view.write(line)

    def snapshot(self) -> dict[str, object]:
        """What `gaudi-cluster status` shows (called from the status socket's thread)."""
        return self.view.snapshot(self.server.agents(), self.job_id, self.state.value)

    def figures(self, restarts: int = 0) -> JobFigures:
        """What the metrics endpoint serves (called from its server's thread at each scrape)."""
        return self.view.figures(self.server.agents(), self.job_id, self.state.value, restarts)

    def _pump_launcher(self) -> None:
        """Route the launcher's output line by line until it ends or run() says stop: never left
        running (an abort cannot wait for the end of a pipe that a cut-off node's ssh holds open)."""
        assert self.launcher is not None and self.launcher.stdout is not None
        fd, pending = self.launcher.stdout.fileno(), b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if not selector.select(timeout=0.1):
                    if self._pump_stop.is_set():
                        break  # nothing more for now, and run() is done: what comes later is lost
                    self.console.flush()  # a quiet moment: `tail -f` on a rank's file is current
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    self.console.route(raw.decode(errors="replace"))
        if pending:
            self.console.route(pending.decode(errors="replace"))

    def _pump_relayed(self) -> None:
        """Route the lines the node relays carried (the direct launcher's ranks') until run() says
        stop, and then what had come by then."""
        while True:
            try:
                batch = self.server.output.get(timeout=0.1)
            except queue.Empty:
                if self._pump_stop.is_set():
                    return
                self.console.flush()  # a quiet moment: `tail -f` on a rank's file is current
                continue
            try:
                self.console.route_rank(batch.host, batch.rank, batch.lines)
            finally:
                self.server.output.task_done()

    def _settle_relayed(self, timeout_s: float) -> None:
        """The relays' lines that came before the ranks' exits reach the console before it goes quiet:
        routed, not merely taken off the queue (a rank's last line was lost that way on a busy core)."""
        output = self.server.output
        deadline = time.monotonic() + timeout_s
        with output.all_tasks_done:
            while output.unfinished_tasks and (left := deadline - time.monotonic()) > 0:
                output.all_tasks_done.wait(left)

    # --- signals --------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, _f: self._signals.put(s))

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> JobOutcome:
        env = {**launcher_environment(os.environ), **self.plan.env}
        started = self.clock()
        # Its own session: a Ctrl-C in the terminal reaches us, and we stop the ranks in order.
        try:
            self.launcher = subprocess.Popen(
                list(self.plan.argv),
                env=env,
                stdin=subprocess.DEVNULL if self.plan.stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            if self.plan.stdin is not None and self.launcher.stdin is not None:
                self.launcher.stdin.write(self.plan.stdin.encode())
                self.launcher.stdin.close()
        except OSError as error:
            raise ClusterNotReady(
                f"cannot start the {self.plan.launcher} launcher ({self.plan.argv[0]}: {error.strerror}); "
                "fix: install it on this node or choose another launcher"
            ) from None
        pump = threading.Thread(target=self._pump_launcher, name="launcher-output")
        pump.start()
        relayed = threading.Thread(target=self._pump_relayed, name="relayed-output")
        relayed.start()
        try:
            outcome = self._watch(started)
            failed = outcome.state is JobState.FAILED
            self.state = SupervisorPhase.ABORTING if failed else SupervisorPhase.ended(outcome.state)
            self._teardown(outcome)
            # The launcher's last lines. After an abort, do not wait for the end of its output: an ssh
            # session riding a shared connection hands its output pipe to that connection's process,
            # which holds it open for as long as a cut-off node leaves the connection up.
            pump.join(timeout=0.3 if outcome.state is JobState.FAILED else 5)
            self._settle_relayed(timeout_s=0.3 if outcome.state is JobState.FAILED else 5)
        finally:
            # Every thread of this attempt ends here, whatever happened: one still writing to the
            # console while the interpreter exits can abort it (SIGABRT, exit 134). What the console
            # has not shown yet still reaches the ranks' files, without the console's pace.
            self.console.quiet = True
            self._pump_stop.set()
            pump.join()
            relayed.join()
            if self.rank_logs is not None:
                self.rank_logs.close()
            if self._all_started_work is not None:
                self._all_started_work.join(timeout=15)
        self.view.close()
        for straggler in self.view.watch.flagged.values():
            self._print(f"gaudi-cluster: job {self.job_id}: {straggler.line()}")
        self.state = SupervisorPhase.ended(outcome.state)
        return outcome

    def _watch(self, started: float) -> JobOutcome:
        ranks_seen: dict[int, str] = {}
        finished: set[int] = set()
        launcher_exit_seen_at: float | None = None
        looked_at = -LOOK_INTERVAL_S
        self.state = SupervisorPhase.RUNNING
        while True:
            stuck: RankFailure | None = None
            if self.clock() - looked_at >= LOOK_INTERVAL_S:
                # One snapshot of every rank a second, for the live view and the stuck check: at
                # thousands of ranks a copy per event or per loop would be what the master does.
                table = self.server.table()
                self.view.tick(table)
                looked_at = self.clock()
                if self.on_first_step is not None and any(table.step[r] for r in table.ranks):
                    first_step, self.on_first_step = self.on_first_step, None
                    first_step()
                stuck = self._stuck(looked_at, table)
            with contextlib.suppress(queue.Empty):
                signum = self._signals.get_nowait()
                self._print(
                    f"gaudi-cluster: received {signal_name(signum)}; stopping job {self.job_id} on every node"
                )
                return JobOutcome.stopped(signum, ranks_seen)
            for event in self._events(timeout_s=0.2):
                failure = self._handle(event, ranks_seen, finished)
                if failure is not None:
                    return JobOutcome.failed(failure, ranks_seen)
                if len(finished) == self.expected:  # what comes after the last exit is not the job's
                    return JobOutcome.succeeded(ranks_seen)
            if len(finished) == self.expected:
                return JobOutcome.succeeded(ranks_seen)
            now = self.clock()
            assert self.launcher is not None
            if self.launcher.poll() is not None and not self._handed_over():
                # Rank reports travel on another socket: give them a moment to arrive first.
                launcher_exit_seen_at = launcher_exit_seen_at or now
                if now - launcher_exit_seen_at > 3.0 and self.server.events.empty():
                    return JobOutcome.failed(self._launcher_failure(len(finished)), ranks_seen)
            failure = self._check_start(now - started, ranks_seen) or stuck
            if failure is not None:
                return JobOutcome.failed(failure, ranks_seen)

    def _events(self, timeout_s: float) -> list[ControlEvent]:
        """Every event queued now (waiting up to timeout_s for the first), in order."""
        try:
            events = [self.server.events.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                events.append(self.server.events.get_nowait())
        return events

    def _handle(
        self, event: ControlEvent, ranks_seen: dict[int, str], finished: set[int]
    ) -> RankFailure | None:
        if event.kind is EventKind.HELLO:
            ranks_seen[event.rank] = event.host
            log.debug("rank %d checked in from %s", event.rank, event.host)
            if len(ranks_seen) == self.expected and self.on_all_started is not None:
                self._all_started_work = threading.Thread(target=self.on_all_started, name="all-started")
                self._all_started_work.start()
                self.on_all_started = None
            if len(ranks_seen) == self.expected and not self._heap_settled:
                self._heap_settled = True
                settle_the_heap()
            return None
        if event.kind is EventKind.EXIT:
            code, signum, tail = event.code, event.signal, event.tail
            if code == 0:
                finished.add(event.rank)
                return None
            if signum:
                return RankFailure.signalled(event.host, event.rank, int(signum), code, tail)
            return RankFailure.exited(event.host, event.rank, code, tail)
        reason = event.reason or "lost"
        self.lost_hosts.add(event.host)
        return RankFailure.lost(event.host, event.rank, reason)

    def _handed_over(self) -> bool:
        """The launcher ended as planned while its ranks run on: it handed them to their node relays
        (the direct launcher's ssh sessions end once a node's ranks are seated)."""
        assert self.launcher is not None
        return self.plan.hands_over and self.launcher.returncode == 0

    def _launcher_failure(self, finished: int) -> RankFailure:
        assert self.launcher is not None
        return RankFailure.launcher_ended(
            self.launcher.returncode, finished, self.expected, self.launcher_tail
        )

    def _check_start(self, elapsed: float, ranks_seen: dict[int, str]) -> RankFailure | None:
        if len(ranks_seen) < self.expected and elapsed > self.settings.start_timeout_s:
            seen = collections.Counter(ranks_seen.values())
            missing = [
                f"{host} ({slots - seen.get(host, 0)} of {slots})"
                for host, slots in self.slots_by_host.items()
                if seen.get(host, 0) < slots
            ]
            # Agents report their hostname while the plan knows addresses: name both sides.
            return RankFailure.never_started(
                ", ".join(missing) or "?",
                len(ranks_seen),
                self.expected,
                self.settings.start_timeout_s,
                self.launcher_tail,
            )
        return None

    def _stuck(self, now: float, table: RankSnapshot) -> RankFailure | None:
        for rank in table.ranks:
            age = table.age_now(rank, now)
            if table.exited[rank] or age is None or age <= self.settings.stuck_timeout_s:
                continue
            host, step = table.host[rank], table.step[rank]
            return RankFailure.stuck(host, rank, step, age, self.settings.stuck_timeout_s)
        return None

    def _teardown(self, outcome: JobOutcome) -> None:
        """Succeeded: let the launcher finish. Stopped (a signal to the master): ranks get the stop
        grace to checkpoint. Failed: abort, ranks are killed at once and the last complete
        checkpoint is what a restart resumes from."""
        if outcome.state is JobState.SUCCEEDED:
            self._wait_launcher(30)
            return
        if outcome.failure is not None:
            self._print("gaudi-cluster: " + outcome.failure.summary(self.job_id))
        stopping = outcome.state is JobState.STOPPED
        grace = self.settings.stop_grace_s if stopping else 0.0
        self.server.stop_all(grace)
        began = self.clock()
        deadline = began + (grace + 3 if stopping else self.settings.abort_wait_s)
        while self.clock() < deadline and self.server.running():
            for event in self._events(timeout_s=0.05):
                if event.kind in (EventKind.EXIT, EventKind.LOST):
                    self.server.mark_exited(event.rank)
                    log.debug("rank %d %s after %.2fs", event.rank, event.kind.value, self.clock() - began)
        left = self.server.running()
        log.debug("ranks confirmed after %.2fs; still unconfirmed: %s", self.clock() - began, left or "none")
        # A node process that runs its node's relay (an srun task, this node's own) is in the
        # launcher's process group: its relay reaps the node and says so before the launcher ends.
        self.server.reaped_by_relays(grace + RELAY_REAP_S)
        self._kill_launcher(grace_s=2.0 if stopping else 0.0)

    def _wait_launcher(self, timeout_s: float) -> None:
        assert self.launcher is not None
        try:
            self.launcher.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_launcher()

    def _kill_launcher(self, grace_s: float = 2.0) -> None:
        launcher = self.launcher
        assert launcher is not None
        procgroup.terminate(launcher.pid, grace_s, done=lambda: launcher.poll() is not None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=2)
