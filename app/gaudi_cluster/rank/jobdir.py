"""A job's directory on a node (`<job root>/<job id>/`): its layout and its private file.

The private file holds what must never appear on a command line or in a log: variables forwarded
on purpose (--env-pass, secrets from the user's .deepspeed_env). The master stages it on every node
over ssh stdin (or writes it locally); each rank agent reads it before starting its rank.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.wire.private_payload import PrivatePayload, PrivatePayloadError

PRIVATE_FILE = "private.json"
STATUS_SOCKET = "status.sock"  # the master's, in its job's directory (view/status)
RELAY_SOCKET = "control.sock"  # the node relay's, in the job's directory on each node (rank/relay)
# A Unix socket's path holds at most 107 bytes (108 with its NUL, on Linux); a job id is 22 characters.
MAX_SOCKET_PATH = 107
_JOB_ID_CHARACTERS = len("20261130-120000-a1b2c3")
# A job id is one plain name (the master's are 20261130-120000-a1b2c3): never a path out of the root.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


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
    import secrets  # here: a rank agent, which only reads the private file, never needs it

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


def write_pid_file(path: Path, group: int, agent: int) -> None:
    """A rank's pid file, "<process group> <agent pid>" (what a reap ends), whole or not at all: a
    reap (or anyone) reading it mid-write would find it empty and skip the rank."""
    temporary = path.with_name(f".{path.name}.tmp")  # one writer per rank; not a *.pid a reap reads
    temporary.write_text(f"{group} {agent}\n")
    os.replace(temporary, path)


def write_private(directory: Path, payload: PrivatePayload) -> Path:
    return write_private_file(directory / PRIVATE_FILE, payload.to_json())


def stage(job_root: str | Path, job_id: str, payload: PrivatePayload) -> Path:
    directory = create(job_root, job_id)
    write_private(directory, payload)
    return directory


def relay_socket_path(directory: Path) -> str:
    """The node relay's socket as a path short enough for AF_UNIX (108 bytes): a long job root is
    reached through this process's own descriptor of the directory instead."""
    path = str(directory / RELAY_SOCKET)
    if len(path.encode()) < 100:
        return path
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{RELAY_SOCKET}"


def remove_private(directory: Path) -> None:
    """Delete the node's private file once every agent has read it (gone already: nothing to do)."""
    (directory / PRIVATE_FILE).unlink(missing_ok=True)


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
