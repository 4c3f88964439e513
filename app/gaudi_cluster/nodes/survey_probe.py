"""The survey's probe of every node: over ssh (one session per node, in parallel) or, inside a Slurm
allocation, as one srun step (nodes/srun). The same `gaudi-cluster probe` command either way."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.nodes import srun_steps, ssh
from gaudi_cluster.nodes.find import FindSettings
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.wire.node_report import NodeReport, report_from_last_line
from gaudi_cluster.wire.private_payload import PayloadBundle, PrivatePayload


@dataclass(frozen=True)
class SurveySettings:
    """What the survey reads of the cluster's settings, and nothing else."""

    find: FindSettings
    wait_timeout: float
    ssh_port: int
    ssh_dir: str
    accelerator: str
    env_preset: str
    socket_ifname: str | None
    job_root: str
    dry_run: bool


def check_efa(config: SurveySettings, environ: Mapping[str, str]) -> bool:
    return environ.get("HCCL_OVER_OFI") == "1" or config.env_preset == "efa"


def check_fabric(config: SurveySettings) -> bool:
    """Whether HPU nodes report their libfabric providers: `auto` picks efa only when it sees one."""
    return config.accelerator in ("auto", "hpu") and config.env_preset in ("auto", "efa", "hostnic")


def probe_command(
    config: SurveySettings,
    paths: Sequence[str],
    environ: Mapping[str, str],
    job_id: str,
    staging: bool,
    output_dir: str | None,
) -> list[str]:
    """`gaudi-cluster probe` as every node runs it; `staging`: its stdin carries the private payload."""
    command = [sys.executable, "-m", "gaudi_cluster", "probe", "--json", "--accelerator", config.accelerator]
    if staging:
        command += ["--stage", job_id, "--job-root", config.job_root]
    for path in paths:
        command += ["--path", path]
    if output_dir:
        command += ["--output-dir", output_dir]
    if check_efa(config, environ):
        command.append("--check-efa")
    if check_fabric(config):
        command.append("--check-fabric")
    return command


def probe_nodes(
    config: SurveySettings,
    hosts: Sequence[str],
    paths: Sequence[str],
    ssh_config: Path,
    environ: Mapping[str, str],
    deadline: float,
    job_id: str,
    payload: Callable[[str], PrivatePayload] | None,
    output_dir: str | None = None,
) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """Run `gaudi-cluster probe` on every node at once over ssh: (reports by host, why-unreachable by
    host). With a payload (a launch, not the doctor), its stdin carries the node's private payload,
    which it stages in the job's directory there."""
    command = probe_command(config, paths, environ, job_id, payload is not None, output_dir)
    timeout = max(10.0, deadline - time.monotonic())
    stdin = (lambda host: payload(host).to_json()) if payload is not None else None
    results = ssh.run_on_hosts(hosts, command, ssh_config, timeout, stdin=stdin)
    reports: dict[str, NodeReport] = {}
    unreachable: dict[str, str] = {}
    for host, result in results.items():
        if not result.ok:
            unreachable[host] = ssh.explain_ssh_failure(result, config.ssh_port)
            continue
        lines = result.stdout.strip().splitlines()
        if not lines:
            unreachable[host] = f"probe printed nothing: {result.stderr[-200:]!r}"
            continue
        report = report_from_last_line(lines)
        if isinstance(report, NodeReport):
            reports[host] = report
        else:
            unreachable[host] = report
    return reports, unreachable


def probe_over_srun(
    config: SurveySettings,
    step: SrunStep,
    hosts: Sequence[str],
    paths: Sequence[str],
    environ: Mapping[str, str],
    deadline: float,
    job_id: str,
    payload: Callable[[str], PrivatePayload] | None,
    output_dir: str | None = None,
) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """The same probe as one srun step on every node (nodes/srun): stdin carries every node's payload."""
    command = [*probe_command(config, paths, environ, job_id, payload is not None, output_dir), "--srun-task"]
    bundle = PayloadBundle({host: payload(host) for host in hosts}).to_json() if payload else None
    return srun_steps.probe(step, hosts, command, max(10.0, deadline - time.monotonic()), bundle)
