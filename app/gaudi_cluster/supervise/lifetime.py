"""No thread of ours outlives the master's run.

A thread still running when the interpreter exits is frozen mid-work by the exit: one writing to the
console can leave the stream's lock taken (CPython then aborts: SIGABRT, exit 134), one importing or
inside a C extension can crash the shutdown. Every phase joins its own threads; this is the last
check, after all of them, and it names any thread that is left instead of letting the exit race it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

log = logging.getLogger("gaudi_cluster.supervise.lifetime")

LEFT_AT_EXIT = "threads still running at exit"


def others(existing: Collection[threading.Thread] = ()) -> list[threading.Thread]:
    """The live threads besides this one and those in `existing` (a caller's own, from before)."""
    return [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and t.is_alive() and t not in existing
    ]


def join_all(timeout_s: float = 5.0, existing: Collection[threading.Thread] = ()) -> list[str]:
    """Wait up to timeout_s for every other thread started since `existing` was taken to end
    (servers closed just before still have their last moment of work); returns the names of those
    left, logged as a warning."""
    deadline = time.monotonic() + timeout_s
    for thread in others(existing):
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in others(existing))
    if left:
        log.warning("%s: %s", LEFT_AT_EXIT, ", ".join(left))
    return left
