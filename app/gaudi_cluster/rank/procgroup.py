"""The one way this project stops processes: a whole process group, SIGTERM, a grace, then SIGKILL.

Every rank, launcher and leftover is started in a process group of its own, so stopping it never
touches another job's processes (unlike a `pkill -f` on a name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(
    pgid: int,
    grace_s: float,
    *,
    done: Callable[[], bool] | None = None,
    poll_s: float = 0.05,
) -> None:
    """SIGTERM process group `pgid`, wait up to grace_s, then SIGKILL whatever is left of it.

    `done` tells when the group's leader has ended (e.g. Popen.poll); children that outlive their
    leader (dataloader workers, a launcher's ssh sessions) are killed either way. A grace of 0 skips
    straight to SIGKILL: for an abort, where nothing could be saved anyway.
    """
    finished = done or (lambda: not group_alive(pgid))
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while not finished() and time.monotonic() < deadline:
            time.sleep(poll_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
