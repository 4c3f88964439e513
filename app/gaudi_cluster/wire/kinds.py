"""Runs in every process (master, node, rank, user's machine): the closed sets of names a setting, a
node report or a launch plan carries: device kinds, launchers and `.deepspeed_env` presets. The
settings' choices and the registries (launch.launchers.LAUNCHERS, env.presets.PRESETS) are derived
from these, so a name cannot be added in one place and forgotten in the other. StrEnum: a member
equals its string, so JSON and environment values need no conversion. Pure."""

from __future__ import annotations

import enum

AUTO = "auto"  # the settings' "decide from what the nodes have"; never a device kind or preset itself


class Accelerator(enum.StrEnum):
    HPU = "hpu"
    CUDA = "cuda"
    CPU = "cpu"


class LauncherName(enum.StrEnum):
    DIRECT = "direct"  # ours: one node launcher a node, agents per rank
    DEEPSPEED = "deepspeed"  # DeepSpeed's runner over pdsh
    MPIRUN = "mpirun"
    TORCHRUN = "torchrun"


class EnvPreset(enum.StrEnum):
    EFA = "efa"
    GAUDINIC = "gaudinic"
    HOSTNIC = "hostnic"
    CPU = "cpu"
    NONE = "none"
