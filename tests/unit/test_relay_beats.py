"""A node relay's `beats`: one message for the node's ranks, each field sent again only once changed."""

from __future__ import annotations

from gaudi_cluster.rank.relay_beats import NodeBeats
from gaudi_cluster.wire import protocol


def beat(
    step: int | None, age: float, work: list[list[float]] | None = None, line: str | None = None
) -> dict:
    message = {"type": "beat", "step": step, "progress_age": age, "work": work or []}
    if line is not None:
        message["last_line"] = line
    return message


def test_unchanged_fields_are_left_out_and_the_age_always_goes():
    beats = NodeBeats()
    beats.record(0, {**beat(5, 0.2, [[5, 1.5]], "loss 7.1"), "max_steps": 40})
    beats.record(1, beat(5, 0.3))
    first = beats.message([0, 1])
    assert first == {
        "type": "beats",
        "ranks": [
            {
                "rank": 0,
                "step": 5,
                "max_steps": 40,
                "last_line": "loss 7.1",
                "progress_age": 0.2,
                "work": [[5, 1.5]],
            },
            {"rank": 1, "step": 5, "progress_age": 0.3},
        ],
    }
    beats.record(0, {**beat(5, 1.2), "max_steps": 40})
    beats.record(1, beat(6, 0.1, [[6, 1.4]]))
    second = beats.message([0, 1])
    assert second["ranks"] == [
        {"rank": 0, "progress_age": 1.2},
        {"rank": 1, "step": 6, "progress_age": 0.1, "work": [[6, 1.4]]},
    ]
    assert protocol.problem(first, protocol.NODE_SESSION_MESSAGES) is None
    assert protocol.problem(second, protocol.NODE_SESSION_MESSAGES) is None


def test_work_between_two_messages_is_merged_and_bounded():
    beats = NodeBeats()
    for step in range(40):
        beats.record(3, beat(step, 0.0, [[step, 1.0]]))
    (entry,) = beats.message([3])["ranks"]
    assert [pair[0] for pair in entry["work"]] == list(range(40 - protocol.WORK_PER_BEAT, 40))
    assert "work" not in beats.message([3])["ranks"][0]  # sent once


def test_a_forgotten_rank_starts_afresh_and_a_rank_with_no_beat_yet_is_still_listed():
    beats = NodeBeats()
    beats.record(2, beat(9, 0.5))
    beats.message([2])
    beats.forget(2)
    beats.record(2, beat(9, 0.5))
    assert beats.message([2, 4])["ranks"] == [{"rank": 2, "step": 9, "progress_age": 0.5}, {"rank": 4}]
