"""Where the peers come from (static list, DNS, hostfile, Slurm, MPI Operator) and waiting for them.

Parsers are pure; the world (DNS, files, clock, sleep) comes in as callables so that the one
deadline in `wait_for_peers` can be tested with a fake clock.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.nodes import slurm
from gaudi_cluster.nodes.hostfile import host_problem, read_hostfile

Resolver = Callable[[str], list[str]]
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"


@dataclass(frozen=True)
class Peer:
    host: str
    slots: int | None = None  # None: detect on the node itself


def default_resolve(name: str) -> list[str]:
    """All IPv4/IPv6 addresses of `name`; raises OSError (socket.gaierror) when it does not resolve."""
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _dedupe(peers: list[Peer], source: str) -> list[Peer]:
    seen: dict[str, Peer] = {}
    for p in peers:
        if p.host in seen:
            raise ConfigError(f"{source}: host '{p.host}' is listed twice; fix: list each host once")
        seen[p.host] = p
    return peers


def _slots(value: str, token: str, source: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise ConfigError(
            f"{source}: '{token}' has slots '{value}', not a positive integer; "
            "fix: write host or host:N with N >= 1"
        )
    return int(value)


def parse_peer_token(token: str, source: str = "GAUDI_CLUSTER_PEERS") -> Peer:
    """`host`, `host:N`, `[v6addr]`, `[v6addr]:N` or a bare IPv6 literal (no slots)."""
    host, slots_text = token, None
    if token.startswith("["):
        m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", token)
        if not m:
            raise ConfigError(f"{source}: '{token}' has an unclosed '['; fix: write [ipv6]:N")
        host, slots_text = m.group(1), m.group(2)
    elif token.count(":") == 1:
        host, slots_text = token.split(":")
    problem = host_problem(host)
    if problem:
        raise ConfigError(f"{source}: {problem}; fix: write host or host:N, separated by commas")
    return Peer(host, None if slots_text is None else _slots(slots_text, token, source))


def peers_from_static(spec: str, source: str = "GAUDI_CLUSTER_PEERS") -> list[Peer]:
    tokens = [t for t in re.split(r"[\s,]+", spec) if t]
    if not tokens:
        raise ConfigError(f"{source} is empty; fix: list the nodes as host[:slots],host[:slots]")
    return _dedupe([parse_peer_token(t, source) for t in tokens], source)


def _address_key(addr: str) -> tuple[int, int, str]:
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return (9, 0, addr)
    return (ip.version, int(ip), addr)


def peers_from_dns(name: str, resolve: Resolver = default_resolve) -> list[Peer]:
    """One peer per address behind `name` (compose service, k8s headless service), numerically sorted.

    Resolution errors propagate: `wait_for_peers` treats them as "none found yet".
    """
    addrs = sorted(set(resolve(name)), key=_address_key)
    return [Peer(a) for a in addrs]


def peers_from_hostfile(path: str | Path) -> list[Peer]:
    return [Peer(e.host, e.slots) for e in read_hostfile(path).entries]


def expand_slurm_nodelist(s: str, source: str = "SLURM_JOB_NODELIST") -> list[str]:
    """A Slurm host list expanded exactly as Slurm does (gaudi_cluster.nodes.slurm), errors as ConfigError."""
    try:
        hosts = slurm.expand_hostlist(s)
    except slurm.HostlistError as error:
        raise ConfigError(
            f"{source}='{s}' is not a Slurm host list: {error}; fix: use forms like node[01-04,07]"
        ) from None
    if not hosts:
        raise ConfigError(f"{source} is empty; fix: run inside a Slurm allocation or configure peers")
    return hosts


def peers_from_slurm(env: Mapping[str, str]) -> list[Peer]:
    """Every node of the Slurm step (else job), master first; slots are found on each node.

    Not from SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE: one container task per node is the way to
    run the image (their "1" would hide the cards). Each node's probe counts its own cards, honouring
    HABANA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE (devices.detect_slots).
    """
    return [Peer(host) for host in slurm.step_hosts(env)]


def mpi_operator_hostfile_path(env: Mapping[str, str]) -> str:
    return env.get("OMPI_MCA_orte_default_hostfile") or MPI_OPERATOR_HOSTFILE


def peers_from_mpi_operator(
    env: Mapping[str, str], read_text: Callable[[str], str] = _read_text
) -> list[Peer]:
    """MPI Operator v2 hostfile: `host slots=N` (OpenMPI) or `host:N` (Intel MPI/MPICH) lines."""
    path = mpi_operator_hostfile_path(env)
    try:
        text = read_text(path)
    except OSError as exc:
        raise ConfigError(
            f"MPI Operator hostfile {path} cannot be read ({exc}); "
            "fix: run as an MPIJob launcher or set OMPI_MCA_orte_default_hostfile"
        ) from None
    peers: list[Peer] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        host, *rest = line.split()
        slots: int | None = None
        for tok in rest:
            key, _, value = tok.partition("=")
            if key == "slots":
                slots = _slots(value, tok, where)
            elif key != "max_slots":
                raise ConfigError(f"{where}: unknown token '{tok}'; fix: write 'host slots=N'")
        peer = parse_peer_token(host, where)
        peers.append(Peer(peer.host, slots if slots is not None else peer.slots))
    if not peers:
        raise ConfigError(
            f"{path}:1: MPI Operator hostfile lists no hosts; fix: check the MPIJob's worker count"
        )
    return _dedupe(peers, path)


@dataclass(frozen=True)
class DiscoverySpec:
    peers: str | None = None
    dns: str | None = None
    hostfile: str | None = None
    slurm: bool = False
    mpi_operator: bool = False

    def configured(self) -> list[str]:
        names = []
        if self.peers:
            names.append(f"GAUDI_CLUSTER_PEERS={self.peers}")
        if self.dns:
            names.append(f"GAUDI_CLUSTER_PEERS_DNS={self.dns}")
        if self.hostfile:
            names.append(f"GAUDI_CLUSTER_HOSTFILE={self.hostfile}")
        if self.slurm:
            names.append("Slurm")
        if self.mpi_operator:
            names.append("MPI Operator")
        return names


def describe_source(spec: DiscoverySpec) -> str:
    """Words for messages: "DNS name 'worker'", "static list", ..."""
    if spec.dns:
        return f"DNS name '{spec.dns}'"
    if spec.peers:
        return "static peer list"
    if spec.hostfile:
        return f"hostfile {spec.hostfile}"
    if spec.slurm:
        return "Slurm node list"
    if spec.mpi_operator:
        return "MPI Operator hostfile"
    return "no source"


def detect_source(
    env: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists
) -> DiscoverySpec | None:
    if slurm.in_slurm_step(env):
        return DiscoverySpec(slurm=True)
    if env.get("OMPI_MCA_orte_default_hostfile") or exists(MPI_OPERATOR_HOSTFILE):
        return DiscoverySpec(mpi_operator=True)
    return None


def discover_once(
    spec: DiscoverySpec,
    env: Mapping[str, str],
    resolve: Resolver = default_resolve,
    read_text: Callable[[str], str] = _read_text,
) -> list[Peer]:
    configured = spec.configured()
    if len(configured) > 1:
        raise ConfigError(
            f"more than one peer source is configured ({' and '.join(configured)}); fix: keep only one"
        )
    if spec.peers:
        return peers_from_static(spec.peers)
    if spec.dns:
        return peers_from_dns(spec.dns, resolve)
    if spec.hostfile:
        return peers_from_hostfile(spec.hostfile)
    if spec.slurm:
        return peers_from_slurm(env)
    if spec.mpi_operator:
        return peers_from_mpi_operator(env, read_text)
    raise ConfigError(
        "no peer source is configured; fix: set one of GAUDI_CLUSTER_PEERS (host[:slots],...), "
        "GAUDI_CLUSTER_PEERS_DNS (service name), GAUDI_CLUSTER_HOSTFILE, or run under Slurm / MPI Operator"
    )


def wait_for_peers(
    discover: Callable[[], list[Peer]],
    expected: int | None,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_poll: Callable[[list[Peer], BaseException | None], None] | None = None,
    *,
    want_hosts: Sequence[str] | None = None,
    source: str = "discovery",
    interval_s: float = 1.0,
    fix: str = "start the missing nodes (worker role) or raise GAUDI_CLUSTER_WAIT_TIMEOUT",
) -> list[Peer]:
    """Poll `discover` under ONE deadline until `expected` peers (or all `want_hosts`) are found.

    expected=None means "whatever is there", but at least one peer: a DNS name that does not resolve
    yet is the normal state of a starting cluster, not an answer. OSError and ClusterNotReady from
    `discover` count as "none found yet"; ConfigError propagates at once (waiting cannot fix it).
    """
    if want_hosts is not None and expected is None:
        expected = len(want_hosts)
    need = expected if expected is not None else 1
    start = clock()
    deadline = start + timeout_s
    found: list[Peer] = []
    last_error: BaseException | None = None
    while True:
        try:
            found = discover()
            last_error = None
        except (OSError, ClusterNotReady) as exc:
            found, last_error = [], exc
        if on_poll is not None:
            on_poll(found, last_error)
        hosts = {p.host for p in found}
        done = len(found) >= need
        if want_hosts is not None:
            done = all(h in hosts for h in want_hosts)
        if done:
            return found
        now = clock()
        if now >= deadline:
            break
        sleep(max(0.0, min(interval_s, deadline - now)))
    waited = clock() - start
    names = ", ".join(p.host for p in found) or "none"
    if want_hosts is not None:
        missing_hosts = [h for h in want_hosts if h not in hosts]
        missing = f"missing {', '.join(missing_hosts)}"
        total = len(want_hosts)
    else:
        missing = f"missing {need - len(found)}"
        total = need
    err = f"; last error: {type(last_error).__name__}: {last_error}" if last_error else ""
    raise ClusterNotReady(
        f"found {len(found)} of {total} peers via {source} after {waited:.0f}s: {names}; "
        f"{missing}{err}; fix: {fix}"
    )
