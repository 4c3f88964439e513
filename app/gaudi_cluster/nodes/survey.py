"""The first phase of a job: who the nodes are and what each reports, all under ONE deadline.

discover the peers -> wait for every sshd -> probe every node in parallel over ssh -> NodeSurvey.
A static list or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the MPI
Operator list *every* node, and the first one is the rendezvous address (as DeepSpeed does).
A job whose only node is this one (no peer source, or a list naming only this node) runs locally:
no sshd, no keys and no ssh at all, as optimum-habana's single-node runs do.
The probe also stages the job's directory and private file on each node (from its stdin).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_cluster.env import presets
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.nodes import checks, probe, srun, ssh, world
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.nodes.discovery import LOOPBACK
from gaudi_cluster.nodes.find import FoundNodes, find_nodes, local_only
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.nodes.survey_probe import (
    SurveySettings,
    check_efa,
    check_fabric,
    probe_nodes,
    probe_over_srun,
)
from gaudi_cluster.rank import jobdir
from gaudi_cluster.wire.node_report import Interface, NodeReport, placeholder_reports
from gaudi_cluster.wire.private_payload import PrivatePayload

log = logging.getLogger("gaudi_cluster.nodes.survey")


@dataclass(frozen=True)
class NodeSurvey:
    """Who the nodes are and what each one reported."""

    job_id: str
    job_dir: Path
    ssh_config: Path | None  # None when nothing is reached over ssh (local run, dry run)
    master_addr: str  # where the ranks rendezvous (first node)
    local_addr: str  # where the control channel listens (the interface the ranks reach it on)
    socket_ifname: str | None
    hosts: tuple[str, ...]  # every node, master first
    requested_slots: Mapping[str, int | None]  # slots named by the peer list or settings; None: detect
    paths: tuple[str, ...]  # what must exist on every node
    reports: Mapping[str, NodeReport]
    unreachable: Mapping[str, str]
    local: bool = False  # the only node is this one: no ssh anywhere
    this_node: str | None = None  # the entry of `hosts` that is this machine, if it runs ranks
    control_dir: Path | None = None  # the shared ssh connections' sockets (released by release())
    # HCCL_SOCKET_IFNAME for the HPU presets: given, or the interface routing to the master; None: HCCL's.
    hccl_socket_ifname: str | None = None
    output_dir: str | None = None  # where the job writes (each probe measured its free disk there)
    spares: tuple[str, ...] = ()  # idle nodes that answered their probe (--spares); no ranks
    spare_reports: Mapping[str, NodeReport] = field(default_factory=dict)
    srun: SrunStep | None = None  # inside a Slurm allocation: every node is reached by srun steps

    @property
    def master_report(self) -> NodeReport | None:
        return self.reports.get(self.master_addr) or self.reports.get(self.hosts[0])

    def addresses(self) -> dict[str, frozenset[str]]:
        """Where each node's connections may come from: what its name resolves to and every IPv4
        address its probe reported (loopback for a local job)."""
        found = {}
        for host in self.hosts:
            report = self.reports.get(host)
            own = (
                {address for interface in report.interfaces for address in interface.addresses}
                if report
                else set()
            )
            local = {LOOPBACK, "::1"} if self.local else set()
            found[host] = frozenset(own | local | set(world.addresses_of(host)))
        return found

    def reached_by(self) -> str:
        """How the master reaches the nodes: srun steps inside Slurm (nodes/srun), ssh, or not (local)."""
        if self.srun is not None:
            return f"by srun (Slurm job {self.srun.job_id})"
        return "locally" if self.local else "over ssh"

    def node_name(self, host: str) -> str:
        """The host name a node's ranks report (its probe's), else the name the master reached it by."""
        report = self.reports.get(host) or self.spare_reports.get(host)
        return report.name_or(host) if report else host

    def preflight(self, env: Mapping[str, str], min_free_disk: int) -> list[checks.Finding]:
        """The preflight findings for this survey: what the doctor prints and what blocks a launch."""
        return checks.check_nodes(
            self.reports,
            self.unreachable,
            self.requested_slots,
            self.socket_ifname,
            env,
            self.paths,
            min_free_disk=min_free_disk,
        )

    def release(self) -> None:
        """Close the shared ssh connections of this survey and remove their sockets (idempotent)."""
        if self.control_dir is not None and self.ssh_config is not None and self.control_dir.exists():
            ssh.close_connections((*self.hosts, *self.spares), self.ssh_config)
            shutil.rmtree(self.control_dir, ignore_errors=True)


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def survey_nodes(
    config: SurveySettings,
    paths: Sequence[str],
    environ: Mapping[str, str],
    private: Callable[[str], PrivatePayload] | None = None,
    output_dir: str | None = None,
    chosen: FoundNodes | None = None,
) -> NodeSurvey:
    """Discover, wait for and probe every node under the one --wait-timeout deadline; `private` (for
    each node: its key, the variables forwarded privately) is staged into that node's private file.
    `chosen`: the nodes of a restart (the master's plan), used as they are instead of discovering."""
    started = time.monotonic()
    deadline = started + config.wait_timeout
    local_interfaces = probe.interfaces()
    socket_ifname = config.socket_ifname or presets.default_socket_ifname([i.name for i in local_interfaces])
    local_addr = next(
        (i.addresses[0] for i in local_interfaces if i.name == socket_ifname and i.addresses),
        socket.gethostname(),
    )
    self_names = world.self_names(local_interfaces) | {local_addr}
    nodes = chosen or find_nodes(config.find, environ, self_names, local_addr, deadline, world.REAL_WORLD)
    local = local_only(nodes, self_names)
    if local:
        host = nodes.hosts[0]
        nodes = FoundNodes(nodes.hosts, config.find.master_addr or LOOPBACK, nodes.requested_slots)
        local_addr, socket_ifname = LOOPBACK, config.socket_ifname
        log.info("one node, this one (%s): launching locally, no ssh", host)
    else:
        spares = f"; spares: {', '.join(nodes.spares)}" if nodes.spares else ""
        log.info("nodes: %s%s (found in %.1fs)", ", ".join(nodes.hosts), spares, time.monotonic() - started)
    common = {
        "this_node": next((host for host in nodes.hosts if host in self_names), None),
        "master_addr": nodes.master_addr,
        "local_addr": local_addr,
        "socket_ifname": socket_ifname,
        "hosts": nodes.hosts,
        "requested_slots": nodes.requested_slots,
        "local": local,
        "hccl_socket_ifname": _hccl_socket_ifname(config, nodes.master_addr, local_interfaces, local),
        "output_dir": output_dir,
    }

    if config.dry_run:
        # Nothing is contacted and nothing is written: slots come from the peer list or the settings.
        reports = placeholder_reports(nodes.hosts, resolve_accelerator(config.accelerator, environ))
        job_dir = jobdir.job_dir(config.job_root, "dry-run")
        return NodeSurvey(
            job_id="dry-run",
            job_dir=job_dir,
            ssh_config=None,
            paths=(),
            reports=reports,
            unreachable={},
            **common,
        )

    job_id = new_job_id()
    if local:
        job_dir = jobdir.create(config.job_root, job_id)
        if private is not None:
            jobdir.write_private(job_dir, private(nodes.hosts[0]))
        report = probe.probe(
            paths,
            config.accelerator,
            None,
            check_efa(config, environ),
            output_dir,
            check_fabric(config),
        )
        return NodeSurvey(
            job_id=job_id,
            job_dir=job_dir,
            ssh_config=None,
            paths=tuple(paths),
            reports={nodes.hosts[0]: report},
            unreachable={},
            **common,
        )

    step = srun.step_for(environ, shutil.which("srun"))
    if step is not None:
        log.info("inside Slurm job %d: probe, launch and clean-up through srun, no ssh", step.job_id)
        return _survey_over_srun(config, step, nodes, paths, environ, deadline, job_id, private, common)
    silent = ssh.wait_for_sshd(nodes.hosts, config.ssh_port, deadline)
    # A spare is not waited for: one that does not answer now is dropped, never delays the job.
    silent_spares = ssh.wait_for_sshd(nodes.spares, config.ssh_port, time.monotonic()) if nodes.spares else []
    spares = [host for host in nodes.spares if host not in silent_spares]
    if silent_spares:
        log.warning("spare(s) %s: sshd did not answer; left out", ", ".join(silent_spares))
    if silent:
        raise ClusterNotReady(
            f"sshd did not answer on port {config.ssh_port} within {config.wait_timeout:.0f}s on: "
            f"{', '.join(silent)}; fix: start those workers (or check --ssh-port / GAUDI_CLUSTER_SSH_PORT)"
        )
    job_dir = jobdir.create(config.job_root, job_id)
    identity = ssh.default_identity(Path(config.ssh_dir))
    if identity is not None:
        ssh.check_private_key(identity)
    control_dir = Path(tempfile.mkdtemp(prefix="gc-ssh-"))  # short: socket paths are capped at ~100
    host_trust = ssh.cluster_trust(Path(config.ssh_dir))
    if host_trust is None:
        log.warning(
            "host keys are not pinned: no %s in %s, so each node's key is trusted at first contact; "
            "fix: make keys (it adds the cluster's host CA and each node's certified key) and mount "
            ".keys/master on the master, .keys/nodes/NAME on each node",
            ssh.HOST_CA_NAME,
            config.ssh_dir,
        )
    elif ssh.is_shared_host_key(host_trust):
        log.warning(
            "every node serves one shared host key (Kubernetes, or a key directory from before the host "
            "CA), so a node can pass for another; fix: give each node its own certified key (make keys "
            "NAMES=..., mount .keys/master on the master, .keys/nodes/NAME on each node)"
        )
    ssh_config = ssh.write_ssh_config(
        job_dir, config.ssh_port, identity, control_dir=control_dir, host_trust=host_trust
    )
    everyone = (*nodes.hosts, *spares)
    ssh.open_connections(everyone, ssh_config, max(5.0, deadline - time.monotonic()))
    reports, unreachable = probe_nodes(
        config, everyone, paths, ssh_config, environ, deadline, job_id, private, output_dir
    )
    failed = [host for host in spares if host in unreachable]
    if failed:
        log.warning(
            "spare(s) %s: probe failed; left out", ", ".join(f"{h} ({unreachable[h]})" for h in failed)
        )
        ssh.close_connections(failed, ssh_config)
    spare_reports = {host: reports.pop(host) for host in spares if host in reports}
    return NodeSurvey(
        job_id=job_id,
        job_dir=job_dir,
        ssh_config=ssh_config,
        paths=tuple(paths),
        reports=reports,
        unreachable={host: why for host, why in unreachable.items() if host in nodes.hosts},
        control_dir=control_dir,
        spares=tuple(spare_reports),
        spare_reports=spare_reports,
        **common,
    )


def _survey_over_srun(
    config: SurveySettings,
    step: SrunStep,
    nodes: FoundNodes,
    paths: Sequence[str],
    environ: Mapping[str, str],
    deadline: float,
    job_id: str,
    private: Callable[[str], PrivatePayload] | None,
    common: Mapping[str, Any],
) -> NodeSurvey:
    job_dir = jobdir.create(config.job_root, job_id)
    everyone = (*nodes.hosts, *nodes.spares)
    output_dir = common["output_dir"]
    reports, unreachable = probe_over_srun(
        config, step, everyone, paths, environ, deadline, job_id, private, output_dir
    )
    failed = [host for host in nodes.spares if host in unreachable]
    if failed:
        left_out = ", ".join(f"{h} ({unreachable[h]})" for h in failed)
        log.warning("spare(s) %s: probe failed; left out", left_out)
    spare_reports = {host: reports.pop(host) for host in nodes.spares if host in reports}
    return NodeSurvey(
        job_id=job_id,
        job_dir=job_dir,
        ssh_config=None,
        paths=tuple(paths),
        reports=reports,
        unreachable={host: why for host, why in unreachable.items() if host in nodes.hosts},
        spares=tuple(spare_reports),
        spare_reports=spare_reports,
        srun=step,
        **common,
    )


def _hccl_socket_ifname(
    config: SurveySettings, master_addr: str, local_interfaces: Sequence[Interface], local: bool
) -> str | None:
    """Given, else (across nodes, on HPU) the interface that routes to the master, never a Gaudi NIC."""
    if config.socket_ifname or local or config.accelerator not in ("auto", "hpu"):
        return config.socket_ifname
    route = probe.route_ifname(master_addr, local_interfaces)
    return presets.hccl_socket_ifname(route, local_interfaces)
