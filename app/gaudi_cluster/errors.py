"""The few error types of gaudi-cluster, each bound to one exit code, and the one way every entry point
(cli, spawn, aws, nodewatch) turns the error that ends it into its stderr line and its exit code.

Exit codes: 0 ok, 1 job failure, 2 bad input, 3 cluster not ready, 128+N stopped by signal N.
"""

from __future__ import annotations

# How much of a value a message repeats: enough to recognise it, never a screenful.
SHOWN_CHARACTERS = 80


def quoted(value: object, limit: int = SHOWN_CHARACTERS) -> str:
    """A user's value as an error repeats it: quoted, control characters and terminal escapes written
    as escapes (repr's), and a long one cut with its length, so a message stays one readable line."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class GaudiClusterError(Exception):
    """Base class: the message is one line that names the culprit and the fix."""

    exit_code = 1


class ConfigError(GaudiClusterError):
    """Bad input (flag, env var, hostfile, env file, key): nothing was launched."""

    exit_code = 2


class ClusterNotReady(GaudiClusterError):
    """Peers missing at the deadline, unreachable, or failing the preflight: nothing was launched."""

    exit_code = 3


def exit_code_for(error: GaudiClusterError) -> int:
    """The process's exit code for an error that ends it (an AWS call failure binds its own per call)."""
    return error.exit_code


def signal_exit_code(signum: int) -> int:
    """A process stopped by signal N exits 128+N, as a shell reports it."""
    return 128 + signum


def error_line(
    error: GaudiClusterError, prog: str = "gaudi-cluster", *, tag_bad_input_only: bool = False
) -> str:
    """`PROG: error: MESSAGE`. gaudi_spawn.py tags only bad input that way, as its argparse would,
    and prints a failure of the run itself as `PROG: MESSAGE` (tag_bad_input_only)."""
    tagged = isinstance(error, ConfigError) or not tag_bad_input_only
    return f"{prog}: {'error: ' if tagged else ''}{error}"
