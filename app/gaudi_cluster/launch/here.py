"""What the master checks and sets on its own node before any other node is touched: the open-file
limit, the job's script, the room for the status socket. A bad value found here is bad input (exit 2),
refused before a job directory exists anywhere."""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import resource
import shlex
from collections.abc import Sequence

from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.rank.jobdir import check_socket_room

log = logging.getLogger("gaudi_cluster.launch.here")


def raise_open_file_limit() -> None:
    """The soft limit on open files up to the hard one: a master holds a socket per rank and ssh
    processes per node, and 1024 (many Docker hosts' soft limit) is the wall at about 1,000 ranks."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.debug("open-file limit raised from %d to %d", soft, hard)


def check_before_survey(job_root: str, job_argv: Sequence[str], cwd: str, runs: bool) -> None:
    """`runs`: a job will start (not a dry run, which may plan for nodes this one is not)."""
    if runs:
        check_socket_room(job_root)
        check_script_here(job_argv, cwd)


def check_script_here(job_argv: Sequence[str], cwd: str) -> None:
    """A job's `script.py` that is not on this node (the master, always one of the job's nodes) is a
    typo; one missing only on another node is the preflight's to name, with that node."""
    argv = list(job_argv)[1:] if list(job_argv)[:1] == ["--"] else list(job_argv)
    if not argv or not argv[0].endswith(".py"):
        return
    path = os.path.normpath(os.path.join(cwd, argv[0]))
    if os.path.exists(path):
        return
    folder = os.path.dirname(path)
    try:
        near = difflib.get_close_matches(os.path.basename(path), os.listdir(folder), n=1, cutoff=0.75)
    except OSError:
        near = []
    hint = f"did you mean {os.path.join(os.path.dirname(argv[0]), near[0])}? " if near else ""
    raise ConfigError(
        f"the job's script {quoted(argv[0])} is not on this node ({quoted(path)} does not exist); "
        f"fix: {hint}check the path (ls {shlex.quote(folder)} lists what is there)"
    )
