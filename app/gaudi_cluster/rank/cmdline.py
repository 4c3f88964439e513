"""Rank (one the zygote forked): its command line as `ps`, `pgrep -f` and /proc/PID/cmdline show it.

The kernel reads a process's command line from that process's own memory: the argument strings it
was started with. A forked rank still holds its zygote's, so every rank listed as `python -u -m
gaudi_cluster.rank.zygote …`, and whatever finds a job's processes by their command line (`pgrep -f
train.py`, a monitoring agent, a cleanup script) missed every forked rank. The rank writes the command
a plain start would have run over those strings, as setproctitle(3) does: NUL-separated where it fits
the zygote's argument area; otherwise as one line, spaces between the words, running on over the
environment strings that follow (the kernel reads on into them when the area's last byte is not NUL),
cut to what fits. Those environment strings are the zygote's start environment: the rank sets its own
anew first (os.environ.clear() and update() move every variable libc knows into fresh memory).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StartStrings:
    """Where this process's argument and environment strings lie (/proc/PID/stat fields 48 to 51)."""

    arg_start: int
    arg_end: int
    env_start: int
    env_end: int

    @classmethod
    def of_self(cls) -> StartStrings | None:
        try:
            with open("/proc/self/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # comm may hold spaces and ')'
            found = cls(*(int(field) for field in fields[45:49]))  # fields[0] is field 3, state
        except (OSError, ValueError, TypeError):
            return None
        return found if 0 < found.arg_start < found.arg_end else None

    @property
    def room(self) -> int:
        """The bytes a command line may take: its own area, and the environment's where that follows."""
        contiguous = self.env_start == self.arg_end and self.env_end > self.env_start
        return (self.env_end if contiguous else self.arg_end) - self.arg_start


def laid_out(argv: Sequence[str], strings: StartStrings) -> bytes:
    """The bytes that make /proc/PID/cmdline show `argv` (pure): exactly `room` of them."""
    words = [os.fsencode(word) for word in argv]
    packed = b"\0".join(words) + b"\0"
    arg_room = strings.arg_end - strings.arg_start
    if len(packed) <= arg_room:  # the area's last byte stays NUL: the kernel reads the words as they are
        return packed.ljust(strings.room, b"\0")
    line = b" ".join(words)[: strings.room - 1]  # at least arg_room long: the area's last byte is not NUL
    return line.ljust(strings.room, b"\0")


def show(argv: Sequence[str]) -> bool:
    """Make this process's command line read `argv`; False where its strings cannot be found."""
    strings = StartStrings.of_self()
    if strings is None:
        return False
    data = laid_out(argv, strings)
    ctypes.memmove(strings.arg_start, data, len(data))
    return True
