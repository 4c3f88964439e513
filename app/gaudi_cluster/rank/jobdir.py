"""A job's directory on a node (`<job root>/<job id>/`): its layout and its private file.

The private file holds what must never appear on a command line or in a log: variables forwarded
on purpose (--env-pass, secrets from the user's .deepspeed_env). The master stages it on every node
over ssh stdin (or writes it locally); each rank agent reads it before starting its rank.
"""

from __future__ import annotations

import os
from pathlib import Path

from gaudi_cluster.wire.private_payload import PrivatePayload, PrivatePayloadError

PRIVATE_FILE = "private.json"


def job_dir(job_root: str | Path, job_id: str) -> Path:
    return Path(job_root) / job_id


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
