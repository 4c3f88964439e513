"""Runs in every process (master, node, rank, user's machine): the closed sets of names a setting, a
node report or a launch plan carries: device kinds, launchers and `.deepspeed_env` presets. The
settings' choices and the registries (launch.launchers.LAUNCHERS, env.presets.PRESETS) are derived
from these, so a name cannot be added in one place and forgotten in the other. StrEnum: a member
equals its string, so JSON and environment values need no conversion. Pure.

Python 3.10 compatible (requires-python): the gaudi image runs this code on the Habana base's Python 3.10
(profiles.json `python`), which has no `enum.StrEnum`; `StrEnum` below behaves as 3.11's does."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    """`enum.StrEnum` (3.11+) for 3.10: a member is its value as a str, in str(), f-strings and JSON."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__


AUTO = "auto"  # the settings' "decide from what the nodes have"; never a device kind or preset itself


class Accelerator(StrEnum):
    HPU = "hpu"
    CUDA = "cuda"
    CPU = "cpu"


class LauncherName(StrEnum):
    DIRECT = "direct"  # ours: one node launcher a node, agents per rank
    DEEPSPEED = "deepspeed"  # DeepSpeed's runner over pdsh
    MPIRUN = "mpirun"
    TORCHRUN = "torchrun"


class EnvPreset(StrEnum):
    EFA = "efa"
    GAUDINIC = "gaudinic"
    HOSTNIC = "hostnic"
    CPU = "cpu"
    NONE = "none"
