"""A node relay's `beats`: one message for the node's ranks, each field sent again only once changed."""

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


def rendered(beats: NodeBeats, ranks: list[int]) -> dict:
    """The message as its line carries it (parsed back: what the master reads)."""
    message = beats.message(ranks)
    line = json.loads(json.dumps(messages.render(message)))
    assert messages.parse(line, messages.FROM_RELAY_SESSION) == message
    return line


def test_unchanged_fields_are_left_out_and_the_age_always_goes():
    beats = NodeBeats()
    beats.record(0, beat(5, 0.2, [[5, 1.5]], "loss 7.1", max_steps=40))
    beats.record(1, beat(5, 0.3))
    first = rendered(beats, [0, 1])
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
    beats.record(0, beat(5, 1.2, max_steps=40))
    beats.record(1, beat(6, 0.1, [[6, 1.4]]))
    second = rendered(beats, [0, 1])
    assert second["ranks"] == [
        {"rank": 0, "progress_age": 1.2},
        {"rank": 1, "step": 6, "progress_age": 0.1, "work": [[6, 1.4]]},
    ]


def test_work_between_two_messages_is_merged_and_bounded():
    beats = NodeBeats()
    for step in range(40):
        beats.record(3, beat(step, 0.0, [[step, 1.0]]))
    (entry,) = rendered(beats, [3])["ranks"]
    assert [pair[0] for pair in entry["work"]] == list(range(40 - protocol.WORK_PER_BEAT, 40))
    assert "work" not in rendered(beats, [3])["ranks"][0]  # sent once


def test_a_forgotten_rank_starts_afresh_and_a_rank_with_no_beat_yet_is_still_listed():
    beats = NodeBeats()
    beats.record(2, beat(9, 0.5))
    beats.message([2])
    beats.forget(2)
    beats.record(2, beat(9, 0.5))
    assert rendered(beats, [2, 4])["ranks"] == [{"rank": 2, "step": 9, "progress_age": 0.5}, {"rank": 4}]
