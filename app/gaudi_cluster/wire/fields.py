"""Runs in every control-plane process (master, node relay, rank agent): what a received line may
be before it is a message, pure. Its bytes become a JSON object only below MAX_DEPTH, without NaN,
Infinity or a key twice (`decode`); each field is checked with plain type() tests (thousands a
second at scale); whatever is wrong is a `BadMessage` with a one-line reason, values in it `shown`.
The messages themselves are in `messages`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_DEPTH = 16  # the deepest message (a relay's beats: object, list, object, list, pair) is 5
# Every number of a message (a step, a rank, a pid, seconds) is at most this: JSON carries ints of
# 4,300 digits, and a step past 2**63 from a rank's progress file broke the master's work history
# (OverflowError) and with it the node's one connection; an int past 10**308 is no float at all.
MAX_INT = 2**63 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BRACKETS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_OPEN = frozenset(b"[{")


class BadMessage(ValueError):
    """A line that is no well-formed message for its reader: the one-line reason to log."""


def shown(value: object, limit: int = 80) -> str:
    """A received value as a log line may show it: text quoted (escapes written as escapes) and a
    long one cut with its length, as `errors.quoted` does; anything else by its type (never str() of
    it: a list nested 1,000 deep is no text)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
    if type(value) in (int, float) and len(text := repr(value)) <= limit:
        return text
    return f"a {type(value).__name__}"


def text(message: Mapping[str, Any], name: str, limit: int, required: bool = True) -> str:
    value = message.get(name)
    if value is None and not required:
        return ""
    if type(value) is not str or len(value) > limit or (required and not value):
        raise BadMessage(f"{name} is not a text of 1 to {limit} characters")
    return value


def count(message: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = message.get(name, default)
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise BadMessage(f"{name} is not a non-negative 64-bit integer")
    return value


def optional_count(message: Mapping[str, Any], name: str) -> int | None:
    value = message.get(name)
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_INT):
        raise BadMessage(f"{name} is not a non-negative 64-bit integer")
    return value


def optional_number(message: Mapping[str, Any], name: str) -> float | None:
    value = message.get(name)
    if value is None:
        return None
    if not is_number(value):
        raise BadMessage(f"{name} is not a non-negative number")
    return float(value)


def is_number(value: object) -> bool:
    """A non-negative int or float of at most MAX_INT (float() takes it, and a relay's sums of
    them stay finite)."""
    return type(value) in (int, float) and 0 <= value <= MAX_INT  # type: ignore[operator]


def hex64(message: Mapping[str, Any], name: str) -> str:
    value = message.get(name)
    if type(value) is not str or not _HEX64.fullmatch(value):
        raise BadMessage(f"{name} is not 64 hex digits")
    return value


def rank_of(message: Mapping[str, Any], required: bool = True) -> int | None:
    if not required and message.get("rank") is None:
        return None
    return count(message, "rank")


def _unique(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise BadMessage("a key appears twice")
    return found


def _refuse_constant(name: str) -> Any:
    raise BadMessage(f"{name} is no number here")


def _too_deep(line: bytes) -> bool:
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for match in _BRACKETS.finditer(line):
        token = match.group()
        if len(token) == 1:  # a bracket, not a string
            depth += 1 if token[0] in _OPEN else -1
            if depth > MAX_DEPTH:
                return True
    return False


def decode(line: bytes) -> dict[str, Any]:
    """A line's JSON object; BadMessage when it is none (not UTF-8 JSON, nested past MAX_DEPTH, NaN
    or Infinity, a key twice, a number of thousands of digits)."""
    if _too_deep(line):
        raise BadMessage(f"nested deeper than {MAX_DEPTH}")
    try:
        message = json.loads(line, object_pairs_hook=_unique, parse_constant=_refuse_constant)
    except BadMessage:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise BadMessage("not JSON") from None
    if type(message) is not dict or not message:
        raise BadMessage("not a JSON object")
    return message
