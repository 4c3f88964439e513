"""Master: the first phase of a job: who the nodes are and what each reports, all under ONE deadline.

discover the peers -> wait for every sshd -> probe every node in parallel -> NodeSurvey. A static list
or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the MPI Operator list
*every* node, and the first one is the rendezvous address (as DeepSpeed does). A job whose only node
is this one (no peer source, or a list naming only this node) runs locally: no sshd, no keys and no
ssh at all, as optimum-habana's single-node runs do. The survey picks how the master reaches the
nodes (nodes/reach: local, ssh, or srun steps inside a Slurm allocation) and holds that Reach for
every later phase. The probe (`gaudi-cluster probe` on every node, the same command whatever reaches
it) also stages the job's directory and private file on each node (from its stdin).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gaudi_cluster.env import presets
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.nodes import checks, probe, srun, ssh, world
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.nodes.discovery import LOOPBACK
from gaudi_cluster.nodes.find import FindSettings, FoundNodes, find_nodes, local_only
from gaudi_cluster.nodes.reach import LocalReach, Reach, SrunReach, SshReach
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.rank import jobdir
from gaudi_cluster.wire.kinds import AUTO, Accelerator, EnvPreset
from gaudi_cluster.wire.node_report import Interface, NodeReport, placeholder_reports, report_from_last_line
from gaudi_cluster.wire.private_payload import PayloadBundle, PrivatePayload

log = logging.getLogger("gaudi_cluster.nodes.survey")


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


@dataclass(frozen=True)
class NodeSurvey:
    """Who the nodes are and what each one reported."""

    job_id: str
    job_dir: Path
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
    # HCCL_SOCKET_IFNAME for the HPU presets: given, or the interface routing to the master; None: HCCL's.
    hccl_socket_ifname: str | None = None
    output_dir: str | None = None  # where the job writes (each probe measured its free disk there)
    spares: tuple[str, ...] = ()  # idle nodes that answered their probe (--spares); no ranks
    spare_reports: Mapping[str, NodeReport] = field(default_factory=dict)
    # How every phase after the survey runs a command on the nodes (a dry run reaches none).
    reach: Reach = field(default_factory=LocalReach, repr=False)

    @property
    def ssh_config(self) -> Path | None:
        """The job's ssh client config, for the launchers that start ranks over ssh (None: no ssh)."""
        return self.reach.config if isinstance(self.reach, SshReach) else None

    @property
    def srun(self) -> SrunStep | None:
        """The job's srun step, for the direct launcher's start under Slurm (None: not inside one)."""
        return self.reach.step if isinstance(self.reach, SrunReach) else None

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
        return self.reach.how

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
        """End what the survey's reach holds open (the shared ssh connections; idempotent)."""
        self.reach.close()


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
        return NodeSurvey("dry-run", job_dir, paths=(), reports=reports, unreachable={}, **common)

    job_id = new_job_id()
    if local:
        job_dir = jobdir.create(config.job_root, job_id)
        if private is not None:
            jobdir.write_private(job_dir, private(nodes.hosts[0]))
        efa, fabric = check_efa(config, environ), check_fabric(config)
        report = probe.probe(paths, config.accelerator, None, efa, output_dir, fabric)
        reports, unreachable, spares, reach = {nodes.hosts[0]: report}, {}, (), LocalReach()
    else:
        reach, spares = reach_nodes(config, nodes, environ, deadline, job_id)
        job_dir = jobdir.create(config.job_root, job_id)
        command = probe_command(config, paths, environ, job_id, private is not None, output_dir)
        reports, unreachable = probe_nodes(reach, (*nodes.hosts, *spares), command, private, deadline)
        failed = [host for host in spares if host in unreachable]
        if failed:
            left_out = ", ".join(f"{h} ({unreachable[h]})" for h in failed)
            log.warning("spare(s) %s: probe failed; left out", left_out)
    spare_reports = {host: reports.pop(host) for host in spares if host in reports}
    return NodeSurvey(
        job_id,
        job_dir,
        paths=tuple(paths),
        reports=reports,
        unreachable={host: why for host, why in unreachable.items() if host in nodes.hosts},
        spares=tuple(spare_reports),
        spare_reports=spare_reports,
        reach=reach,
        **common,
    )


def reach_nodes(
    config: SurveySettings, nodes: FoundNodes, environ: Mapping[str, str], deadline: float, job_id: str
) -> tuple[Reach, tuple[str, ...]]:
    """How the master reaches the nodes, and the spares it can reach: srun steps inside a Slurm
    allocation (nodes/srun), else ssh once every sshd answers (a spare is not waited for)."""
    step = srun.step_for(environ, shutil.which("srun"))
    if step is not None:
        log.info("inside Slurm job %d: probe, launch and clean-up through srun, no ssh", step.job_id)
        return SrunReach(step), nodes.spares
    # Before any wait: a key directory that pins one key for every node is refused (ConfigError).
    host_trust = ssh.cluster_trust(Path(config.ssh_dir))
    # Said before the first knock: a master whose nodes' sshd are not up yet is waiting, not hung.
    log.info("waiting for sshd on port %d of %d node(s)", config.ssh_port, len(nodes.hosts))
    silent = ssh.wait_for_sshd(nodes.hosts, config.ssh_port, deadline)
    # A spare is not waited for: one that does not answer now is dropped, never delays the job.
    silent_spares = ssh.wait_for_sshd(nodes.spares, config.ssh_port, time.monotonic()) if nodes.spares else []
    spares = tuple(host for host in nodes.spares if host not in silent_spares)
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
    if host_trust is None:
        log.warning(
            "host keys are not pinned: no %s in %s, so each node's key is trusted at first contact; "
            "fix: make keys (it adds the cluster's host CA and each node's certified key) and mount "
            ".keys/master on the master, .keys/nodes/NAME on each node",
            ssh.HOST_CA_NAME,
            config.ssh_dir,
        )
    # Nodes found at a DNS name's addresses (now, or by the held master that wrote this hostfile):
    # each node's certificate names that DNS name.
    found_at = config.find.peers_dns or ssh.remembered_host_key_name(config.find.hostfile)
    alias = found_at if host_trust is not None else None
    if alias is not None:
        log.info("nodes found by DNS name %s: each must present a certificate naming %s", alias, alias)
    ssh_config = ssh.write_ssh_config(
        job_dir,
        config.ssh_port,
        identity,
        control_dir=control_dir,
        host_trust=host_trust,
        host_key_alias=alias,
    )
    reach = SshReach(ssh_config, config.ssh_port, control_dir, host_key_name=alias)
    reach.open((*nodes.hosts, *spares), max(5.0, deadline - time.monotonic()))
    return reach, spares


def check_efa(config: SurveySettings, environ: Mapping[str, str]) -> bool:
    return environ.get("HCCL_OVER_OFI") == "1" or config.env_preset == EnvPreset.EFA


def check_fabric(config: SurveySettings) -> bool:
    """Whether HPU nodes report their libfabric providers: `auto` picks efa only when it sees one."""
    fabric_presets = (AUTO, EnvPreset.EFA, EnvPreset.HOSTNIC)
    return config.accelerator in (AUTO, Accelerator.HPU) and config.env_preset in fabric_presets


def probe_command(
    config: SurveySettings,
    paths: Sequence[str],
    environ: Mapping[str, str],
    job_id: str,
    staging: bool,
    output_dir: str | None,
) -> list[str]:
    """The probe as every node runs it (its own entry, not the CLI's); `staging`: its stdin carries the
    private payload."""
    command = [sys.executable, "-m", probe.__name__, "--json", "--accelerator", config.accelerator]
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
    reach: Reach,
    hosts: Sequence[str],
    command: Sequence[str],
    private: Callable[[str], PrivatePayload] | None,
    deadline: float,
) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """The probe on every host at once: (reports by host, why-unreachable by host). `private`: each
    node's payload, sent on its own stdin (or, where every node gets the same stdin, in one bundle
    each takes its own entry from: `--srun-task`)."""
    stdin_of = None
    if private is not None and reach.shared_stdin:
        bundle = PayloadBundle({host: private(host) for host in hosts}).to_json()
        stdin_of = lambda _host: bundle  # noqa: E731
    elif private is not None:
        stdin_of = lambda host: private(host).to_json()  # noqa: E731
    if reach.shared_stdin:
        command = [*command, "--srun-task"]
    replies = reach.run(hosts, command, stdin_of, max(10.0, deadline - time.monotonic()), "gc-probe")
    reports: dict[str, NodeReport] = {}
    unreachable: dict[str, str] = {}
    for host, reply in replies.items():
        report = report_from_last_line(reply.lines) if reply.ok and reply.lines else None
        if isinstance(report, NodeReport):
            reports[host] = report
        else:
            unreachable[host] = report or reply.why or "probe printed nothing"
    return reports, unreachable


def _hccl_socket_ifname(
    config: SurveySettings, master_addr: str, local_interfaces: Sequence[Interface], local: bool
) -> str | None:
    """Given, else (across nodes, on HPU) the interface that routes to the master, never a Gaudi NIC."""
    if config.socket_ifname or local or config.accelerator not in (AUTO, Accelerator.HPU):
        return config.socket_ifname
    route = probe.route_ifname(master_addr, local_interfaces)
    return presets.hccl_socket_ifname(route, local_interfaces)
