"""How the command line's words split (the global flags, the command, the master's own flags, the job)
and the few flags the node-side commands (status, probe, reap) share."""

from __future__ import annotations

import argparse
import os
import re

from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.settings.flags import resolve_setting

# torchrun's --tee takes a value (0-3, or RANK:N,...); ours is a switch: `--tee 3` must not run `3`.
_TORCHRUN_TEE = r"[0-3]|\d+:[0-3](,\d+:[0-3])*"


def job_root(args: argparse.Namespace) -> str:
    """--job-root, then GAUDI_CLUSTER_JOB_ROOT, then the default: as the master reads it."""
    return resolve_setting("job_root", args.job_root, os.environ)


def split_job(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the master's own flags, the job): the job starts at the first word that is not one of the
    flags or their values, at `-m`, or after `--`."""
    takes_value = {
        option: action.nargs != 0 for action in parser._actions for option in action.option_strings
    }
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if word == "-m" or not word.startswith("-"):
            return argv[:i], argv[i:]
        name, equals, _ = word.partition("=")
        if name == "--tee" and not equals and i + 1 < len(argv) and re.fullmatch(_TORCHRUN_TEE, argv[i + 1]):
            raise ConfigError(
                f"--tee takes no value here (torchrun's --tee {quoted(argv[i + 1])} would make "
                f"{quoted(argv[i + 1])} the job); fix: --tee alone (every rank's output on the console)"
            )
        # A flag's value is skipped with it; an unknown flag stays with the flags, for argparse to name.
        i += 2 if takes_value.get(name) and not equals else 1
    return argv, []


def leading_words(argv: list[str]) -> tuple[list[str], list[str]]:
    """(global flags before the command, the rest)."""
    for i, word in enumerate(argv):
        if not word.startswith("-"):
            return argv[:i], argv[i:]
    return argv, []
