"""The first phase of a job: who the nodes are and what each reports, all under ONE deadline.

discover the peers -> wait for every sshd -> probe every node in parallel over ssh -> NodeSurvey.
A static list or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the MPI
Operator list *every* node, and the first one is the rendezvous address (as DeepSpeed does).
A job whose only node is this one (no peer source, or a list naming only this node) runs locally:
no sshd, no keys and no ssh at all, as optimum-habana's single-node runs do.
The probe also stages the job's directory and private file on each node (from its stdin).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.env import presets
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.launch.program import resolve_accelerator
from gaudi_cluster.nodes import discovery, probe, ssh
from gaudi_cluster.rank import jobdir
from gaudi_cluster.settings.config import ClusterConfig

log = logging.getLogger("gaudi_cluster.nodes.survey")
LOOPBACK = "127.0.0.1"


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
    reports: Mapping[str, Mapping[str, Any]]
    unreachable: Mapping[str, str]
    local: bool = False  # the only node is this one: no ssh anywhere
    this_node: str | None = None  # the entry of `hosts` that is this machine, if it runs ranks
    control_dir: Path | None = None  # the shared ssh connections' sockets (released by release())

    def release(self) -> None:
        """Close the shared ssh connections of this survey (idempotent)."""
        if self.control_dir is not None and self.ssh_config is not None and self.control_dir.exists():
            ssh.close_connections(self.hosts, self.ssh_config)
            shutil.rmtree(self.control_dir, ignore_errors=True)

    # HCCL_SOCKET_IFNAME for the HPU presets: given, or the interface routing to the master; None: HCCL's.
    hccl_socket_ifname: str | None = None

    @property
    def master_report(self) -> Mapping[str, Any]:
        return self.reports.get(self.master_addr) or self.reports.get(self.hosts[0], {})


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _self_names(local_interfaces: Sequence[Mapping[str, Any]]) -> set[str]:
    names = {socket.gethostname(), "localhost", LOOPBACK, "::1"}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    for interface in local_interfaces:
        names.update(interface.get("addresses", []))
    return names


def discovery_spec(config: ClusterConfig, environ: Mapping[str, str]) -> discovery.DiscoverySpec | None:
    if config.peers or config.peers_dns or config.hostfile:
        return discovery.DiscoverySpec(peers=config.peers, dns=config.peers_dns, hostfile=config.hostfile)
    return discovery.detect_source(environ)


@dataclass(frozen=True)
class _Nodes:
    hosts: tuple[str, ...]
    master_addr: str
    requested_slots: dict[str, int | None]


def _static_count_check(found: int, expected: int | None, source: str, lists_every_node: bool) -> None:
    if expected is not None and found < expected:
        total = found if lists_every_node else found + 1
        raise ConfigError(
            f"--nodes {expected if lists_every_node else expected + 1} but the {source} names only {total} "
            f"node(s); fix: lower --nodes to {total} or list every node"
        )


def _find_nodes(
    config: ClusterConfig, environ: Mapping[str, str], self_names: set[str], local_addr: str, deadline: float
) -> _Nodes:
    spec = discovery_spec(config, environ)
    if spec is None:
        if config.nodes and config.nodes > 1:
            raise ConfigError(
                f"--nodes {config.nodes} but no peer source; fix: set --peers, --peers-dns or --hostfile "
                "(GAUDI_CLUSTER_PEERS / _PEERS_DNS / _HOSTFILE)"
            )
        return _Nodes(("localhost",), config.master_addr or LOOPBACK, {"localhost": config.slots})
    lists_every_node = bool(spec.hostfile or spec.slurm or spec.mpi_operator)
    source = discovery.describe_source(spec)

    def discover() -> list[discovery.Peer]:
        found = discovery.discover_once(spec, environ)
        return found if lists_every_node else [p for p in found if p.host not in self_names]

    expected = config.nodes if lists_every_node else (config.nodes - 1 if config.nodes else None)
    if spec.dns:
        peers = discovery.wait_for_peers(
            discover, expected, max(0.0, deadline - time.monotonic()), source=source
        )
    else:
        # A list does not grow while we wait: too short is bad input, now.
        peers = discover()
        _static_count_check(len(peers), expected, source, lists_every_node)
    if expected is not None and len(peers) > expected:
        log.info("using the first %d of the %d nodes in the %s (--nodes)", expected, len(peers), source)
        peers = peers[:expected]
    if config.slots is not None and any(p.slots for p in peers):
        log.info("--slots %d overrides the slots in the %s", config.slots, source)
    slots = {p.host: config.slots or p.slots for p in peers}
    if lists_every_node:
        return _Nodes(tuple(p.host for p in peers), config.master_addr or peers[0].host, slots)
    master = config.master_addr or local_addr
    return _Nodes((master, *(p.host for p in peers)), master, {master: config.slots, **slots})


def _local_only(nodes: _Nodes, self_names: set[str]) -> bool:
    return len(nodes.hosts) == 1 and nodes.hosts[0] in self_names


def survey_nodes(
    config: ClusterConfig,
    paths: Sequence[str],
    environ: Mapping[str, str],
    private: Mapping[str, Any] | None = None,
    output_dir: str | None = None,
) -> NodeSurvey:
    """Discover, wait for and probe every node under the one --wait-timeout deadline; `private` (the
    job's secret, variables forwarded privately) is staged into the private file on every node."""
    started = time.monotonic()
    deadline = started + config.wait_timeout
    local_interfaces = probe.interfaces()
    socket_ifname = config.socket_ifname or presets.default_socket_ifname(
        [i["name"] for i in local_interfaces]
    )
    local_addr = next(
        (i["addresses"][0] for i in local_interfaces if i["name"] == socket_ifname and i["addresses"]),
        socket.gethostname(),
    )
    self_names = _self_names(local_interfaces) | {local_addr}
    nodes = _find_nodes(config, environ, self_names, local_addr, deadline)
    local = _local_only(nodes, self_names)
    if local:
        host = nodes.hosts[0]
        nodes = _Nodes(nodes.hosts, config.master_addr or LOOPBACK, nodes.requested_slots)
        local_addr, socket_ifname = LOOPBACK, config.socket_ifname
        log.info("one node, this one (%s): launching locally, no ssh", host)
    else:
        log.info("nodes: %s (found in %.1fs)", ", ".join(nodes.hosts), time.monotonic() - started)
    common = {
        "this_node": next((host for host in nodes.hosts if host in self_names), None),
        "master_addr": nodes.master_addr,
        "local_addr": local_addr,
        "socket_ifname": socket_ifname,
        "hosts": nodes.hosts,
        "requested_slots": nodes.requested_slots,
        "local": local,
        "hccl_socket_ifname": _hccl_socket_ifname(config, nodes.master_addr, local_interfaces, local),
    }

    if config.dry_run:
        # Nothing is contacted and nothing is written: slots come from the peer list or the settings.
        kind = resolve_accelerator(config.accelerator, environ)
        reports = {host: {"accelerator": kind, "slots": 1, "interfaces": []} for host in nodes.hosts}
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
            jobdir.write_private(job_dir, private)
        report = probe.probe(
            paths,
            config.accelerator,
            None,
            _check_efa(config, environ),
            output_dir,
            _check_fabric(config, environ),
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

    silent = ssh.wait_for_sshd(nodes.hosts, config.ssh_port, deadline)
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
    ssh_config = ssh.write_ssh_config(job_dir, config.ssh_port, identity, control_dir=control_dir)
    ssh.open_connections(nodes.hosts, ssh_config, max(5.0, deadline - time.monotonic()))
    reports, unreachable = probe_nodes(
        config, nodes.hosts, paths, ssh_config, environ, deadline, job_id, private, output_dir
    )
    return NodeSurvey(
        job_id=job_id,
        job_dir=job_dir,
        ssh_config=ssh_config,
        paths=tuple(paths),
        reports=reports,
        unreachable=unreachable,
        control_dir=control_dir,
        **common,
    )


def _check_efa(config: ClusterConfig, environ: Mapping[str, str]) -> bool:
    return environ.get("HCCL_OVER_OFI") == "1" or config.env_preset == "efa"


def _hccl_socket_ifname(
    config: ClusterConfig, master_addr: str, local_interfaces: Sequence[Mapping[str, Any]], local: bool
) -> str | None:
    """Given, else (across nodes, on HPU) the interface that routes to the master, never a Gaudi NIC."""
    if config.socket_ifname or local or config.accelerator not in ("auto", "hpu"):
        return config.socket_ifname
    route = probe.route_ifname(master_addr, local_interfaces)
    return presets.hccl_socket_ifname(route, local_interfaces)


def _check_fabric(config: ClusterConfig, environ: Mapping[str, str]) -> bool:
    """Whether HPU nodes report their libfabric providers: `auto` picks efa only when it sees one."""
    return config.accelerator in ("auto", "hpu") and config.env_preset in ("auto", "efa", "hostnic")


def probe_nodes(
    config: ClusterConfig,
    hosts: Sequence[str],
    paths: Sequence[str],
    ssh_config: Path,
    environ: Mapping[str, str],
    deadline: float,
    job_id: str,
    payload: Mapping[str, Any] | None,
    output_dir: str | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Run `gaudi-cluster probe` on every node at once: (reports by host, why-unreachable by host).

    With a payload (a launch, not the doctor), its stdin carries the job's private payload, which it
    stages in the job's directory there.
    """
    command = [sys.executable, "-m", "gaudi_cluster", "probe", "--json", "--accelerator", config.accelerator]
    if payload is not None:
        command += ["--stage", job_id, "--job-root", config.job_root]
    for path in paths:
        command += ["--path", path]
    if output_dir:
        command += ["--output-dir", output_dir]
    if _check_efa(config, environ):
        command.append("--check-efa")
    if _check_fabric(config, environ):
        command.append("--check-fabric")
    timeout = max(10.0, deadline - time.monotonic())
    stdin = json.dumps(dict(payload)) if payload is not None else None
    results = ssh.run_on_hosts(hosts, command, ssh_config, timeout, stdin=stdin)
    reports: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for host, result in results.items():
        if not result.ok:
            unreachable[host] = ssh.explain_ssh_failure(result, config.ssh_port)
            continue
        try:
            reports[host] = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            unreachable[host] = f"probe printed no JSON: {result.stdout[-200:]!r} {result.stderr[-200:]!r}"
    return reports, unreachable
