"""Checkpoints on one node's disk: what counts as complete, and the only ways one may disappear.

transformers' Trainer writes ``checkpoint-N`` piece by piece; a crash half-way leaves a directory that
looks like a checkpoint. Here a checkpoint only counts once it carries ``COMPLETE_MARKER``, and a save
goes (``train.callbacks`` drives it, ``train.timeline`` takes the decisions that need every rank):

1. the marker of an existing ``checkpoint-N`` goes first (``unmark``): a crash while the Trainer
   overwrites its files leaves it incomplete, never "complete" with old and new files mixed;
2. Trainer writes ``checkpoint-N`` (model, optimizer, scheduler, RNG, trainer_state.json) with its own
   rotation switched off;
3. barrier (every rank has written its part);
4. each writer (the local rank 0 of every node when nodes keep their own copy, else global rank 0)
   writes the marker file and fsyncs it and the directory;
5. barrier; then the ranks agree on the newest step complete on every node and each writer rotates
   by ``rotation_plan``, which never removes that step.

A checkpoint of an abandoned run (newer than the step the ranks agreed to resume from) is *demoted*:
renamed to ``abandoned-checkpoint-N``. Renamed rather than unmarked, because a later save of the same
step would otherwise write into it and mix two runs' files, and because no reader (this module, the
Trainer's ``get_last_checkpoint``, a user's ``--resume_from_checkpoint OUTPUT_DIR``) matches the new
name; its files stay for a person to look at until the job passes its step. Removal renames first
(``.deleting-*``), so a crash mid-delete never leaves a half-deleted checkpoint under a live name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

COMPLETE_MARKER = "gaudi-cluster-complete.json"
ABANDONED_PREFIX = "abandoned-"
DELETING_PREFIX = ".deleting-"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_ABANDONED_RE = re.compile(rf"^{ABANDONED_PREFIX}checkpoint-(\d+)$")


def checkpoint_step(path: str | Path) -> int | None:
    m = _CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """All ``checkpoint-N`` directories, sorted by N."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for child in out.iterdir():
        step = checkpoint_step(child)
        if step is not None and child.is_dir():
            found.append((step, child))
    return sorted(found)


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    return [(s, p) for s, p in list_checkpoints(output_dir) if is_complete(p)]


def latest_complete(output_dir: str | Path) -> tuple[int, Path] | None:
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


@dataclass(frozen=True)
class Inventory:
    """What one node's output_dir holds, by step (names for the half-deleted leftovers)."""

    complete: tuple[int, ...] = ()
    incomplete: tuple[int, ...] = ()
    abandoned: tuple[int, ...] = ()
    leftovers: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(map(str, steps))}"
            for label, steps in (
                ("complete", self.complete),
                ("incomplete", self.incomplete),
                ("abandoned", self.abandoned),
            )
            if steps
        ]
        if self.leftovers:
            parts.append(f"half-deleted {len(self.leftovers)}")
        return "; ".join(parts) or "no checkpoint"


def inventory(output_dir: str | Path) -> Inventory:
    out = Path(output_dir)
    if not out.is_dir():
        return Inventory()
    complete, incomplete, abandoned, leftovers = [], [], [], []
    for child in out.iterdir():
        name = child.name
        if name.startswith(DELETING_PREFIX):
            leftovers.append(name)
        elif (m := _CKPT_RE.match(name)) and child.is_dir():
            (complete if is_complete(child) else incomplete).append(int(m.group(1)))
        elif (m := _ABANDONED_RE.match(name)) and child.is_dir():
            abandoned.append(int(m.group(1)))
    return Inventory(
        tuple(sorted(complete)), tuple(sorted(incomplete)), tuple(sorted(abandoned)), tuple(sorted(leftovers))
    )


def rotation_plan(inv: Inventory, keep_step: int, save_total_limit: int | None) -> list[str]:
    """The names a writer may remove after a save, given the newest step complete on every node.

    ``keep_step`` is never removed (it is what a resume needs), nor is any complete checkpoint newer
    than it (it may be the only copy of a step some node still lacks); of the others, the newest
    ``save_total_limit`` complete ones stay. Incomplete checkpoints older than ``keep_step`` can never
    be completed (every rank has moved past them); abandoned ones go once the job has passed their step;
    half-deleted leftovers always go.
    """
    doomed = [f"checkpoint-{s}" for s in inv.incomplete if s < keep_step]
    if save_total_limit is not None and save_total_limit > 0 and keep_step >= 0:
        older = [s for s in inv.complete if s <= keep_step]
        kept = set(older[-save_total_limit:]) | {keep_step}
        doomed += [f"checkpoint-{s}" for s in older if s not in kept]
    doomed += [f"{ABANDONED_PREFIX}checkpoint-{s}" for s in inv.abandoned if s <= keep_step]
    return doomed + list(inv.leftovers)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory of a checkpoint to disk. The Trainer's and DeepSpeed's writers do
    not fsync; without this a power cut after the marker could leave a "complete" checkpoint whose
    files the kernel had not written yet."""
    for directory, _subdirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(directory))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_marker(checkpoint_dir: str | Path, step: int, world_size: int) -> None:
    """Mark a checkpoint complete once its files are on disk: fsync them, then write the marker to a
    temp file, fsync, rename, fsync the directory."""
    ckpt = Path(checkpoint_dir)
    # DeepSpeed writes its "latest" tag file on global rank 0 only; with node-local storage the other
    # nodes hold their global_stepN but no tag, and loading the checkpoint there would fail.
    tags = [p.name for p in ckpt.glob("global_step*") if p.is_dir() and p.name[11:].isdigit()]
    if tags and not (ckpt / "latest").exists():
        _write_atomically(ckpt / "latest", max(tags, key=lambda name: int(name[11:])))
    _fsync_tree(ckpt)
    tmp = ckpt / f".{COMPLETE_MARKER}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "world_size": world_size, "t": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt / COMPLETE_MARKER)
    _fsync_dir(ckpt)


def unmark(checkpoint_dir: str | Path) -> bool:
    """Drop an existing checkpoint's marker before anything is written into it (True: there was one).

    Every rank calls it before writing its own part, so no barrier is needed: the new marker only comes
    after the barrier that follows every rank's writes."""
    ckpt = Path(checkpoint_dir)
    try:
        (ckpt / COMPLETE_MARKER).unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(ckpt)
    return True


def remove_checkpoints(paths: Sequence[Path], on_renamed: Callable[[Path], None] | None = None) -> list[Path]:
    """Delete checkpoint directories; returns the ones this call removed.

    Each is renamed first, so that a crash mid-delete cannot leave a half-deleted "complete" checkpoint; a
    path that is already gone (another writer got there first) is skipped. ``on_renamed`` (fault drills)
    runs between the rename and the delete.
    """
    removed = []
    for path in paths:
        trash = (
            path
            if path.name.startswith(DELETING_PREFIX)
            else path.with_name(f"{DELETING_PREFIX}{path.name}-{os.getpid()}")
        )
        try:
            if trash != path:
                os.rename(path, trash)
        except OSError:
            continue
        if on_renamed is not None:
            on_renamed(trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def demote(output_dir: str | Path, newer_than: int) -> list[tuple[str, str]]:
    """Rename every ``checkpoint-N`` with N > ``newer_than`` to ``abandoned-checkpoint-N``; returns the
    (old, new) names. An older abandoned copy of the same step is removed first."""
    out = Path(output_dir)
    moved = []
    for step, path in list_checkpoints(out):
        if step <= newer_than:
            continue
        target = out / f"{ABANDONED_PREFIX}{path.name}"
        if target.exists():
            remove_checkpoints([target])
        os.rename(path, target)
        moved.append((path.name, target.name))
    if moved:
        _fsync_dir(out)
    return moved


def remove_all(output_dir: str | Path) -> list[Path]:
    """Every checkpoint, abandoned copy and leftover of output_dir (``--overwrite_output_dir``)."""
    out = Path(output_dir)
    inv = inventory(out)
    names = [f"checkpoint-{s}" for s in (*inv.complete, *inv.incomplete)]
    names += [f"{ABANDONED_PREFIX}checkpoint-{s}" for s in inv.abandoned] + list(inv.leftovers)
    return remove_checkpoints([out / name for name in names])


def looks_like_checkpoint(path: Path) -> bool:
    return (path / "trainer_state.json").is_file()


def saved_step(path: Path) -> int | None:
    """The step a checkpoint directory holds: from its name, else its trainer_state.json."""
    step = checkpoint_step(path)
    if step is not None:
        return step
    try:
        return int(json.loads((path / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_explicit(path_arg: str) -> Path:
    """What ``--resume_from_checkpoint PATH`` means: a checkpoint dir, or an output dir holding some.

    Raises FileNotFoundError with a one-line reason when there is nothing to resume from.
    """
    path = Path(path_arg).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--resume_from_checkpoint {path_arg}: no such file or directory")
    if path.is_dir() and (is_complete(path) or looks_like_checkpoint(path)):
        return path
    if path.is_dir():
        latest = latest_complete(path)
        if latest is not None:
            return latest[1]
    raise FileNotFoundError(
        f"--resume_from_checkpoint {path_arg}: not a checkpoint (no trainer_state.json) and holds no "
        "complete checkpoint-N"
    )


def free_bytes(path: str | Path) -> int | None:
    """Free space of the file system holding path (its nearest existing parent); None if unknown."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


# Below this a failed write is the disk's fault: torch.save on a full disk raises a RuntimeError
# ("unexpected pos ...") that never names ENOSPC, and leaves the file system at 0 bytes free.
FULL_DISK_BYTES = 1 << 20


def disk_full(error: BaseException, path: str | Path) -> bool:
    """Whether a failed checkpoint write was a full disk (ENOSPC anywhere in the chain, or no space left)."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "errno", None) == 28 or "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    free = free_bytes(path)
    return free is not None and free < FULL_DISK_BYTES
