"""The first phase of a job: who the nodes are and what each reports, all under ONE deadline.

discover the peers -> wait for every sshd -> probe every node in parallel over ssh -> NodeSurvey.
A static list or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the MPI
Operator list *every* node, and the first one is the rendezvous address (as DeepSpeed does).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster import discovery, envfile, probe, ssh
from gaudi_cluster.config import ClusterConfig
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.program import resolve_accelerator

log = logging.getLogger("gaudi_cluster.survey")


@dataclass(frozen=True)
class NodeSurvey:
    """Who the nodes are and what each one reported over ssh."""

    job_id: str
    job_dir: Path
    ssh_config: Path | None  # None in a dry run: nothing was written
    master_addr: str  # where the ranks rendezvous (first node)
    local_addr: str  # where this process listens (the control channel)
    socket_ifname: str | None
    hosts: tuple[str, ...]  # every node, master first
    requested_slots: Mapping[str, int | None]  # slots named by the peer list or settings; None: detect
    paths: tuple[str, ...]  # what must exist on every node
    reports: Mapping[str, Mapping[str, Any]]
    unreachable: Mapping[str, str]

    @property
    def master_report(self) -> Mapping[str, Any]:
        return self.reports.get(self.master_addr, {})


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _self_names(local_interfaces: Sequence[Mapping[str, Any]]) -> set[str]:
    names = {socket.gethostname(), "localhost", "127.0.0.1"}
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
        master = config.master_addr or local_addr
        return _Nodes((master,), master, {master: config.slots})
    lists_every_node = bool(spec.hostfile or spec.slurm or spec.mpi_operator)

    def discover() -> list[discovery.Peer]:
        found = discovery.discover_once(spec, environ)
        return found if lists_every_node else [p for p in found if p.host not in self_names]

    expected = config.nodes if lists_every_node else (config.nodes - 1 if config.nodes else None)
    peers = discovery.wait_for_peers(
        discover, expected, max(0.0, deadline - time.monotonic()), source=discovery.describe_source(spec)
    )
    if lists_every_node:
        master = config.master_addr or peers[0].host
        slots = {peers[0].host: peers[0].slots or config.slots}
        slots.update({p.host: p.slots or config.slots for p in peers[1:]})
        return _Nodes(tuple(p.host for p in peers), master, slots)
    master = config.master_addr or local_addr
    slots = {master: config.slots, **{p.host: p.slots or config.slots for p in peers}}
    return _Nodes((master, *(p.host for p in peers)), master, slots)


def survey_nodes(config: ClusterConfig, paths: Sequence[str], environ: Mapping[str, str]) -> NodeSurvey:
    """Discover, wait for and probe every node under the one --wait-timeout deadline."""
    started = time.monotonic()
    deadline = started + config.wait_timeout
    local_interfaces = probe.interfaces()
    socket_ifname = config.socket_ifname or envfile.default_socket_ifname(
        [i["name"] for i in local_interfaces]
    )
    local_addr = next(
        (i["addresses"][0] for i in local_interfaces if i["name"] == socket_ifname and i["addresses"]),
        socket.gethostname(),
    )
    self_names = _self_names(local_interfaces) | {local_addr}
    nodes = _find_nodes(config, environ, self_names, local_addr, deadline)
    log.info("nodes: %s (found in %.1fs)", ", ".join(nodes.hosts), time.monotonic() - started)

    if config.dry_run:
        # Nothing is contacted: slots come from the peer list or the settings.
        kind = resolve_accelerator(config.accelerator, environ)
        job_dir = Path(config.job_root) / "dry-run"
        return NodeSurvey(
            job_id="dry-run",
            job_dir=job_dir,
            ssh_config=None,
            master_addr=nodes.master_addr,
            local_addr=local_addr,
            socket_ifname=socket_ifname,
            hosts=nodes.hosts,
            requested_slots=nodes.requested_slots,
            paths=(),
            reports={host: {"accelerator": kind, "slots": 1, "interfaces": []} for host in nodes.hosts},
            unreachable={},
        )

    silent = ssh.wait_for_sshd(nodes.hosts, config.ssh_port, deadline)
    if silent:
        raise ClusterNotReady(
            f"sshd did not answer on port {config.ssh_port} within {config.wait_timeout:.0f}s on: "
            f"{', '.join(silent)}; fix: start those workers (or check --ssh-port / GAUDI_CLUSTER_SSH_PORT)"
        )
    job_id = new_job_id()
    job_dir = Path(config.job_root) / job_id
    job_dir.mkdir(parents=True, exist_ok=True)
    job_dir.chmod(0o700)
    identity = ssh.default_identity(Path(config.ssh_dir))
    if identity is not None:
        ssh.check_private_key(identity)
    ssh_config = ssh.write_ssh_config(job_dir, config.ssh_port, identity)
    reports, unreachable = probe_nodes(config, nodes.hosts, paths, ssh_config, environ, deadline)
    return NodeSurvey(
        job_id=job_id,
        job_dir=job_dir,
        ssh_config=ssh_config,
        master_addr=nodes.master_addr,
        local_addr=local_addr,
        socket_ifname=socket_ifname,
        hosts=nodes.hosts,
        requested_slots=nodes.requested_slots,
        paths=tuple(paths),
        reports=reports,
        unreachable=unreachable,
    )


def probe_nodes(
    config: ClusterConfig,
    hosts: Sequence[str],
    paths: Sequence[str],
    ssh_config: Path,
    environ: Mapping[str, str],
    deadline: float,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Run `gaudi-cluster probe` on every node at once: (reports by host, why-unreachable by host)."""
    command = [sys.executable, "-m", "gaudi_cluster", "probe", "--json", "--accelerator", config.accelerator]
    for path in paths:
        command += ["--path", path]
    if environ.get("HCCL_OVER_OFI") == "1" or config.env_preset == "efa":
        command.append("--check-efa")
    results = ssh.run_on_hosts(hosts, command, ssh_config, max(10.0, deadline - time.monotonic()))
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
