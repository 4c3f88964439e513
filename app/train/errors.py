"""Error types run_clm prints as one line: bad input (exit code 2), a checkpoint it cannot write (1)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input (flag, file, path, device): one line naming the culprit and the fix; exit code 2."""

    exit_code = 2


class CheckpointWriteError(Exception):
    """A checkpoint could not be written (a full disk): one line naming the node, the path and the fix."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
