"""Which nodes the next attempt gets after a failure, and how its batch follows. Pure.

A node lost in an attempt is out for the rest of the job (unless the user takes returning nodes
back); a spare takes its place so that the world size does not change; with no spare left the job
shrinks while at least --min-nodes remain, keeping the global batch through gradient accumulation
where the arithmetic allows. Below the minimum the job stops, naming every node it lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.errors import ClusterNotReady

ACCUMULATION_FLAG = "--gradient_accumulation_steps"
PER_DEVICE_FLAG = "--per_device_train_batch_size"
# transformers' TrainingArguments defaults, what a Trainer job runs with when its argv names neither
DEFAULT_PER_DEVICE = 8
DEFAULT_ACCUMULATION = 1


@dataclass(frozen=True)
class NodeSet:
    """The nodes of one attempt: those that run ranks (in rank order) and the idle spares."""

    active: tuple[str, ...]
    spares: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()  # every node out for the rest of the job, in the order lost

    def to_json(self) -> dict[str, Any]:
        return {"active": list(self.active), "spares": list(self.spares), "excluded": list(self.excluded)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSet:
        return cls(tuple(data["active"]), tuple(data.get("spares", ())), tuple(data.get("excluded", ())))


@dataclass(frozen=True)
class BatchPlan:
    """The global batch before and after a change of world size (per device x accumulation x ranks)."""

    per_device: int
    accumulation_before: int
    accumulation: int
    world_before: int
    world: int

    @property
    def global_before(self) -> int:
        return self.per_device * self.accumulation_before * self.world_before

    @property
    def global_batch(self) -> int:
        return self.per_device * self.accumulation * self.world

    @property
    def exact(self) -> bool:
        return self.global_batch == self.global_before

    def line(self) -> str:
        kept = "kept" if self.exact else f"changed to {self.global_batch} (no whole accumulation keeps it)"
        return (
            f"world size {self.world_before} -> {self.world}: gradient accumulation "
            f"{self.accumulation_before} -> {self.accumulation}, global batch {self.global_before} {kept}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "per_device": self.per_device,
            "accumulation_before": self.accumulation_before,
            "accumulation": self.accumulation,
            "world_before": self.world_before,
            "world": self.world,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchPlan:
        return cls(**{name: int(data[name]) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AttemptPlan:
    """The next attempt: its nodes, what changed since the last one, and its batch."""

    nodes: NodeSet
    replaced: tuple[tuple[str, str], ...] = ()  # (lost node, the spare in its place)
    dropped: tuple[str, ...] = ()  # lost nodes nobody replaced: the job shrank
    batch: BatchPlan | None = None  # None: the world size did not change

    @property
    def newcomers(self) -> tuple[str, ...]:
        """Nodes that run ranks now but did not last attempt (they hold no checkpoint of this job)."""
        return tuple(spare for _, spare in self.replaced)

    def line(self) -> str:
        parts = [f"{lost} replaced by spare {spare}" for lost, spare in self.replaced]
        parts += [f"{lost} dropped" for lost in self.dropped]
        changed = "; ".join(parts) or "same nodes"
        left = len(self.nodes.spares)
        return f"next attempt on {len(self.nodes.active)} nodes ({changed}); spares left: {left}"

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes.to_json(),
            "replaced": [list(pair) for pair in self.replaced],
            "dropped": list(self.dropped),
            "batch": self.batch.to_json() if self.batch else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptPlan:
        batch = data.get("batch")
        return cls(
            NodeSet.from_json(data["nodes"]),
            tuple((lost, spare) for lost, spare in data.get("replaced", ())),
            tuple(data.get("dropped", ())),
            BatchPlan.from_json(batch) if batch else None,
        )


def renamed(plan: AttemptPlan, names: Mapping[str, str]) -> AttemptPlan:
    """The plan with each node under the name people know it by (its probe's host name)."""

    def name(hosts: Iterable[str]) -> tuple[str, ...]:
        return tuple(names.get(host, host) for host in hosts)

    nodes = NodeSet(name(plan.nodes.active), name(plan.nodes.spares), name(plan.nodes.excluded))
    replaced = tuple((names.get(lost, lost), names.get(spare, spare)) for lost, spare in plan.replaced)
    return AttemptPlan(nodes, replaced, name(plan.dropped), plan.batch)


def plan_next(
    previous: NodeSet,
    lost: Iterable[str],
    min_nodes: int | None,
    slots: Mapping[str, int],
    argv: Sequence[str] = (),
    names: Mapping[str, str] | None = None,
    take_back: bool = False,
) -> AttemptPlan:
    """The next attempt's nodes: each lost node's place goes to the next spare; with none left the job
    shrinks while at least `min_nodes` remain (None: it may not shrink). `slots`: ranks per node;
    `names`: how the stop line names a node (its host name), when that is not how it was reached;
    `take_back`: a lost node queues as the last spare (the next survey waits for it if it is taken)."""
    gone = [host for host in dict.fromkeys(lost) if host in previous.active or host in previous.spares]
    spares = [host for host in previous.spares if host not in gone] + (gone if take_back else [])
    active: list[str] = []
    replaced: list[tuple[str, str]] = []
    dropped: list[str] = []
    for host in previous.active:
        if host not in gone:
            active.append(host)
        elif spares:
            spare = spares.pop(0)
            active.append(spare)
            replaced.append((host, spare))
        else:
            dropped.append(host)
    out = () if take_back else tuple(host for host in gone if host not in previous.excluded)
    excluded = (*previous.excluded, *out)
    floor = len(previous.active) if min_nodes is None else min_nodes
    if len(active) < floor:
        fix = "bring the lost nodes back and run the job again" + (
            "" if min_nodes is not None else ", or let it shrink with --min-nodes (and add --spares)"
        )
        raise ClusterNotReady(
            f"lost node(s) {', '.join((names or {}).get(host, host) for host in excluded)}: "
            f"{len(active)} node(s) left, "
            f"{'--min-nodes ' + str(min_nodes) if min_nodes is not None else 'the job may not shrink'} "
            f"and no spare left; fix: {fix}"
        )
    batch = None
    world_before = sum(slots.get(host, 1) for host in previous.active)
    world = sum(slots.get(host, 1) for host in active)
    if world != world_before:
        batch = batch_plan(argv, world_before, world)
    return AttemptPlan(
        NodeSet(tuple(active), tuple(spares), excluded), tuple(replaced), tuple(dropped), batch
    )


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value given to `flag` (`--flag V` or `--flag=V`), as argparse keeps it."""
    found = None
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            found = argv[index + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def batch_plan(argv: Sequence[str], world_before: int, world: int) -> BatchPlan:
    """The accumulation that keeps per device x accumulation x world; the nearest one when none does."""
    per_device = _int_flag(argv, PER_DEVICE_FLAG, DEFAULT_PER_DEVICE)
    before = _int_flag(argv, ACCUMULATION_FLAG, DEFAULT_ACCUMULATION)
    target = before * world_before
    accumulation = max(1, round(target / world))
    return BatchPlan(per_device, before, accumulation, world_before, world)


def _int_flag(argv: Sequence[str], flag: str, default: int) -> int:
    value = flag_value(argv, flag)
    return int(value) if value is not None and value.isdigit() else default


def with_accumulation(argv: Sequence[str], accumulation: int) -> tuple[str, ...]:
    """`argv` with its gradient accumulation set (appended: argparse keeps the last value given)."""
    return (*argv, ACCUMULATION_FLAG, str(accumulation))


def trainer_job(argv: Sequence[str]) -> bool:
    """Whether the job takes transformers' batch flags, the only ones the master knows how to set."""
    return any(flag_value(argv, flag) is not None for flag in (PER_DEVICE_FLAG, ACCUMULATION_FLAG)) or any(
        word.endswith("run_clm.py") for word in argv
    )


def zero_problem(stage: int, node_local: bool, plan: AttemptPlan) -> str | None:
    """Why the job's ZeRO checkpoint cannot follow the planned nodes (None: it can).

    ZeRO 1-3 save each data-parallel rank's optimizer partition. With node-local storage a lost
    node's partitions were only on its disk; with shared storage they survive, but a new world size
    needs DeepSpeed's universal checkpoint (ds_to_universal.py, then checkpoint.load_universal),
    which the master does not run for the user. ZeRO 0 (the default job's) saves whole copies."""
    lost = [lost for lost, _ in plan.replaced] + list(plan.dropped)
    if stage < 1 or not lost:
        return None
    if node_local:
        return (
            f"the ZeRO-{stage} optimizer partitions of {', '.join(lost)} were saved only on its own disk "
            "(node-local checkpoints), so no node can resume them; fix: keep checkpoints on shared "
            "storage (--shared_output) or use ZeRO stage 0 for a job that must outlive a node"
        )
    if plan.batch is not None:
        return (
            f"the world size changes ({plan.batch.world_before} -> {plan.batch.world}) and ZeRO-{stage} "
            "partitions do not fit a new one; fix: convert the checkpoint with DeepSpeed's "
            'ds_to_universal.py and resume with "checkpoint": {"load_universal": true}, or add --spares'
        )
    return None
