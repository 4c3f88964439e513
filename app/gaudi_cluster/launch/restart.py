"""Master: the nodes and the program of a restart, from the attempt that failed (the plan is
launch/attempts): a RestartPlan."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.launch import attempts
from gaudi_cluster.nodes.find import FoundNodes
from gaudi_cluster.nodes.survey import NodeSurvey


@dataclass(frozen=True)
class RestartSettings:
    """What planning a restart reads of the cluster's settings, and nothing else."""

    min_nodes: int | None
    take_back: bool
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RestartPlan:
    """The next attempt: its plan by host and by node name, the nodes its survey uses as they are, its
    program (the batch kept through accumulation), the lines that tell the console."""

    planned: attempts.AttemptPlan
    shown: attempts.AttemptPlan
    nodes: FoundNodes
    program: tuple[str, ...]
    lines: tuple[str, ...]


def next_attempt(
    settings: RestartSettings,
    survey: NodeSurvey,
    ranks_by_host: Mapping[str, int],
    excluded: tuple[str, ...],
    lost: frozenset[str],
    program: Sequence[str],
) -> RestartPlan:
    """Lost nodes are out, spares take their places, the batch is kept through accumulation where the
    program takes transformers' flags; ClusterNotReady when fewer than --min-nodes are left. `lost`:
    the names of the nodes lost (the failure's host, the supervisor's lost hosts)."""
    by_name = {survey.node_name(host): host for host in (*survey.hosts, *survey.spares)}
    lost_hosts = {by_name.get(name, name) for name in lost}  # the ranks name their node as its probe did
    previous = attempts.NodeSet(survey.hosts, survey.spares, excluded)
    slots = {**{host: r.slots for host, r in survey.spare_reports.items()}, **ranks_by_host}
    names = {host: name for name, host in by_name.items()}
    planned = attempts.plan_next(
        previous, lost_hosts, settings.min_nodes, slots, program, names, settings.take_back
    )
    nodes = planned.nodes
    shown = attempts.renamed(planned, names)
    problem = attempts.zero_problem(zero_stage(program), node_local(program, settings.env), shown)
    if problem is not None:
        raise ClusterNotReady(problem)
    lines = [shown.line()] if planned.replaced or planned.dropped else []
    if planned.batch is not None:
        if attempts.trainer_job(program):
            program = attempts.with_accumulation(program, planned.batch.accumulation)
            lines.append(planned.batch.line())
        else:
            lines.append(
                f"world size {planned.batch.world_before} -> {planned.batch.world}; the job's own batch "
                "flags are unknown, so its global batch changes with it"
            )
    spares = nodes.spares  # a spare that does not answer the next survey is left out there
    master_addr = survey.master_addr if survey.master_addr in nodes.active else nodes.active[0]
    asked = {host: survey.requested_slots.get(host) for host in (*nodes.active, *spares)}
    found = FoundNodes(nodes.active, master_addr, asked, tuple(spares))
    return RestartPlan(planned, shown, found, tuple(program), tuple(lines))


def zero_stage(program: Sequence[str]) -> int:
    """The ZeRO stage of the job's --deepspeed config (0 when it names none or it cannot be read: the
    ranks then fail on it themselves, with their own words)."""
    path = attempts.flag_value(program, "--deepspeed")
    try:
        with open(os.path.abspath(path or "")) as fh:
            section = json.load(fh).get("zero_optimization") or {}
        return int(section.get("stage", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def node_local(program: Sequence[str], env: Sequence[tuple[str, str]]) -> bool:
    """Whether each node keeps its own checkpoints (train/arguments.py: unless --shared_output)."""
    shared = "--shared_output" in program or ("GAUDI_CLUSTER_SHARED_OUTPUT", "1") in env
    return not shared
