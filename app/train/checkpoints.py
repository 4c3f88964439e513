"""Atomic checkpoints and the choice of the checkpoint to resume from.

transformers' Trainer writes ``checkpoint-N`` piece by piece; a crash half-way leaves a directory that
looks like a checkpoint. Here a checkpoint only counts once it carries ``COMPLETE_MARKER``:

1. Trainer writes ``checkpoint-N`` (model, optimizer, scheduler, RNG, trainer_state.json) with its own
   rotation switched off;
2. barrier (every rank has written its part);
3. each writer (the local rank 0 of every node when nodes keep their own copy, else global rank 0)
   writes the marker file and fsyncs it and the directory;
4. barrier; then the writer rotates: it removes incomplete checkpoints older than the newest complete
   one and complete ones beyond ``save_total_limit``. The newest complete checkpoint is never removed,
   so at every instant a complete checkpoint to resume from exists.

Resume only considers complete checkpoints; distributed ranks agree on one step (see ``agree_on_step``);
``choose_resume`` is the whole decision (explicit path, start afresh, or the newest common checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from train.errors import UsageError

log = logging.getLogger("train.checkpoints")

COMPLETE_MARKER = "gaudi-cluster-complete.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_marker(checkpoint_dir: str | Path, step: int, world_size: int) -> None:
    """Mark a checkpoint complete: write to a temp file, fsync, rename, fsync the directory."""
    ckpt = Path(checkpoint_dir)
    # DeepSpeed writes its "latest" tag file on global rank 0 only; with node-local storage the other
    # nodes hold their global_stepN but no tag, and loading the checkpoint there would fail.
    tags = [p.name for p in ckpt.glob("global_step*") if p.is_dir() and p.name[11:].isdigit()]
    if tags and not (ckpt / "latest").exists():
        _write_atomically(ckpt / "latest", max(tags, key=lambda name: int(name[11:])))
    tmp = ckpt / f".{COMPLETE_MARKER}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "world_size": world_size, "t": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt / COMPLETE_MARKER)
    _fsync_dir(ckpt)


def rotate(output_dir: str | Path, save_total_limit: int | None) -> list[Path]:
    """Remove what is safe to remove (see the module docstring); returns the removed paths."""
    every = list_checkpoints(output_dir)
    done = [(s, p) for s, p in every if is_complete(p)]
    if not done:
        return []
    newest_done = done[-1][0]
    doomed = [p for s, p in every if s < newest_done and not is_complete(p)]
    if save_total_limit is not None and save_total_limit > 0:
        keep = max(1, save_total_limit)
        doomed += [p for _, p in done[:-keep]]
    return remove_checkpoints(doomed)


def remove_checkpoints(paths: list[Path]) -> list[Path]:
    """Delete checkpoint directories; returns the ones this call removed.

    Each is renamed first, so that a crash mid-delete cannot leave a half-deleted "complete" checkpoint; a
    path that is already gone (another writer got there first) is skipped.
    """
    removed = []
    for path in paths:
        trash = path.with_name(f".deleting-{path.name}-{os.getpid()}")
        try:
            os.rename(path, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def looks_like_checkpoint(path: Path) -> bool:
    return (path / "trainer_state.json").is_file()


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


def agree_on_step(local_step: int, dist_ready: bool, device: Any = None) -> int:
    """The newest step every rank has complete (-1: none).

    Each rank proposes its newest complete step; all_reduce(MIN) gives the newest one that is not newer
    than any rank's. The caller then checks that every rank actually has that step.
    """
    if not dist_ready:
        return local_step
    import torch
    import torch.distributed as dist

    t = torch.tensor([local_step], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def all_ranks_true(flag: bool, dist_ready: bool, device: Any = None) -> bool:
    if not dist_ready:
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def barrier(dist_ready: bool) -> None:
    if dist_ready:
        import torch.distributed as dist

        dist.barrier()


def choose_resume(
    output_dir: str | Path,
    *,
    explicit: str | None,
    do_train: bool,
    start_afresh: bool,
    may_delete: bool,
    dist_ready: bool,
    device: Any = None,
) -> str | None:
    """The checkpoint a run resumes from (None: from scratch); every rank must call it.

    ``--resume_from_checkpoint`` wins; a run that does not train resumes nothing; ``start_afresh``
    (``--overwrite_output_dir``) removes output_dir's checkpoints (on the ranks that ``may_delete``: the
    writers of checkpoints) and waits for every rank; otherwise the newest checkpoint complete on every rank.
    """
    out = Path(output_dir)
    if explicit:
        return str(resolve_explicit(explicit))
    if not do_train:
        return None
    if start_afresh:
        if may_delete:
            remove_checkpoints([path for _, path in list_checkpoints(out)])
        barrier(dist_ready)
        return None
    latest = latest_complete(out)
    step = agree_on_step(latest[0] if latest else -1, dist_ready, device)
    if step < 0:
        return None
    path = out / f"checkpoint-{step}"
    if not all_ranks_true(is_complete(path), dist_ready, device):
        raise UsageError(
            f"{out}: the ranks hold different complete checkpoints (newest common candidate {path.name} is "
            "missing somewhere); pass --resume_from_checkpoint or --overwrite_output_dir"
        )
    log.info("resuming from %s (newest complete checkpoint on every rank)", path)
    return str(path)
