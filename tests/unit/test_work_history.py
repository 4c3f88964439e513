"""A rank's work history stays bounded however long the job, and keeps what the report needs."""

from __future__ import annotations

import random
import sys

import pytest
from gaudi_cluster.view.history import WorkHistory
from gaudi_cluster.view.jobview import AgentState


def test_a_short_history_is_kept_step_by_step():
    history = WorkHistory([(1, 0.5), (2, 0.25)])
    history.extend([(3, 0.75)])
    assert list(history) == [(1, 0.5), (2, 0.25), (3, 0.75)] and len(history) == 3 and history.width == 1


def test_fifty_thousand_steps_keep_at_most_capacity_points_each_the_mean_of_its_steps():
    history = WorkHistory(capacity=256)
    for start in range(1, 50_001, 5):  # as beats bring them: a few steps at a time
        history.extend((step, 0.4 + (step % 7) * 0.01) for step in range(start, start + 5))
    assert 128 <= len(history) <= 256 and history.steps == 50_000
    points = list(history)
    steps = [step for step, _ in points]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] <= 50_000
    assert all(step % history.width == 0 for step in steps)  # aligned: ranks line up bucket by bucket
    # Each point is the mean of its bucket's steps: every step counted, none sampled away.
    width = history.width
    for first, mean in points[1:-1]:
        expected = [0.4 + (s % 7) * 0.01 for s in range(first, first + width)]
        assert mean == pytest.approx(sum(expected) / len(expected))


def test_a_periodic_slow_step_shows_in_every_point_instead_of_aliasing_away():
    history = WorkHistory(capacity=16)
    history.extend((step, 5.0 if step % 64 == 0 else 1.0) for step in range(1, 4097))
    means = [mean for _, mean in history][
        1:-1
    ]  # whole buckets (the first holds steps 1.., the last 4096 only)
    assert len(set(round(m, 9) for m in means)) == 1 and means[0] > 1.0


def test_ranks_fed_the_same_steps_line_up_and_late_steps_land_in_order():
    a, b = WorkHistory(capacity=32), WorkHistory(capacity=32)
    steps = list(range(1, 1001))
    a.extend((s, 1.0) for s in steps)
    random.Random(3).shuffle(steps)  # a resent beat, out of order
    b.extend((s, 1.0) for s in steps)
    assert [s for s, _ in a] == [s for s, _ in b] and a.width == b.width
    assert a == b and a.copy() == a and a.copy() is not a


def test_the_agent_state_holds_one_and_its_size_does_not_grow_with_steps():
    agent = AgentState("h", 0, 1, 0.0)
    agent.work_history.extend((s, 0.4) for s in range(1, 50_001))
    assert len(agent.work_history) <= 256
    arrays = (agent.work_history._keys, agent.work_history._sums, agent.work_history._counts)
    assert sum(sys.getsizeof(x) for x in arrays) < 8_000  # ~5 KB a rank; the list was ~6 MB


def test_capacity_below_two_is_refused():
    with pytest.raises(ValueError):
        WorkHistory(capacity=1)
