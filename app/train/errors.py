"""Error type for bad input: run_clm prints its one-line message and exits with code 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input (flag, file, path, device): one line naming the culprit and the fix; exit code 2."""

    exit_code = 2


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
