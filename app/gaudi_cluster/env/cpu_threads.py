"""OMP_NUM_THREADS for CPU ranks that share a server's cores. Pure.

torch gives every process a thread per core: N ranks on one server run N x cores threads, which spin
against each other in every collective (3 ranks on 2 cores trained 4x slower than with one thread
each). Nodes that report the same kernel boot id are containers of one server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gaudi_cluster.env.envfile import EnvFile
from gaudi_cluster.wire.node_report import NodeReport


@dataclass(frozen=True)
class CpuThreads:
    """OMP_NUM_THREADS for CPU ranks that share a server's cores, and why."""

    threads: int
    ranks: int
    cpus: int
    nodes: tuple[str, ...]

    def line(self) -> str:
        where = (
            f"one server: nodes {', '.join(self.nodes)} report the same kernel boot id"
            if len(self.nodes) > 1
            else f"node {self.nodes[0]}"
        )
        return (
            f"OMP_NUM_THREADS={self.threads} for every rank: {self.ranks} ranks share {self.cpus} CPUs "
            f"({where}); --env OMP_NUM_THREADS=N chooses another count"
        )


def cpu_threads_per_rank(
    ranks_by_host: Mapping[str, int], reports: Mapping[str, NodeReport]
) -> CpuThreads | None:
    """Threads per CPU rank so that the ranks of one server do not oversubscribe its cores.

    The tightest
    server sets the count for all (one env file for every node); None when no server has more ranks
    than one, or a node did not say how many CPUs it has.
    """
    servers: dict[str, list[str]] = {}
    for host in ranks_by_host:
        report = reports.get(host)
        servers.setdefault((report and report.boot_id) or f"host:{host}", []).append(host)
    tightest: CpuThreads | None = None
    for hosts in servers.values():
        ranks = sum(ranks_by_host[host] for host in hosts)
        counts = [report.cpus if (report := reports.get(host)) else None for host in hosts]
        if ranks < 2 or not all(isinstance(c, int) and c > 0 for c in counts):
            continue
        cpus = min(counts)
        found = CpuThreads(max(1, cpus // ranks), ranks, cpus, tuple(hosts))
        if tightest is None or found.threads < tightest.threads:
            tightest = found
    return tightest


def with_cpu_threads(env: EnvFile, threads: CpuThreads | None) -> EnvFile:
    """env with OMP_NUM_THREADS set for oversubscribed CPU ranks, unless someone already chose it."""
    chosen = env.as_dict()
    if threads is None or "OMP_NUM_THREADS" in chosen or "OMP_NUM_THREADS" in dict(env.private):
        return env
    return replace(env, items=tuple(sorted({**chosen, "OMP_NUM_THREADS": str(threads.threads)}.items())))
