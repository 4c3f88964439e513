"""Random and adversarial control-channel lines, from a fixed seed: what a fuzz test feeds every reader.

Each line is one line's bytes without its newline: random bytes (non-UTF-8, non-ASCII, control
characters), and every message kind with each field in turn replaced by a wrong value (another
type, NaN, Infinity, a number of thousands of digits, non-ASCII text, nesting 993 deep, a string
of 60 KB), a key twice, a field left out, the line cut short. GAUDI_CLUSTER_FUZZ_LINES (how many
lines each reader gets) and GAUDI_CLUSTER_FUZZ_SEED make a run longer, or another one, by hand.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator

LINES = int(os.environ.get("GAUDI_CLUSTER_FUZZ_LINES", "10000"))
SEED = int(os.environ.get("GAUDI_CLUSTER_FUZZ_SEED", "36"))

HEX = "ab" * 32
TEMPLATES: list[dict[str, object]] = [
    {"type": "challenge", "nonce": HEX, "job": "job"},
    {"type": "hello", "job": "job", "node": "n", "host": "h", "rank": 0, "pid": 1, "nonce": HEX,
     "local_rank": 0},
    {"type": "hello", "job": "job", "node": "n", "host": "h", "rank": -1, "pid": 1, "nonce": HEX,
     "role": "node"},
    {"type": "welcome", "mac": HEX},
    {"type": "proof", "mac": HEX},
    {"type": "refused", "reason": "no", "rank": 0},
    {"type": "join", "host": "h", "rank": 0, "pid": 1, "node": "n", "local_rank": 0},
    {"type": "seated", "rank": 0},
    {"type": "beat", "step": 3, "max_steps": 9, "samples_per_step": 8, "progress_age": 0.5,
     "work": [[3, 0.25]], "last_line": "loss 2.0"},
    {"type": "summary", "ranks": [0], "steps": [3], "ages": [0.5], "timed": [3], "medians": [[0, 0.25]],
     "steady": [{"rank": 0, "last_line": "loss 2.0"}], "work": [[0, [[3, 0.25, 1]]]]},
    {"type": "exit", "code": 0, "signal": 15, "tail": ["bye"], "stop_reason": "stop", "rank": 0},
    {"type": "gone", "rank": 0, "reason": "left"},
    {"type": "stop", "grace": 1.0, "reason": "stop"},
]  # fmt: skip
WRONG: list[bytes] = [
    b"null", b"true", b"false", b"-1", b"0", b"1.5", b"-0.0", b"1e309", b"-1e309", b"NaN", b"Infinity",
    b"-Infinity", b"9" * 5000, b"1" * 40, b"-" + b"9" * 4300, b'""', b'"\\u00e9"', "\"é\"".encode(),
    b'"\\u001b[2J"', b'"\\ud800"', b'"\\u0000"', b'"\xff\xfe"', b"[]", b"{}", b"[[[]]]", b'{"a":{"b":{}}}',
    b"[" * 993 + b"]" * 993, b'{"x":' * 600 + b"1" + b"}" * 600, b'"' + b"x" * 60000 + b'"',
    ('"' + "é" * 64 + '"').encode(), b'"' + b"0" * 64 + b'"', b'"' + b"A" * 64 + b'"',
    b"[[1,2],[3]]", b'[[1,"x"]]', b"[[-1,1]]", b"[[1,1e309]]", b'["a","b"]', b"[1,2,3]",
    b'"beat"', b'"stop"', b'"node"', b'"rank"',
]  # fmt: skip


def _value(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _render(pairs: list[tuple[str, bytes]]) -> bytes:
    return b"{" + b",".join(_value(key) + b":" + value for key, value in pairs) + b"}"


def _mutant(rng: random.Random) -> bytes:
    template = rng.choice(TEMPLATES)
    pairs = [(key, _value(value)) for key, value in template.items()]
    how = rng.randrange(10)
    index = rng.randrange(len(pairs))
    if how < 6:  # one field (the type too) takes a wrong value
        pairs[index] = (pairs[index][0], rng.choice(WRONG))
    elif how == 6:  # a key twice, the second one wrong
        pairs.append((pairs[index][0], rng.choice(WRONG)))
    elif how == 7:  # a field left out
        del pairs[index]
    elif how == 8:  # an entry of a nested list or object wrong
        key = rng.choice([k for k, _ in pairs])
        pairs.append((key, b"[" + rng.choice(WRONG) + b"]"))
    else:  # a field no kind has, wrong
        pairs.append(("x" + str(rng.randrange(99)), rng.choice(WRONG)))
    line = _render(pairs)
    if rng.randrange(12) == 0:  # cut short
        line = line[: rng.randrange(1, len(line))]
    return line


def _noise(rng: random.Random) -> bytes:
    size = rng.choice((1, 2, 8, 64, 512, 4096, 60000))
    return rng.randbytes(size).replace(b"\n", b" ")


def lines(reader: str, count: int = LINES) -> Iterator[bytes]:
    """`count` lines for this reader (its name seeds its own stream: each reader gets the same lines
    on every run), none holding a newline, all under protocol.MAX_LINE."""
    rng = random.Random(f"{SEED}:{reader}")
    for _ in range(count):
        line = _noise(rng) if rng.randrange(4) == 0 else _mutant(rng)
        yield line.replace(b"\n", b" ")[:60000]


def sealable(line: bytes) -> bytes:
    """The line as `Session.seal_line` takes it (a JSON object's last brace at its end)."""
    return line if line.endswith(b"}") and len(line) > 2 else line + b'{"x":0}'
