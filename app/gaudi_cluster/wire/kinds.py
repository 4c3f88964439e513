"""Runs in every process (master, node, rank, user's machine): the closed sets of names a setting, a
node report, a launch plan or a control message carries: device kinds, launchers, `.deepspeed_env`
presets and the control channel's message kinds (wire/messages parses and renders them). The
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


class MessageType(enum.Enum):
    CHALLENGE = "challenge"  # master -> agent or relay: the handshake's first word
    HELLO = "hello"  # agent or relay -> master: who it is
    WELCOME = "welcome"  # master -> agent or relay: the master proves the node's key
    PROOF = "proof"  # agent or relay -> master: it proves the node's key
    REFUSED = "refused"  # master -> agent or relay (and relay -> agent): turned away, with why
    JOIN = "join"  # agent -> relay -> master: a rank asks for its seat
    SEATED = "seated"  # master -> relay -> agent: the rank may start
    BEAT = "beat"  # both ways: a sign of life (from an agent, its rank's progress)
    SUMMARY = "summary"  # relay -> master: every rank of the node, every protocol.beat_every s
    OUTPUT = "output"  # agent -> relay -> master: a rank's output lines (the direct launcher's)
    EXIT = "exit"  # agent -> relay -> master: a rank ended
    GONE = "gone"  # relay -> master: an agent left without an exit
    STOP = "stop"  # master -> relay -> agent: stop the rank
    UNSTAGE = "unstage"  # master -> relay: every rank checked in; remove the node's private file
    REAPED = "reaped"  # relay -> master: after a stop, nothing of the job is left on the node
