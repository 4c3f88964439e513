"""The master's console while a job runs: rank lines as they come, and one live status line.

On a terminal the status line is redrawn in place under the rank lines; otherwise it is printed
once when the first step lands (a log then shows when training began, however short the job) and
every `interval_s` seconds after. A rank's progress bar (e.g. a checkpoint being written) shows in
the line while it runs instead of being printed. Stragglers are named on a line of their own, once.
The same numbers serve `gaudi-cluster status` (a snapshot), the metrics and the final report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from gaudi_cluster.view.figures import JobFigures, job_figures
from gaudi_cluster.view.jobview import (
    AgentState,
    RankSnapshot,
    RateMeter,
    StragglerWatch,
    live_line,
    snapshot_of,
    status_rows,
)

CLEAR = "\r\x1b[K"
PROGRESS_SHOWN_S = 5.0  # a bar not redrawn for this long has ended (or stalled): the line drops it


class LiveView:
    def __init__(
        self, out: TextIO, interval_s: float, clock: Callable[[], float], tty: bool | None = None
    ) -> None:
        self.out = out
        self.interval_s = interval_s
        self.clock = clock
        self.tty = out.isatty() if tty is None else tty
        self.rate = RateMeter()
        self.watch = StragglerWatch()
        self.started = clock()
        self.line = ""
        self._shown = False
        self._last_check = -1.0
        self._last_print = self.started
        self._progress: tuple[str, float] | None = None  # the newest bar's text, when it came
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        """A rank's or the master's own line (the status line stays last on a terminal)."""
        with self._lock:
            self._emit((CLEAR if self._shown else "") + text + "\n" + (self.line if self._shown else ""))

    def _emit(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, OSError):
            pass

    def progress(self, text: str) -> None:
        """A rank's progress bar, redrawn: shown at the end of the status line while it runs."""
        self._progress = (text, self.clock())

    def _progress_part(self, now: float) -> str:
        shown = self._progress
        if shown is None or now - shown[1] > PROGRESS_SHOWN_S or " 100% " in shown[0] + " ":
            return ""
        return " · " + shown[0]

    def tick(self, agents: Sequence[AgentState] | RankSnapshot) -> None:
        """Called often; does its work once a second."""
        now = self.clock()
        if now - self._last_check < 1.0:
            return
        self._last_check = now
        agents = snapshot_of(agents)
        steps = [s for r in agents.ranks if (s := agents.step[r]) is not None]
        first_step = bool(steps) and not self.rate.points  # the meter holds every step seen since
        if steps:
            self.rate.add(now, min(steps))
        for straggler in self.watch.check(agents):
            self.write(f"gaudi-cluster: {straggler.line()}")
        line = "gaudi-cluster: " + live_line(agents, now - self.started, self.rate) + self._progress_part(now)
        with self._lock:
            self.line = line
            if self.tty:
                self._emit(CLEAR + line)
                self._shown = True
            elif first_step or now - self._last_print >= self.interval_s:
                self._emit(line + "\n")
                self._last_print = now

    def close(self) -> None:
        with self._lock:
            if self._shown:
                self._emit(CLEAR)
                self._shown = False

    def snapshot(self, agents: Sequence[AgentState], job_id: str, state: str) -> dict[str, Any]:
        now = self.clock()
        return {
            "job": job_id,
            "state": state,
            "elapsed_s": round(now - self.started, 1),
            "line": live_line(agents, now - self.started, self.rate),
            "ranks": status_rows(agents, now),
            "stragglers": [s.line() for s in self.watch.flagged.values()],
        }

    def figures(self, agents: Sequence[AgentState], job_id: str, state: str, restarts: int) -> JobFigures:
        now, flagged = self.clock(), self.watch.flagged
        return job_figures(agents, now, now - self.started, self.rate, flagged, job_id, state, restarts)
