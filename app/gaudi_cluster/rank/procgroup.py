"""The one way this project stops processes: a whole process group (or one child that shares ours),
SIGTERM, a grace, then SIGKILL.

Every rank, launcher and leftover is started in a process group of its own, so stopping it never
touches another job's processes (unlike a `pkill -f` on a name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable


def _answers(send: Callable[[int, int], None], target: int) -> bool:
    """Whether signal 0 reaches `target` (a process we may not signal exists all the same)."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    return _answers(os.killpg, pgid)


def terminate(
    pgid: int,
    grace_s: float,
    *,
    done: Callable[[], bool] | None = None,
    poll_s: float = 0.05,
    group: bool = True,
) -> None:
    """SIGTERM process group `pgid`, wait up to grace_s, then SIGKILL whatever is left of it.

    `done` tells when the group's leader has ended (e.g. Popen.poll); children that outlive their
    leader (dataloader workers, a launcher's ssh sessions) are killed either way. A grace of 0 skips
    straight to SIGKILL: for an abort, where nothing could be saved anyway. With group=False `pgid`
    is one child's pid (one that shares its parent's group), signalled alone, and only while `done`
    says it runs: once it is reaped its pid may belong to another process.
    """
    send = os.killpg if group else os.kill
    finished = done or (lambda: not _answers(send, pgid))
    if not group and finished():
        return
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while not finished() and time.monotonic() < deadline:
            time.sleep(poll_s)
    if group or not finished():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pgid, signal.SIGKILL)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process once `parent` (the process that started it) ends, however
    it ends; False when `parent` is already gone (this process should leave now). What a process that
    ignores SIGTERM needs where nothing of its parent's may outlive it: a step's process tracker no
    longer sees it once its parent has died, as it is reparented."""
    import ctypes  # here: only such a process loads it

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == parent  # it may have died before the prctl, which then never fires
