"""Any process: the placeholders that stand for a program's token-like arguments on every command line.

A launcher's argv is readable by every local user (`ps`, /proc/PID/cmdline) on the master and on every
node, and DeepSpeed's runner logs its pdsh command. So the master (envfile.hide_secret_arguments) puts a
placeholder where a program argument carries a secret (`--hub_token X`, `--token=X`, `hub_token=X`, a
URL with userinfo) and stages the value in the job's private file (0600, on each node) under
GAUDI_CLUSTER_PRIVATE_ARG_<N>; the rank agent puts the value back (`restore`) just before it starts the
program. DeepSpeed's runner, pdsh, ssh, mpirun, launch.py, torchrun, our fanout and node processes and
the agent hold only the placeholder; the program's own process holds the value, as it asked for it as
an argument. Pure: imports nothing of ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

VARIABLE_PREFIX = "GAUDI_CLUSTER_PRIVATE_ARG_"
_PLACEHOLDER_RE = re.compile(r"@gaudi-cluster-private-arg-(\d+)@")


def placeholder(index: int) -> str:
    return f"@gaudi-cluster-private-arg-{index}@"


def variable(index: int) -> str:
    return f"{VARIABLE_PREFIX}{index}"


def is_private_argument(name: str) -> bool:
    """Whether a private file's variable carries a hidden argument (not for the program's environment)."""
    return name.startswith(VARIABLE_PREFIX)


class MissingPrivateArgument(LookupError):
    """A placeholder whose value is not in the private file (the agent was not started by our master)."""


def restore(program: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The program's argv with each placeholder replaced by its value from the private file."""

    def value(match: re.Match[str]) -> str:
        name = variable(int(match[1]))
        if name not in values:
            raise MissingPrivateArgument(
                f"the program's argument {match[0]} stands for {name}, which this node's private file "
                "lacks; fix: start ranks through gaudi-cluster master (it stages the value on every node)"
            )
        return values[name]

    return [_PLACEHOLDER_RE.sub(value, word) for word in program]
