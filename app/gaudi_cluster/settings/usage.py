"""User's machine, master or node: the argument parser every `gaudi-cluster` command shares. Pure."""

from __future__ import annotations

import argparse
from typing import NoReturn

from gaudi_cluster.errors import ConfigError

# Where per-job state lives on every node unless --job-root / GAUDI_CLUSTER_JOB_ROOT says otherwise.
DEFAULT_JOB_ROOT = "/run/gaudi-cluster/jobs"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (ConfigError, exit 2) and never abbreviates."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        # The caller's line already starts with `gaudi-cluster: error:`; the fix names this command.
        raise ConfigError(f"{message}; fix: see '{self.prog} --help'")


def examples(*lines: str) -> str:
    """An --help epilog of example command lines."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def add_job_root_flag(parser: argparse.ArgumentParser) -> None:
    """--job-root of the node-side commands (status, probe, reap); unset: the variable, then the default."""
    parser.add_argument(
        "--job-root",
        default=None,
        help=f"where per-job state lives (env GAUDI_CLUSTER_JOB_ROOT; default {DEFAULT_JOB_ROOT})",
    )
