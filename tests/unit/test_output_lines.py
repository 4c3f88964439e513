"""A rank's output on the control channel (`output`): how lines are cut into messages that each fit a
line of the channel, how a reader checks one; and the node process's word that its ranks are seated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gaudi_cluster.launch.node import all_seated
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import encode
from gaudi_cluster.wire.fields import BadMessage


def test_lines_become_the_fewest_messages_that_fit_in_order_a_long_one_cut():
    lines = ["short", "x" * 200_000, "é" * 30_000, "\x01" * 20_000, *map(str, range(1000))]
    batches = messages.output_batches(lines)
    assert all(len(encode(messages.render(b))) <= protocol.OUTPUT_BATCH_BYTES + 64 for b in batches)
    assert all(len(b.lines) <= protocol.OUTPUT_MAX_LINES for b in batches)
    carried = [line for b in batches for line in b.lines]
    assert carried[0] == "short" and carried[4:] == list(map(str, range(1000)))
    for whole, cut in zip(lines[1:4], carried[1:4], strict=True):
        per_char = len(json.dumps(whole[0])) - 2  # what one character costs escaped
        assert whole.startswith(cut) and len(cut) > 0.5 * protocol.OUTPUT_BATCH_BYTES / per_char
    assert messages.output_batches([]) == []


def test_an_output_message_round_trips_and_a_bad_one_is_named():
    sent = messages.Output(("a", "b c"), rank=3)
    assert messages.parse_line(encode(messages.render(sent)), messages.FROM_RELAY_SESSION) == sent
    for bad in ({"lines": []}, {"lines": "text"}, {"lines": [1]}, {"lines": ["a"] * 257}):
        with pytest.raises(BadMessage, match="lines is not a list of 1 to 256 texts"):
            messages.parse({"type": "output", **bad})
    with pytest.raises(BadMessage, match="not expected here"):  # an agent's own session carries none
        messages.parse({"type": "output", "lines": ["a"]}, messages.FROM_AGENT_SESSION)


def _agent(says: bytes) -> tuple[int, subprocess.Popen[bytes]]:
    ours, theirs = os.pipe()
    code = f"import os; os.write({theirs}, {says!r}) if {says!r} else None"
    process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs,))
    os.close(theirs)
    return ours, process


def test_the_node_hands_over_only_when_every_agent_said_it_was_seated():
    started = [_agent(b"1"), _agent(b"1")]
    assert all_seated([fd for fd, _ in started])
    started += [_agent(b"1"), _agent(b"")]  # one ended before its seat: the node process stays
    assert not all_seated([fd for fd, _ in started[2:]])
    for _, process in started:
        process.wait(timeout=10)
