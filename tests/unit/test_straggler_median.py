"""The straggler check reads each rank's "median of the others" from one sorted list: the same
flags, figures and streaks as comparing each rank with every other one (the quadratic definition)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gaudi_cluster.view.jobview import (
    SLOW_RATIO,
    SUSTAIN,
    AgentState,
    Straggler,
    StragglerWatch,
    median_without,
    median_work,
)
from gaudi_cluster.wire.work_window import WINDOW


@dataclass
class QuadraticWatch:
    """The check as it was: for each rank, the median of a fresh list of every other rank's work."""

    streak: dict[int, int] = field(default_factory=dict)
    judged_step: dict[int, int] = field(default_factory=dict)
    flagged: dict[int, Straggler] = field(default_factory=dict)

    def check(self, agents: Sequence[AgentState]) -> list[Straggler]:
        works = {a.rank: w for a in agents if not a.exited and (w := median_work(a)) is not None}
        new = []
        for agent in agents:
            mine = works.get(agent.rank)
            others = [w for rank, w in works.items() if rank != agent.rank]
            newest = agent.recent_work[-1][0] if agent.recent_work else None
            judged = self.judged_step.get(agent.rank)
            if mine is None or not others or newest is None or newest == judged:
                continue
            self.judged_step[agent.rank] = newest
            typical = statistics.median(others)
            slow = typical > 0 and mine > SLOW_RATIO * typical
            steps = 1 if judged is None else min(max(newest - judged, 1), WINDOW)
            self.streak[agent.rank] = self.streak.get(agent.rank, 0) + steps if slow else 0
            if self.streak[agent.rank] >= SUSTAIN and agent.rank not in self.flagged:
                self.flagged[agent.rank] = Straggler(agent.host, agent.rank, agent.local_rank, mine, typical)
                new.append(self.flagged[agent.rank])
        return new


def test_median_without_one_value_is_statistics_median_of_the_rest():
    rng = random.Random(7)
    for size in range(2, 60):
        # Few distinct values: ties, the left-out value repeated, at either end.
        values = sorted(rng.choice([0.0, 0.1, 0.25, 0.4, 0.4, 1.3, 2.0]) for _ in range(size))
        for value in set(values):
            rest = list(values)
            rest.remove(value)
            assert median_without(values, value) == statistics.median(rest), (values, value)


def test_the_check_flags_the_same_ranks_with_the_same_figures_as_the_quadratic_one():
    rng = random.Random(25)
    named = 0
    for trial in range(20):
        size = rng.choice([1, 2, 3, 5, 8, 33, 200])
        speed = {rank: rng.choice([0.4, 0.4, 0.4, 0.41, 0.6, 0.9]) for rank in range(size)}
        history: dict[int, list[tuple[int, float]]] = {rank: [] for rank in range(size)}
        exited: set[int] = set()
        fast, slow = StragglerWatch(), QuadraticWatch()
        for _ in range(30):  # checks; some see a new step of a rank, some do not
            for rank in range(size):
                if rng.random() < 0.7:
                    step = len(history[rank]) + 1
                    history[rank].append((step, speed[rank] * rng.uniform(0.8, 1.25)))
            if rng.random() < 0.05:
                exited.add(rng.randrange(size))
            agents = [
                AgentState(f"h{rank // 8}", rank, 1000 + rank, 0.0, local_rank=rank % 8,
                           recent_work=tuple(history[rank][-64:]), exited=rank in exited)
                for rank in rng.sample(range(size), size)  # in no particular order
            ]  # fmt: skip
            assert fast.check(agents) == slow.check(agents), trial
            assert (fast.streak, fast.judged_step, fast.flagged) == (
                slow.streak,
                slow.judged_step,
                slow.flagged,
            )
        named += len(fast.flagged)
    assert named >= 10  # the data does name stragglers (and leaves others unnamed)
