"""One timeline of checkpoints across the ranks: where a run resumes, and what rotation may remove.

Every decision here is taken by all ranks together, each rank reading its own node's output_dir (with
shared storage they all read the same one) and only the writers changing it:

* **resume** (``choose_resume``): the newest step complete on every node (``newest_common_step``).
  Everything newer on any node belongs to an abandoned run and is demoted before training continues
  (``checkpoints.demote``), so that no later rotation can prefer it to the live run's checkpoints.
* **start afresh** (``--overwrite_output_dir``) is honoured on a job's first attempt only: a restart
  (the master's ``GAUDI_CLUSTER_ATTEMPT`` > 1) resumes instead, as does ``--resume_from_checkpoint``'s
  restart once output_dir holds a common checkpoint of its own.
* **rotation** (``rotate``): after a save, the ranks agree on the newest step complete on every node
  again, and no writer removes it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from train import checkpoints
from train.errors import UsageError

log = logging.getLogger("train.timeline")

ATTEMPT_VARIABLE = "GAUDI_CLUSTER_ATTEMPT"  # set by the master's launch (launch/prepare) on a restart


def attempt_number(env: Mapping[str, str]) -> int:
    """Which attempt of the job this is (1: the first): the master's count, else a restart count of
    torchrun's elastic agent or of a Slurm requeue."""
    for name, offset in (
        (ATTEMPT_VARIABLE, 0),
        ("TORCHELASTIC_RESTART_COUNT", 1),
        ("SLURM_RESTART_COUNT", 1),
    ):
        value = env.get(name, "").strip()
        if value.isdigit():
            return max(1, int(value) + offset)
    return 1


@dataclass(frozen=True)
class Collective:
    """The two collectives the decisions need (no-ops when the run is not distributed)."""

    dist_ready: bool
    device: Any = None

    def min(self, value: int) -> int:
        if not self.dist_ready:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def barrier(self) -> None:
        if self.dist_ready:
            import torch.distributed as dist

            dist.barrier()


def newest_common_step(steps: Sequence[int], collective: Collective) -> int:
    """The newest step in every rank's ``steps`` (-1: none); every rank must call it.

    Each round, a rank proposes its newest step not newer than the last agreed candidate and the ranks
    take the minimum: when every rank could propose the candidate itself it is common, otherwise the
    minimum is older and the next round checks that. Two all_reduces when the ranks agree.
    """
    candidate: int | None = None
    while True:
        mine = max((s for s in steps if candidate is None or s <= candidate), default=-1)
        agreed = collective.min(mine)
        if agreed < 0 or agreed == candidate:
            return agreed
        candidate = agreed


@dataclass(frozen=True)
class ResumeDecision:
    """Where this attempt starts; rank 0 records it as the ``resume`` event (the job report reads it)."""

    attempt: int
    step: int | None  # None: from step 0
    checkpoint: str | None
    why: str
    demoted: tuple[str, ...] = field(default=())  # on this node (rank 0's node in the event)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "demoted": list(self.demoted)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResumeDecision:
        return cls(
            attempt=int(data["attempt"]),
            step=None if data.get("step") is None else int(data["step"]),
            checkpoint=data.get("checkpoint"),
            why=str(data.get("why", "")),
            demoted=tuple(data.get("demoted", ())),
        )

    def line(self) -> str:
        """The one line a person reads about it."""
        prefix = f"attempt {self.attempt}: " if self.attempt > 1 else ""
        if self.step is None:
            return f"{prefix}training from step 0 ({self.why})"
        return f"{prefix}resuming from step {self.step} ({self.checkpoint}: {self.why})"


def _demote(out: Path, newer_than: int, writer: bool) -> tuple[str, ...]:
    if not writer:
        return ()
    moved = checkpoints.demote(out, newer_than)
    host = socket.gethostname()
    for old, new in moved:
        # a warning, so that every node's writer says it (only rank 0 logs at INFO)
        log.warning(
            "demoted %s on %s to %s: newer than step %d, where the ranks resume, so written by an "
            "abandoned run; kept until the job passes its step",
            old,
            host,
            new,
            newer_than,
        )
    return tuple(old for old, _ in moved)


def choose_resume(
    output_dir: str | Path,
    *,
    explicit: str | None,
    do_train: bool,
    start_afresh: bool,
    attempt: int,
    writer: bool,
    collective: Collective,
) -> ResumeDecision:
    """The checkpoint this attempt resumes from, after which output_dir holds one timeline; every rank
    must call it (``writer``: this rank changes its node's output_dir)."""
    out = Path(output_dir)
    if not do_train:
        return ResumeDecision(attempt, None, None, "not training")
    if explicit and attempt > 1:
        common = newest_common_step(checkpoints.inventory(out).complete, collective)
        if common >= 0:
            return _resume_at(
                out,
                common,
                attempt,
                writer,
                collective,
                "--resume_from_checkpoint applies "
                "to the first attempt only; the newest checkpoint complete on every node",
            )
    if explicit:
        path = checkpoints.resolve_explicit(explicit)
        step = checkpoints.saved_step(path)
        demoted = _demote(out, step, writer) if step is not None else ()
        collective.barrier()
        return ResumeDecision(attempt, step, str(path), "--resume_from_checkpoint", demoted)
    if start_afresh and attempt == 1:
        removed = checkpoints.remove_all(out) if writer else []
        if removed:
            log.warning("--overwrite_output_dir: removed %d checkpoint(s) from %s", len(removed), out)
        collective.barrier()
        return ResumeDecision(attempt, None, None, "--overwrite_output_dir")
    common = newest_common_step(checkpoints.inventory(out).complete, collective)
    why = "the newest checkpoint complete on every node"
    if start_afresh:
        why += "; --overwrite_output_dir applies to the first attempt only"
    return _resume_at(out, common, attempt, writer, collective, why)


def _resume_at(
    out: Path, step: int, attempt: int, writer: bool, collective: Collective, why: str
) -> ResumeDecision:
    demoted = _demote(out, step, writer)
    collective.barrier()  # nobody loads or saves before every writer has demoted
    if step < 0:
        return ResumeDecision(attempt, None, None, "no checkpoint is complete on every node", demoted)
    path = out / f"checkpoint-{step}"
    if not checkpoints.is_complete(path):  # only an outside hand gets here (a copy deleted meanwhile)
        raise UsageError(f"{path}: gone while the ranks agreed to resume from it; run the job again")
    return ResumeDecision(attempt, step, str(path), why, demoted)


def rotate(
    output_dir: str | Path,
    save_total_limit: int | None,
    *,
    writer: bool,
    collective: Collective,
    on_renamed: Callable[[Path], None] | None = None,
) -> list[Path]:
    """After a save: agree on the newest step complete on every node, then each writer removes what
    ``checkpoints.rotation_plan`` allows; every rank must call it."""
    out = Path(output_dir)
    inv = checkpoints.inventory(out)
    keep = newest_common_step(inv.complete, collective)
    if not writer:
        return []
    names = checkpoints.rotation_plan(inv, keep, save_total_limit)
    return checkpoints.remove_checkpoints([out / name for name in names], on_renamed)
