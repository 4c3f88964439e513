"""A job's directory on a node (`<job root>/<job id>/`): its layout and its private file.

The private file holds what must never appear on a command line or in a log: variables forwarded
on purpose (--env-pass, secrets from the user's .deepspeed_env). The master stages it on every node
over ssh stdin (or writes it locally); each rank agent reads it before starting its rank.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.wire.private_payload import PrivatePayload, PrivatePayloadError

PRIVATE_FILE = "private.json"


def job_dir(job_root: str | Path, job_id: str) -> Path:
    return Path(job_root) / job_id


def _check_root(root: Path) -> None:
    """A job root another user could write into lets them plant the job's directory (or a link in
    its place) before us: refuse one not owned by us (or root) or open to others without the sticky
    bit (which keeps others from renaming or removing our entries, as in /tmp)."""
    st = root.stat()  # followed: a link to a directory of ours is as good as the directory
    owner_ok = st.st_uid in (os.getuid(), 0)
    open_to_others = bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(st.st_mode) or not owner_ok or open_to_others:
        raise ConfigError(
            f"job root {root} is not a directory of ours closed to others (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}); fix: --job-root a directory you own (chmod go-w), or one "
            "with the sticky bit like /tmp"
        )


def _check_own(path: Path) -> None:
    """The job's directory must be a real directory (not a link) that we made and no one else can
    write: one someone else made would give them our pid files, logs and the private file."""
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        kind = (
            "a symlink"
            if stat.S_ISLNK(st.st_mode)
            else f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
        )
        raise ConfigError(
            f"job directory {path} was not made by us ({kind}): someone else may be reading it; "
            f"fix: remove {path} (and check who made it), or use another --job-root"
        )


def create(job_root: str | Path, job_id: str) -> Path:
    """The job's directory, readable by its owner only (it holds pid files, logs, the private file),
    made by us: one that exists already is kept only if it is ours and closed to others."""
    root = Path(job_root)
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    _check_root(root)
    path = job_dir(root, job_id)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        _check_own(path)
    path.chmod(0o700)
    return path


def write_private_file(target: Path, text: str) -> Path:
    """Write `target` as 0600 from the start (never readable by others, even for an instant) through
    a new file (O_EXCL|O_NOFOLLOW: never a file or link someone planted), renamed over `target` (a
    link planted at `target` is replaced, not followed)."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def write_private(directory: Path, payload: PrivatePayload) -> Path:
    return write_private_file(directory / PRIVATE_FILE, payload.to_json())


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
