"""The master's srun steps, run (nodes/srun plans them): one step for all nodes, never one per node."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gaudi_cluster.nodes import parallel, srun
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.wire.node_report import NodeReport, report_from_last_line

log = logging.getLogger("gaudi_cluster.nodes.srun")


def run_step(
    step: SrunStep,
    hosts: Sequence[str],
    command: Sequence[str],
    name: str,
    timeout_s: float,
    stdin: str | None = None,
    label: bool = False,
) -> parallel.Finished:
    """One task of `command` on each host, in one srun step; stdin (if any) reaches every task."""
    argv = [*step.argv(hosts, name, stdin=stdin is not None, label=label), *command]
    finished = parallel.run_all({name: argv}, timeout_s, lambda _key: stdin)
    return finished[name]


def probe(
    step: SrunStep, hosts: Sequence[str], command: Sequence[str], timeout_s: float, stdin: str | None
) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """The probe on every host in one labelled step: (reports by host, why-unreachable by host)."""
    done = run_step(step, hosts, command, "gc-probe", timeout_s, stdin=stdin, label=True)
    outputs = srun.outputs_by_node(done.stdout)
    errors = srun.task_errors(done.stderr)
    reports: dict[str, NodeReport] = {}
    unreachable: dict[str, str] = {}
    for host in hosts:
        lines = outputs.get(host)
        if not lines:
            unreachable[host] = _why(host, done, errors)
            continue
        report = report_from_last_line(lines)
        if isinstance(report, NodeReport):
            reports[host] = report
        else:
            unreachable[host] = report
    return reports, unreachable


def run_everywhere(
    step: SrunStep, hosts: Sequence[str], command: Sequence[str], name: str, timeout_s: float
) -> dict[str, str]:
    """`command` on every host in one step: why it failed, by host (empty when it did not)."""
    if not hosts:
        return {}
    done = run_step(step, hosts, command, name, timeout_s)
    if done.returncode == 0:
        return {}
    errors = srun.task_errors(done.stderr)
    if errors:
        return {host: why for host, why in errors.items() if host in hosts}
    return {host: _why(host, done, errors) for host in hosts}


def _why(host: str, done: parallel.Finished, errors: Mapping[str, str]) -> str:
    if host in errors:
        return f"srun: {errors[host]}"
    if done.returncode == 124:
        return f"the srun step timed out ({done.stderr.strip()[-200:]})"
    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
    return f"srun step exited with code {done.returncode}: {tail[0][-200:]}"
