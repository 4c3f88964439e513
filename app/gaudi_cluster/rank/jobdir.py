"""A job's directory on a node (`<job root>/<job id>/`): its layout and its private file.

The private file holds what must never appear on a command line or in a log: variables forwarded
on purpose (--env-pass, secrets from the user's .deepspeed_env). The master stages it on every node
over ssh stdin (or writes it locally); each rank agent reads it before starting its rank.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.wire.private_payload import PrivatePayload, PrivatePayloadError

PRIVATE_FILE = "private.json"
STATUS_SOCKET = "status.sock"  # the master's, in its job's directory (view/status)
# A Unix socket's path holds at most 107 bytes (108 with its NUL, on Linux); a job id is 22 characters.
MAX_SOCKET_PATH = 107
_JOB_ID_CHARACTERS = len("20261130-120000-a1b2c3")
# A job id is one plain name (the master's are 20261130-120000-a1b2c3): never a path out of the root.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def job_dir(job_root: str | Path, job_id: str) -> Path:
    return Path(job_root) / job_id


def existing_job(job_root: str | Path, job_id: str) -> Path:
    """The directory of a job that ran here, for a user's --job-id; a ConfigError otherwise."""
    root = Path(job_root)
    check_job_id(job_id, "--job-id", root)
    path = job_dir(root, job_id)
    if not path.is_dir():
        raise ConfigError(f"no job {quoted(job_id)} under {root}; fix: {_known_jobs(root)}")
    return path


def check_job_id(job_id: str, flag: str, root: Path) -> None:
    if not _JOB_ID.fullmatch(job_id) or ".." in job_id:
        raise ConfigError(
            f"{flag} {quoted(job_id)} is not a job id (one name under --job-root, never a path); "
            f"fix: {_known_jobs(root)}"
        )


def _known_jobs(root: Path) -> str:
    """The newest job ids under root, as a fix names them (`ls` shows them all)."""
    try:
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and _JOB_ID.fullmatch(p.name))
    except OSError:
        names = []
    if not names:
        return f"none ran under {root} on this node (give the --job-root the master used)"
    return f"--job-id {names[-1]} (the newest here; ls {root} lists every job)"


def create(job_root: str | Path, job_id: str) -> Path:
    """The job's directory, readable by its owner only (it holds pid files, logs, the private file)."""
    path = job_dir(job_root, job_id)
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(directory: Path, payload: PrivatePayload) -> Path:
    """Write the private file as 0600 from the start (never world-readable, even for an instant)."""
    target = directory / PRIVATE_FILE
    temporary = directory / f".{PRIVATE_FILE}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(payload.to_json())
    os.replace(temporary, target)
    return target


def stage(job_root: str | Path, job_id: str, payload: PrivatePayload) -> Path:
    directory = create(job_root, job_id)
    write_private(directory, payload)
    return directory


def read_private(directory: Path) -> PrivatePayload | None:
    """The private payload, or None when the master staged none (e.g. a hand-started agent) or the
    file is not one this version writes (the agent then has no key, and the master refuses it)."""
    try:
        return PrivatePayload.from_json((directory / PRIVATE_FILE).read_text())
    except (OSError, PrivatePayloadError):
        return None


def check_socket_room(job_root: str | Path) -> None:
    """Refuse, before anything starts, a job root too long for the status socket of its jobs."""
    length = len(os.fsencode(str(Path(job_root) / ("x" * _JOB_ID_CHARACTERS) / STATUS_SOCKET)))
    if length > MAX_SOCKET_PATH:
        room = MAX_SOCKET_PATH - (length - len(os.fsencode(str(job_root))))
        raise ConfigError(
            f"the job root {quoted(job_root)} is too long: its jobs' status socket path would be {length} "
            f"bytes, over the {MAX_SOCKET_PATH} a Unix socket path holds; fix: --job-root /tmp/gaudi-jobs "
            f"(or GAUDI_CLUSTER_JOB_ROOT=/tmp/gaudi-jobs; any path of at most {room} bytes)"
        )
