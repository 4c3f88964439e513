"""A node relay's `summary`: one message for the node's ranks, flat lists of the hot fields, a median
or a steady field only once it changed, the work times in buckets every WORK_FLUSH_S."""

from __future__ import annotations

import json

from gaudi_cluster.rank.relay_beats import NodeBeats
from gaudi_cluster.wire import messages, protocol


def beat(
    step: int | None,
    age: float,
    work: list[list[float]] | None = None,
    line: str | None = None,
    max_steps: int | None = None,
) -> messages.Beat:
    pairs = tuple((int(s), float(w)) for s, w in work or [])
    return messages.Beat(step=step, max_steps=max_steps, progress_age=age, work=pairs, last_line=line)


def rendered(beats: NodeBeats, ranks: list[int], now: float = 0.0) -> dict:
    """The message as its line carries it (parsed back: what the master reads)."""
    message = beats.message(ranks, now)
    line = json.loads(json.dumps(messages.render(message)))
    assert messages.parse(line, messages.FROM_RELAY_SESSION) == message
    return line


def test_unchanged_fields_are_left_out_and_the_lists_always_go():
    beats = NodeBeats()
    beats.record(0, beat(5, 0.2, [[4, 1.5], [5, 1.5], [6, 1.0]], "loss 7.1", max_steps=40))
    beats.record(1, beat(5, 0.3))
    first = rendered(beats, [0, 1])
    assert first == {
        "type": "summary",
        "ranks": [0, 1],
        "steps": [5, 5],
        "ages": [0.2, 0.3],
        "timed": [6, None],
        "medians": [1.5, None],
        "steady": [{"rank": 0, "max_steps": 40, "last_line": "loss 7.1"}],
        "work": [[0, 4, 1.5, 1, 5, 1.5, 1, 6, 1.0, 1]],  # the first work times go at once
    }
    beats.record(0, beat(6, 1.2, [[7, 1.5]], max_steps=40))  # the median stays 1.5
    beats.record(1, beat(6, 0.1, [[6, 1.4]]))
    second = rendered(beats, [0, 1], now=1.0)
    assert second == {
        "type": "summary",
        "ranks": [0, 1],
        "steps": [6, 6],
        "ages": [1.2, 0.1],
        "timed": [7, 6],
    }
    third = rendered(beats, [0, 1], now=2.0)  # nobody beat since: their ages run on at the master
    assert third["ages"] == [None, None] and third["steps"] == [6, 6]


def test_work_times_go_every_flush_interval_in_bounded_buckets():
    beats = NodeBeats()
    beats.record(3, beat(1, 0.0, [[1, 1.0]]))
    assert rendered(beats, [3])["work"] == [[3, 1, 1.0, 1]]
    for step in range(2, 400):
        beats.record(3, beat(step, 0.0, [[step, 1.0]]))
    assert "work" not in rendered(beats, [3], now=protocol.WORK_FLUSH_S - 1)  # held
    ((rank, *flat),) = rendered(beats, [3], now=protocol.WORK_FLUSH_S)["work"]
    assert rank == 3 and len(flat) <= 3 * protocol.WORK_BUCKETS
    assert sum(flat[2::3]) == 398  # every step counted
    beats.record(3, beat(401, 0.0, [[401, 2.0]]))
    assert rendered(beats, [3], now=protocol.WORK_FLUSH_S + 1).get("work") is None
    last = beats.message([3], protocol.WORK_FLUSH_S + 2, flush=True)  # its rank's exit: at once
    assert messages.render(last)["work"] == [[3, 401, 2.0, 1]]


def test_a_forgotten_rank_starts_afresh_and_a_rank_with_no_beat_yet_is_still_listed():
    beats = NodeBeats()
    beats.record(2, beat(9, 0.5, line="x"))
    beats.message([2], 0.0)
    beats.forget(2)
    beats.record(2, beat(9, 0.5, line="x"))
    line = rendered(beats, [2, 4])
    assert (line["ranks"], line["steps"], line["ages"]) == ([2, 4], [9, None], [0.5, None])
    assert line["steady"] == [{"rank": 2, "last_line": "x"}]  # said again: the master has it afresh
