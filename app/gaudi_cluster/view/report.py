"""The report a job leaves next to its results: job_report.json and job_report.png.

JSON: nodes (host, host name, slots, package versions, image build), ranks, the preset's and the
forwarded variables' names (never values), phase timings from container start to the first step,
throughput, stragglers, the failure if any, and every attempt so far with the step it resumed from.
PNG: every rank's own work per step over the run, the slow ones highlighted. Built by the master at
the end of an attempt; `build` is pure.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.launch.attempts import AttemptPlan
from gaudi_cluster.view.report_plot import Histories, plot
from gaudi_cluster.wire.node_report import NodeReport
from gaudi_cluster.wire.workload_events import STARTUP, WorkloadEvent

log = logging.getLogger("gaudi_cluster.view.report")

JSON_NAME = "job_report.json"
PNG_NAME = "job_report.png"
PHASES = (
    ("container", "container_start", "master_start"),
    ("control_plane", "master_start", "launch"),
    ("launch", "launch", WorkloadEvent.START),
    ("imports", WorkloadEvent.START, WorkloadEvent.IMPORTS_DONE),
    ("model_init", WorkloadEvent.IMPORTS_DONE, WorkloadEvent.MODEL_READY),
    ("first_step", WorkloadEvent.MODEL_READY, WorkloadEvent.FIRST_STEP),
)


def startup_points(events: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """When rank 0's program reached each point of its startup (the first time it did), for phase_timings."""
    first = {e["event"]: e.get("t") for e in reversed(events) if "event" in e}
    return {str(name): first.get(name) for name in STARTUP}


def phase_timings(points: Mapping[str, float | None]) -> dict[str, float]:
    """Seconds per phase, and from container start to the first step, for the points that are known."""
    out = {
        name: round(float(points[b]) - float(points[a]), 3)  # type: ignore[arg-type]
        for name, a, b in PHASES
        if points.get(a) is not None and points.get(b) is not None
    }
    if points.get("container_start") is not None and points.get("first_step") is not None:
        out["container_start_to_first_step"] = round(points["first_step"] - points["container_start"], 3)  # type: ignore[operator]
    return out


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of the job as the report lists it: how it ended, the step its ranks resumed from
    (0: from scratch; None: the ranks never chose, e.g. the attempt failed before), its nodes and
    idle spares (node names), the lost nodes a spare replaced or nobody did (the job shrank), the
    batch change that came with it, and the time lost: the previous attempt's end (the lost node
    noticed) to this attempt's first training step."""

    attempt: int
    job: str
    state: str
    exit_code: int
    resumed_from_step: int | None
    nodes: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()
    replaced: tuple[tuple[str, str], ...] = ()  # (lost node, the spare in its place)
    dropped: tuple[str, ...] = ()
    batch: str | None = None
    time_lost_s: float | None = None
    ended_at: float | None = None  # wall clock

    @classmethod
    def of(
        cls,
        attempt: int,
        job: str,
        state: str,
        exit_code: int,
        events: Sequence[Mapping[str, Any]],
        planned: AttemptPlan | None,
        history: Sequence[AttemptRecord],
    ) -> AttemptRecord:
        """This attempt's record from its events and the plan that chose its nodes."""
        since = history[-1].ended_at if history else None
        # the events file may hold earlier attempts' events too: this attempt's come after `since`
        firsts = [
            e["t"]
            for e in events
            if e.get("event") == WorkloadEvent.FIRST_STEP and isinstance(e.get("t"), float)
        ]
        first = next((t for t in sorted(firsts) if since is None or t > since), None)
        lost_s = round(float(first) - since, 1) if since is not None and first is not None else None
        return cls(
            attempt,
            job,
            state,
            exit_code,
            resumed_from_step(events),
            replaced=planned.replaced if planned else (),
            dropped=planned.dropped if planned else (),
            batch=planned.batch.line() if planned and planned.batch else None,
            time_lost_s=lost_s,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptRecord:
        step, lost, ended = data.get("resumed_from_step"), data.get("time_lost_s"), data.get("ended_at")
        return cls(
            int(data["attempt"]),
            str(data["job"]),
            str(data["state"]),
            int(data["exit_code"]),
            None if step is None else int(step),
            tuple(data.get("nodes", ())),
            tuple(data.get("spares", ())),
            tuple((str(a), str(b)) for a, b in data.get("replaced", ())),
            tuple(data.get("dropped", ())),
            data.get("batch"),
            None if lost is None else float(lost),
            None if ended is None else float(ended),
        )


def resumed_from_step(events: Sequence[Mapping[str, Any]]) -> int | None:
    """The step rank 0's `resume` event names (0: from scratch); None without one."""
    resume = next((e for e in reversed(events) if e.get("event") == WorkloadEvent.RESUME), None)
    if resume is None:
        return None
    step = resume.get("step")
    return int(step) if isinstance(step, int) else 0


def _node_row(host: str, slots: int, report: NodeReport | None) -> dict[str, Any]:
    return {
        "host": host,
        "hostname": report.hostname if report else None,
        "slots": slots,
        "accelerator": report.accelerator if report else None,
        "versions": dict(report.versions) if report else None,
        "build_id": report.build_id if report else None,
    }


def build(
    *,
    job_id: str,
    state: str,
    exit_code: int,
    reports: Mapping[str, NodeReport],
    ranks_by_host: Mapping[str, int],
    rank_hosts: Mapping[int, str],
    preset_names: Sequence[str],
    private_names: Sequence[str],
    points: Mapping[str, float | None],
    events: Sequence[Mapping[str, Any]],
    stragglers: Sequence[str],
    failure: str | None,
    attempts: Sequence[AttemptRecord] = (),
) -> dict[str, Any]:
    done = next((e for e in events if e.get("event") == WorkloadEvent.TRAIN_DONE), {})
    return {
        "job": job_id,
        "state": state,
        "exit_code": exit_code,
        "nodes": [_node_row(host, slots, reports.get(host)) for host, slots in ranks_by_host.items()],
        "ranks": [{"rank": rank, "hostname": name} for rank, name in sorted(rank_hosts.items())],
        "env_names": sorted(preset_names),
        "private_env_names": sorted(private_names),
        "phases_s": phase_timings(points),
        "throughput": {
            "train_samples_per_second": done.get("train_samples_per_second"),
            "train_loss": done.get("train_loss"),
            "steps": done.get("step"),
        },
        "stragglers": list(stragglers),
        "failure": failure,
        "attempts": [attempt.to_json() for attempt in attempts],
    }


SLOWEST_NAMED = 10


def slowest_ranks(
    histories: Histories, rank_hosts: Mapping[int, str], count: int = SLOWEST_NAMED
) -> list[dict[str, Any]]:
    """The ranks with the largest median work per step over the run, slowest first, by name."""
    medians = {}
    for rank, points in histories.items():
        values = [seconds for _, seconds in points]
        if values:
            medians[rank] = statistics.median(values)
    named = heapq.nlargest(count, medians.items(), key=lambda item: (item[1], -item[0]))
    return [{"rank": r, "host": rank_hosts.get(r), "median_work_s": round(w, 4)} for r, w in named]


def write(
    report: Mapping[str, Any],
    histories: Histories,
    slow: set[int],
    directory: Path,
    rank_hosts: Mapping[int, str] | None = None,
) -> list[Path]:
    """Write the JSON and the plot into `directory`; returns what was written. The JSON also names
    the slowest ranks of the histories plotted (their hosts from `rank_hosts`, else the report's ranks)."""
    hosts = (
        rank_hosts if rank_hosts is not None else {r["rank"]: r["hostname"] for r in report.get("ranks", [])}
    )
    report = {**report, "slowest_ranks": slowest_ranks(histories, hosts)}
    written: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / JSON_NAME).write_text(json.dumps(report, indent=2) + "\n")
        written.append(directory / JSON_NAME)
        if plot(histories, slow, directory / PNG_NAME, hosts):
            written.append(directory / PNG_NAME)
    except OSError as error:
        log.warning("could not write the job report into %s: %s", directory, error)
    return written


def container_start() -> float | None:
    """When this container started: its PID 1 (the image's tini) started; None outside a container."""
    try:
        in_container = Path("/proc/1/comm").read_text().strip() == "tini"
    except OSError:
        return None
    return process_start(1) if in_container else None


def process_start(pid: int | str = "self") -> float | None:
    """Unix time a process started (from /proc: its start in clock ticks after boot, plus boot time)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def read_events(*candidates: Path) -> list[dict[str, Any]]:
    """Rank 0's events, from the first of these files that exists on this node (job dir, output dir)."""
    for path in candidates:
        try:
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
    return []
