"""Shared pieces of the benchmarks: statistics, result rows, docker log timestamps, workload events."""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
if str(APP) not in sys.path:  # the control plane and workload packages (also installed editable in .venv)
    sys.path.insert(0, str(APP))

EVENT_PREFIX = "gaudi-cluster-event "
WORK = ROOT / "build" / "bench"  # scratch space (git-ignored through build/)
# run_clm flags of every timed job: nothing saved (no checkpoint, final model or plot), no log lines.
NO_SAVE_NO_LOG = ["--save_strategy", "no", "--no_save_last_ckpt", "--no_plot", "--logging_steps", "1000000"]


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    print(f"[bench {stamp}] {message}", file=sys.stderr, flush=True)


def unique(tag: str) -> str:
    """A name no other run (ours or somebody else's) uses: every container and network carries one."""
    return f"gcbench-{tag}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------- statistics and rows


@dataclass
class Stat:
    """Summary of repeated measurements. Values that hit a cap are stored as the cap and counted."""

    values: list[float]
    cap: float | None = None
    capped: int = 0

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def median_capped(self) -> bool:
        """True when the median itself is only a lower bound (half or more of the runs hit the cap)."""
        return self.capped > 0 and 2 * self.capped >= self.n

    def iqr(self) -> tuple[float, float] | None:
        if self.n < 4:
            return None
        q = statistics.quantiles(self.values, n=4, method="inclusive")
        return q[0], q[2]

    def as_dict(self) -> dict:
        out: dict = {"n": self.n, "values": [round(v, 4) for v in self.values]}
        if self.values:
            out.update(
                median=round(self.median or 0.0, 4),
                min=round(min(self.values), 4),
                max=round(max(self.values), 4),
            )
            iqr = self.iqr()
            if iqr:
                out["iqr"] = [round(iqr[0], 4), round(iqr[1], 4)]
        if self.cap is not None:
            out.update(cap=self.cap, capped=self.capped)
        return out


def stat(values: Sequence[float], cap: float | None = None) -> Stat:
    vals = [float(v) for v in values]
    capped = 0
    if cap is not None:
        capped = sum(1 for v in vals if v >= cap)
        vals = [min(v, cap) for v in vals]
    return Stat(vals, cap, capped)


@dataclass
class Target:
    """What the issue asks: `on` is "ours" (the median) or "ratio"; `op` is "<=" or ">="."""

    on: str
    op: str
    value: float
    text: str

    def met(self, row: Row) -> bool | None:
        if self.on == "ours":
            if row.ours.median is None:
                return None
            if row.ours.median_capped:  # only a lower bound: "<=" fails, ">=" holds
                return self.op == ">="
            x = row.ours.median
        else:
            x = row.ratio
            if x is None:
                return None
            if row.theirs is not None and row.theirs.median_capped and not row.ours.median_capped:
                # ours / (a lower bound): the true ratio is smaller than shown
                if self.op == "<=" and x <= self.value:
                    return True
                if self.op == "<=":
                    return None
        return x <= self.value if self.op == "<=" else x >= self.value


@dataclass
class Row:
    key: str
    figure: str
    unit: str
    ours: Stat
    theirs: Stat | None = None
    theirs_label: str = ""
    target: Target | None = None
    note: str = ""
    details: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.theirs is None or not self.ours.values or not self.theirs.values:
            return None
        t = self.theirs.median or 0.0
        return (self.ours.median or 0.0) / t if t else None

    @property
    def met(self) -> bool | None:
        return self.target.met(self) if self.target else None

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "figure": self.figure,
            "unit": self.unit,
            "ours": self.ours.as_dict(),
            "theirs": self.theirs.as_dict() if self.theirs else None,
            "theirs_label": self.theirs_label,
            "ratio": round(self.ratio, 4) if self.ratio is not None else None,
            "target": self.target.text if self.target else None,
            "target_rule": [self.target.on, self.target.op, self.target.value] if self.target else None,
            "met": self.met,
            "note": self.note,
            "details": self.details,
        }


def row_from_dict(d: dict) -> Row:
    """A row read back from latest.json (to merge a partial run into the table)."""

    def to_stat(x: dict | None) -> Stat | None:
        if x is None:
            return None
        return Stat(list(x.get("values", [])), x.get("cap"), int(x.get("capped", 0)))

    rule = d.get("target_rule")
    target = Target(rule[0], rule[1], float(rule[2]), d.get("target") or "") if rule else None
    return Row(
        d["key"],
        d["figure"],
        d.get("unit", ""),
        to_stat(d["ours"]) or Stat([]),
        to_stat(d.get("theirs")),
        d.get("theirs_label", ""),
        target,
        d.get("note", ""),
        d.get("details", {}),
    )


def failed_row(key: str, figure: str, why: str) -> Row:
    """A measurement that could not be taken: shown as such, never silently left out."""
    return Row(key, figure, "", stat([]), note=f"NOT MEASURED: {why}")


# ---------------------------------------------------------------- timestamps, logs, events


def parse_rfc3339(stamp: str) -> float:
    """`2026-11-29T20:01:02.123456789Z` (docker logs -t) -> unix seconds."""
    stamp = stamp.rstrip("Z")
    if "." in stamp:
        base, frac = stamp.split(".", 1)
        frac = (frac + "000000")[:6]
    else:
        base, frac = stamp, "0"
    dt = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return dt.timestamp() + int(frac) / 1e6


def docker_logs_t(name: str) -> list[tuple[float, str]]:
    """A container's stdout and stderr lines with docker's receive timestamps, in time order."""
    done = subprocess.run(
        ["docker", "logs", "-t", name], check=False, capture_output=True, text=True, timeout=60
    )
    lines: list[tuple[float, str]] = []
    for text in (done.stdout, done.stderr):
        for line in text.splitlines():
            stamp, _, rest = line.partition(" ")
            try:
                lines.append((parse_rfc3339(stamp), rest))
            except ValueError:
                continue
    lines.sort(key=lambda x: x[0])
    return lines


def first_line(lines: Sequence[tuple[float, str]], needle: str) -> float | None:
    for t, line in lines:
        if needle in line:
            return t
    return None


_JOB_LINE = re.compile(r"job (\S+): \d+ ranks on")


def job_events(container: str, lines: Sequence[tuple[float, str]] | Sequence[str]) -> dict[str, dict]:
    """The workload's events of the job a master started in `container` (the job id is in its log):
    rank 0 writes them to the job directory, not the console. Works on a stopped container too."""
    texts = [item[1] if isinstance(item, tuple) else item for item in lines]
    job = next((m[1] for text in texts if (m := _JOB_LINE.search(text))), None)
    if job is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["docker", "cp", f"{container}:/run/gaudi-cluster/jobs/{job}/events.jsonl", tmp],
            capture_output=True,
            check=False,
            timeout=30,
        )
        path = Path(tmp) / "events.jsonl"
        if done.returncode != 0 or not path.exists():
            return {}
        out: dict[str, dict] = {}
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                out.setdefault(record.get("event", "?"), record)
        return out


def events_in(lines: Sequence[tuple[float, str]] | Sequence[str]) -> dict[str, dict]:
    """First occurrence of every workload event (`gaudi-cluster-event {...}`) by name."""
    out: dict[str, dict] = {}
    for item in lines:
        line = item[1] if isinstance(item, tuple) else item
        idx = line.find(EVENT_PREFIX)
        if idx < 0:
            continue
        try:
            record = json.loads(line[idx + len(EVENT_PREFIX) :])
        except ValueError:
            continue
        out.setdefault(record.get("event", "?"), record)
    return out


class Streamed:
    """A process whose output lines are timestamped on arrival (host clock) and kept."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        container: str | None = None,
    ) -> None:
        self.container = container  # where a master runs the job (its events are in a file there)
        self.argv = list(argv)
        self.lines: list[tuple[float, str]] = []
        self.t_start = time.time()
        self.t_exit: float | None = None
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()
        self.proc.wait()
        with self._cond:
            self.t_exit = time.time()
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        end = time.time() + timeout
        with self._cond:
            while not predicate():
                left = end - time.time()
                if left <= 0 or (self.t_exit is not None and not predicate()):
                    return predicate()
                self._cond.wait(min(left, 0.5))
        return True

    def events(self) -> dict[str, dict]:
        """Workload events: printed (a raw launch) or in the job's file (a master started in `container`)."""
        found = events_in(self.lines)
        if self.container is not None:
            found = {**job_events(self.container, self.lines), **found}
        return found

    def wait_event(self, name: str, timeout: float) -> dict | None:
        self.wait_for(lambda: name in self.events(), timeout)
        return self.events().get(name)

    def wait_exit(self, timeout: float) -> int | None:
        self.wait_for(lambda: self.t_exit is not None, timeout)
        return self.proc.returncode if self.t_exit is not None else None

    def stop(self) -> None:
        """Terminate the process we started (by its own handle), if it still runs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)

    def tail(self, n: int = 25) -> str:
        return "\n".join(line for _t, line in self.lines[-n:])


# ---------------------------------------------------------------- the run context


@dataclass
class Ctx:
    image: str
    key_dir: Path
    repeat: int | None
    quick: bool = False
    notes: list[str] = field(default_factory=list)
    deadline: float = float("inf")  # end of the current bench's share of the time budget

    def reps(self, default: int) -> int:
        return max(1, self.repeat) if self.repeat else default

    def can_start(self, estimate: float) -> bool:
        """Whether one more repetition taking about `estimate` seconds fits in this bench's share."""
        return time.time() + estimate <= self.deadline


def interleaved(
    ctx: Ctx, bench: str, sides: Sequence[str], scenario: Callable[[str], dict], said: Callable[[dict], str]
) -> tuple[dict[str, list[dict]], list[str]]:
    """Each side's scenario `ctx.reps(2)` times, the sides interleaved and the first alternating per
    repetition (so a drift in the host's speed falls on both), while the bench's time share lasts.
    Returns each side's results and what failed or was left out; `said` words one result for the log."""
    reps = ctx.reps(2)
    results: dict[str, list[dict]] = {who: [] for who in sides}
    errors: list[str] = []
    last = 0.0
    for rep in range(reps):
        for who in sides if rep % 2 == 0 else sides[::-1]:
            if last and not ctx.can_start(last):
                errors.append(f"time budget: {who} repetition {rep + 1} not run")
                continue
            log(f"{bench}: {who} (repetition {rep + 1}/{reps})")
            began = time.time()
            try:
                result = scenario(who)
                results[who].append(result)
                log(f"{bench}: {who}: {said(result)}")
            except Exception as exc:
                errors.append(f"{who}: {str(exc)[:800]}")
                log(f"{bench}: {who} failed: {str(exc)[:800]}")
            last = time.time() - began
    return results, errors


def budget_note(done: int, planned: int) -> str:
    return f"time budget: {done} of {planned} planned runs" if done < planned else ""


def image_present(image: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", image], check=False, capture_output=True).returncode
        == 0
    )


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
