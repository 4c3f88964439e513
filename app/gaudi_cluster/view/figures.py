"""A running job's figures as one typed value: what the metrics endpoint serves. Pure.

Made on demand (a scrape) from copies of the agents' states, never kept per rank between scrapes,
so a job of thousands of ranks costs nothing while nobody asks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gaudi_cluster.view.jobview import AgentState, RateMeter, Straggler, median_work


@dataclass(frozen=True)
class RankFigures:
    host: str
    rank: int
    step: int | None
    work_s: float | None  # median own work per step over the recent steps (None: not enough steps yet)
    heartbeat_age_s: float
    exited: bool
    straggler: bool


@dataclass(frozen=True)
class JobFigures:
    job_id: str
    state: str
    restarts: int
    elapsed_s: float
    step: int | None  # the cluster's step: the slowest rank's
    max_steps: int | None
    samples_per_second: float | None
    stragglers: int
    ranks: tuple[RankFigures, ...]


def job_figures(
    agents: Sequence[AgentState],
    now: float,
    elapsed_s: float,
    rate: RateMeter,
    flagged: Mapping[int, Straggler],
    job_id: str,
    state: str,
    restarts: int,
) -> JobFigures:
    steps = [a.step for a in agents if a.step is not None]
    per_second = rate.steps_per_second()
    samples = max((a.samples_per_step for a in agents if a.samples_per_step), default=None)
    return JobFigures(
        job_id=job_id,
        state=state,
        restarts=restarts,
        elapsed_s=elapsed_s,
        step=min(steps) if steps else None,
        max_steps=max((a.max_steps for a in agents if a.max_steps), default=None),
        samples_per_second=per_second * samples if per_second and samples else None,
        stragglers=len(flagged),
        ranks=tuple(
            RankFigures(
                host=a.host,
                rank=a.rank,
                step=a.step,
                work_s=median_work(a),
                heartbeat_age_s=max(0.0, now - a.last_seen),
                exited=a.exited,
                straggler=a.rank in flagged,
            )
            for a in sorted(agents, key=lambda a: a.rank)
        ),
    )
