"""Which nodes a job has: its peer source read under the survey's deadline.

A static list or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the MPI
Operator list *every* node, and the first one is the rendezvous address (as DeepSpeed does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import discovery
from gaudi_cluster.nodes.discovery import LOOPBACK

log = logging.getLogger("gaudi_cluster.nodes.find")


@dataclass(frozen=True)
class FindSettings:
    """What finding the nodes reads of the settings."""

    peers: str | None
    peers_dns: str | None
    hostfile: str | None
    nodes: int | None
    slots: int | None
    master_addr: str | None
    spares: int = 0  # found beyond --nodes, kept idle to take a lost node's place


@dataclass(frozen=True)
class FoundNodes:
    hosts: tuple[str, ...]  # the nodes that run ranks, the leading one first
    master_addr: str
    requested_slots: dict[str, int | None]
    spares: tuple[str, ...] = ()  # idle nodes, probed with the others


def static_count_check(found: int, expected: int | None, source: discovery.PeerSource) -> None:
    if expected is not None and found < expected:
        every = source.lists_every_node
        total = found if every else found + 1
        raise ConfigError(
            f"--nodes {expected if every else expected + 1} but the {source.describe()} names only {total} "
            f"node(s); fix: lower --nodes to {total} or list every node"
        )


def find_nodes(
    config: FindSettings,
    environ: Mapping[str, str],
    self_names: set[str],
    local_addr: str,
    deadline: float,
    world: discovery.World,
) -> FoundNodes:
    source = discovery.choose_source(config.peers, config.peers_dns, config.hostfile, environ, world.exists)
    if source is None:
        if config.nodes and config.nodes > 1:
            raise ConfigError(
                f"--nodes {config.nodes} but no peer source; fix: set --peers, --peers-dns or --hostfile "
                "(GAUDI_CLUSTER_PEERS / _PEERS_DNS / _HOSTFILE)"
            )
        return FoundNodes(("localhost",), config.master_addr or LOOPBACK, {"localhost": config.slots})
    every, named = source.lists_every_node, source.describe()

    def discover() -> list[discovery.Peer]:
        found = source.discover(environ, world)
        return found if every else [p for p in found if p.host not in self_names]

    expected = config.nodes if every else (config.nodes - 1 if config.nodes else None)
    if expected is not None:
        expected += config.spares
    if source.grows:
        # Said once, before the first look: a master whose peers are not up yet is waiting, not hung.
        log.info("waiting for peers via %s (%s expected)", named, expected if expected is not None else "any")
        peers = discovery.wait_for_peers(
            discover, expected, max(0.0, deadline - time.monotonic()), source=named
        )
    else:
        peers = discover()
        static_count_check(len(peers), expected, source)
    if expected is not None and len(peers) > expected:
        log.info("using the first %d of the %d nodes in the %s (--nodes)", expected, len(peers), named)
        peers = peers[:expected]
    if config.slots is not None and any(p.slots for p in peers):
        log.info("--slots %d overrides the slots in the %s", config.slots, named)
    slots = {p.host: config.slots or p.slots for p in peers}
    if every:
        found = FoundNodes(tuple(p.host for p in peers), config.master_addr or peers[0].host, slots)
    else:
        master = config.master_addr or local_addr
        found = FoundNodes((master, *(p.host for p in peers)), master, {master: config.slots, **slots})
    return with_spares(found, config.spares)


def with_spares(found: FoundNodes, spares: int) -> FoundNodes:
    """The last `spares` nodes found stay idle; the first one leads, so it always runs ranks."""
    if not spares:
        return found
    if len(found.hosts) <= spares:
        raise ConfigError(
            f"--spares {spares} leaves no node to run the job: {len(found.hosts)} found; "
            "fix: lower --spares or add nodes"
        )
    keep = len(found.hosts) - spares
    return FoundNodes(found.hosts[:keep], found.master_addr, found.requested_slots, found.hosts[keep:])


def local_only(nodes: FoundNodes, self_names: set[str]) -> bool:
    return len(nodes.hosts) == 1 and nodes.hosts[0] in self_names
