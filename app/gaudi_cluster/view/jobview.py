"""What the operator sees of a running job, computed from the agents' heartbeats. Pure.

The live line: step / total, cluster samples/s, elapsed, ETA, the slowest rank. Stragglers: a rank
whose own work per step (not the time it waits for others: see train.steptiming) stays above
SLOW_RATIO x the median of the other ranks over SUSTAIN new steps in a row, warm-up steps left out,
is named once, with its host and local device index. Counting steps, not checks, matters: with
steps of several seconds a per-second check would see the same few steps again and again, and one
unlucky scheduling slice on a shared host would pass for a slow device. The status table: one row per rank.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.wire.work_window import WINDOW, window_median


@dataclass
class AgentState:
    """What the master knows of one rank agent, from its hello and heartbeats. The control server
    owns the live ones (and changes them only under its lock); everything else reads copies."""

    host: str
    rank: int
    pid: int
    last_seen: float  # master's monotonic clock
    step: int | None = None
    # Seconds since the rank last made progress (a step, else output), as the agent measured it on
    # its own node, and when the master received that figure: no two nodes' clocks are compared.
    progress_age: float | None = None
    progress_received: float | None = None
    exited: bool = False
    local_rank: int = 0
    max_steps: int | None = None
    samples_per_step: int | None = None
    last_line: str = ""
    # (step, seconds of this rank's own work): the recent ones for the live view; the whole run,
    # downsampled to a bounded number of points (view/history), for the report.
    recent_work: tuple[tuple[int, float], ...] = ()
    work_history: WorkHistory = field(default_factory=WorkHistory, repr=False)
    # median_work's answer, and the recent_work it was computed from (a new step makes a new tuple).
    work_median: float | None = field(default=None, repr=False, compare=False)
    median_of: tuple[tuple[int, float], ...] | None = field(default=None, repr=False, compare=False)

    def copy(self) -> AgentState:
        """A shallow copy, several times cheaper than dataclasses.replace (thousands a second at
        scale); it shares the work history, which only the owner of the live state may read."""
        twin = object.__new__(AgentState)
        twin.__dict__.update(self.__dict__)
        return twin

    def progress_age_now(self, now: float) -> float | None:
        if self.progress_age is None or self.progress_received is None:
            return None
        return self.progress_age + (now - self.progress_received)


@dataclass(frozen=True)
class RankSnapshot:
    """Every seated rank's hot fields at one moment: flat lists indexed by rank (the control server
    copies its own by slice, under its lock, once a second), and `ranks`, the seated ones. What the
    live view, the straggler check and the stuck check read; `agents()` for the rarer readers."""

    ranks: tuple[int, ...]
    host: list[str]
    local_rank: list[int]
    pid: list[int]
    exited: list[bool]
    last_seen: list[float]
    step: list[int | None]
    progress_age: list[float | None]
    progress_received: list[float | None]
    median: list[float | None]  # median_work's answer
    timed: list[int | None]  # the newest timed step
    max_steps: list[int | None]
    samples_per_step: list[int | None]
    last_line: list[str]

    @classmethod
    def of_agents(cls, agents: Sequence[AgentState]) -> RankSnapshot:
        size = max((a.rank for a in agents), default=-1) + 1
        lists: dict[str, list[Any]] = {name: [None] * size for name in _PER_RANK}
        for agent in agents:
            for name in _PER_RANK:
                lists[name][agent.rank] = getattr(agent, name, None)
            lists["median"][agent.rank] = median_work(agent)
            lists["timed"][agent.rank] = agent.recent_work[-1][0] if agent.recent_work else None
        return cls(tuple(a.rank for a in agents), **lists)

    def agents(self) -> list[AgentState]:
        out = []
        for r in self.ranks:
            agent = AgentState(
                self.host[r], r, self.pid[r], self.last_seen[r], self.step[r], self.progress_age[r],
                self.progress_received[r], self.exited[r], self.local_rank[r], self.max_steps[r],
                self.samples_per_step[r], self.last_line[r],
            )  # fmt: skip
            agent.work_median, agent.median_of = self.median[r], agent.recent_work  # no pairs: its median
            out.append(agent)
        return out

    def age_now(self, rank: int, now: float) -> float | None:
        age, received = self.progress_age[rank], self.progress_received[rank]
        return None if age is None or received is None else age + (now - received)


_PER_RANK = tuple(name for name in RankSnapshot.__dataclass_fields__ if name != "ranks")


def snapshot_of(agents: Sequence[AgentState] | RankSnapshot) -> RankSnapshot:
    return agents if isinstance(agents, RankSnapshot) else RankSnapshot.of_agents(agents)


SLOW_RATIO = 1.3
SUSTAIN = 5  # new steps in a row the rank must stay slow (each judged over work_window.WINDOW steps)
RATE_WINDOW_S = 30.0


def median_work(agent: AgentState) -> float | None:
    """The median of a rank's last WINDOW timed steps; computed once per new step (cached on the
    state: the live view and the straggler check ask for every rank every second)."""
    if agent.median_of is not agent.recent_work:
        agent.work_median = window_median(agent.recent_work)
        agent.median_of = agent.recent_work
    return agent.work_median


@dataclass(frozen=True)
class Straggler:
    host: str
    rank: int
    local_rank: int
    work_s: float
    others_s: float

    def line(self) -> str:
        return (
            f"straggler: host {self.host} rank {self.rank} (device {self.local_rank}) takes "
            f"{self.work_s / self.others_s:.1f}x the other ranks' work per step "
            f"({self.work_s:.2f}s against {self.others_s:.2f}s); every rank waits for it"
        )


@dataclass
class StragglerWatch:
    """Flags each slow rank once it has been slow over SUSTAIN new steps in a row.

    A judgment counts the new steps it covers (at most WINDOW, the steps its median spans; a rank's
    first counts one): a node's summary comes every 1-2 s and may carry several steps, and a rank is
    named after the same number of slow steps whatever that pace."""

    streak: dict[int, int] = field(default_factory=dict)
    judged_step: dict[int, int] = field(default_factory=dict)  # a rank's newest step already judged
    flagged: dict[int, Straggler] = field(default_factory=dict)

    def check(self, agents: Sequence[AgentState] | RankSnapshot) -> list[Straggler]:
        table = snapshot_of(agents)
        median, exited, timed = table.median, table.exited, table.timed
        works = {r: w for r in table.ranks if not exited[r] and (w := median[r]) is not None}
        ordered = sorted(works.values())  # each rank's "median of the others" is read from this one list
        new: list[Straggler] = []
        for rank in table.ranks:
            mine = works.get(rank)
            newest = timed[rank]
            judged = self.judged_step.get(rank)
            if mine is None or len(ordered) < 2 or newest is None or newest == judged:
                continue
            self.judged_step[rank] = newest
            typical = median_without(ordered, mine)
            slow = typical > 0 and mine > SLOW_RATIO * typical
            steps = 1 if judged is None else min(max(newest - judged, 1), WINDOW)
            self.streak[rank] = self.streak.get(rank, 0) + steps if slow else 0
            if self.streak[rank] >= SUSTAIN and rank not in self.flagged:
                self.flagged[rank] = Straggler(table.host[rank], rank, table.local_rank[rank], mine, typical)
                new.append(self.flagged[rank])
        return new


def median_without(ordered: Sequence[float], value: float) -> float:
    """statistics.median of `ordered` (sorted, holding `value`) with one `value` left out, in
    O(log N): the others' middle is the same list's middle, one place on when it lies past `value`."""
    gone = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def other(index: int) -> float:
        return ordered[index if index < gone else index + 1]

    middle = size // 2
    return other(middle) if size % 2 else (other(middle - 1) + other(middle)) / 2


@dataclass
class RateMeter:
    """Cluster steps per second from the steps the master saw over the last RATE_WINDOW_S."""

    points: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now: float, step: int) -> None:
        if not self.points or step != self.points[-1][1]:
            self.points.append((now, step))
        self.points = [p for p in self.points if now - p[0] <= RATE_WINDOW_S] or self.points[-1:]

    def steps_per_second(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def live_line(agents: Sequence[AgentState] | RankSnapshot, elapsed: float, rate: RateMeter) -> str:
    """`step 120/400 (30%) · 85.3 samples/s · elapsed 2:10 · ETA 4:40 · slowest: rank 2 on w2 0.41s`"""
    table = snapshot_of(agents)
    steps = [s for r in table.ranks if (s := table.step[r]) is not None]
    if not steps:
        return (
            f"waiting for the first step · {len(table.ranks)} ranks checked in · elapsed {_duration(elapsed)}"
        )
    step = min(steps)
    total = max((m for r in table.ranks if (m := table.max_steps[r])), default=None)
    parts = [f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"]
    per_second = rate.steps_per_second()
    samples = max((n for r in table.ranks if (n := table.samples_per_step[r])), default=None)
    if per_second and samples:
        parts.append(f"{per_second * samples:.1f} samples/s")
    parts.append(f"elapsed {_duration(elapsed)}")
    if per_second and total:
        parts.append(f"ETA {_duration((total - step) / per_second)}")
    timed = [(w, r) for r in table.ranks if (w := table.median[r]) is not None]
    if timed:
        work, slowest = max(timed, key=lambda pair: pair[0])
        parts.append(f"slowest: rank {slowest} on {table.host[slowest]} {work:.2f}s")
    return " · ".join(parts)


def status_rows(agents: Sequence[AgentState], now: float) -> list[dict[str, object]]:
    """One row per rank for `gaudi-cluster status` (JSON-ready)."""
    rows = []
    for agent in sorted(agents, key=lambda a: a.rank):
        work = median_work(agent)
        rows.append(
            {
                "host": agent.host,
                "rank": agent.rank,
                "local_rank": agent.local_rank,
                "state": "exited" if agent.exited else "running",
                "step": agent.step,
                "step_time_s": None if work is None else round(work, 4),
                "heartbeat_age_s": round(now - agent.last_seen, 1),
                "last_line": agent.last_line,
            }
        )
    return rows


def render_table(rows: Sequence[dict[str, object]]) -> str:
    header = ("HOST", "RANK", "DEVICE", "STATE", "STEP", "STEP TIME", "HEARTBEAT", "LAST LINE")
    cells = [header] + [
        (
            str(r["host"]),
            str(r["rank"]),
            str(r["local_rank"]),
            str(r["state"]),
            "-" if r["step"] is None else str(r["step"]),
            "-" if r["step_time_s"] is None else f"{r['step_time_s']:.2f}s",
            f"{r['heartbeat_age_s']}s ago",
            str(r["last_line"])[:60],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in cells)
