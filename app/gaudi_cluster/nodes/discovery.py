"""Where the peers come from (static list, DNS, hostfile, Slurm, MPI Operator) and waiting for them.

One `PeerSource` per place, each saying what it is, whether it names every node or only the others,
and whether it can grow while we wait. Pure: the world (DNS, files, clock, sleep) comes in as
callables (`World`, built for real by the survey) so that every source and the one deadline in
`wait_for_peers` are tested without a network, a filesystem or a real clock.
"""

from __future__ import annotations

import ipaddress
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from gaudi_cluster.errors import ClusterNotReady, ConfigError, quoted
from gaudi_cluster.nodes import slurm
from gaudi_cluster.nodes.hostfile import MAX_SLOTS, Hostfile, host_problem, parse_slots

Resolver = Callable[[str], list[str]]
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Peer:
    host: str
    slots: int | None = None  # None: detect on the node itself


@dataclass(frozen=True)
class World:
    """What discovery reads of the machine it runs on."""

    resolve: Resolver  # every address of a name; OSError while it does not resolve
    read_text: Callable[[str], str]  # a file's text; OSError when it cannot be read
    load_hostfile: Callable[[str], Hostfile]  # a parsed hostfile; ConfigError naming the path
    exists: Callable[[str], bool]


def _dedupe(peers: list[Peer], source: str) -> list[Peer]:
    seen: dict[str, Peer] = {}
    for p in peers:
        if p.host in seen:
            raise ConfigError(f"{source}: host '{p.host}' is listed twice; fix: list each host once")
        seen[p.host] = p
    return peers


def _slots(value: str, token: str, source: str) -> int:
    count = parse_slots(value)
    if count is None:
        raise ConfigError(
            f"{source}: {quoted(token)} has slots {quoted(value)}, not a whole number from 1 to "
            f"{MAX_SLOTS}; fix: write host or host:N with 1 <= N <= {MAX_SLOTS}"
        )
    return count


def parse_peer_token(token: str, source: str = "GAUDI_CLUSTER_PEERS") -> Peer:
    """`host`, `host:N`, `[v6addr]`, `[v6addr]:N` or a bare IPv6 literal (no slots)."""
    host, slots_text = token, None
    if token.startswith("["):
        m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", token)
        if not m:
            raise ConfigError(f"{source}: {quoted(token)} has an unclosed '['; fix: write [ipv6]:N")
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


def peers_from_dns(name: str, resolve: Resolver) -> list[Peer]:
    """One peer per address behind `name` (compose service, k8s headless service), numerically sorted.

    Resolution errors propagate: `wait_for_peers` treats them as "none found yet".
    """
    addrs = sorted(set(resolve(name)), key=_address_key)
    return [Peer(a) for a in addrs]


def peers_from_hostfile(path: str, load_hostfile: Callable[[str], Hostfile]) -> list[Peer]:
    return [Peer(e.host, e.slots) for e in load_hostfile(path).entries]


def peers_from_slurm(env: Mapping[str, str]) -> list[Peer]:
    """Every node of the Slurm step (else job), master first; slots are found on each node.

    Not from SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE: one container task per node is the way to
    run the image (their "1" would hide the cards). Each node's probe counts its own cards, honouring
    HABANA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE (devices.detect_slots).
    """
    return [Peer(host) for host in slurm.step_hosts(env)]


def mpi_operator_hostfile_path(env: Mapping[str, str]) -> str:
    return env.get("OMPI_MCA_orte_default_hostfile") or MPI_OPERATOR_HOSTFILE


def peers_from_mpi_operator(env: Mapping[str, str], read_text: Callable[[str], str]) -> list[Peer]:
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


class PeerSource(ABC):
    """One place the peers come from.

    `lists_every_node`: the list names this node too and its first node leads (as DeepSpeed reads a
    hostfile); otherwise it names only the others and this node leads. `grows`: more peers may appear
    while we wait (a DNS name fills as containers start); a list that is too short is bad input now.
    """

    lists_every_node: ClassVar[bool] = False
    grows: ClassVar[bool] = False

    @abstractmethod
    def describe(self) -> str:
        """Words for messages: "DNS name 'worker'", "static peer list", ..."""

    @abstractmethod
    def setting(self) -> str:
        """How the user chose it, for the message that refuses two sources at once."""

    @abstractmethod
    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        """The peers it names now; ConfigError for bad input, OSError while it cannot answer yet."""


@dataclass(frozen=True)
class StaticPeers(PeerSource):
    spec: str  # --peers / GAUDI_CLUSTER_PEERS: host[:slots],...

    def describe(self) -> str:
        return "static peer list"

    def setting(self) -> str:
        return f"GAUDI_CLUSTER_PEERS={self.spec}"

    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        return peers_from_static(self.spec)


@dataclass(frozen=True)
class DnsPeers(PeerSource):
    name: str  # --peers-dns / GAUDI_CLUSTER_PEERS_DNS: a compose service, a k8s headless service

    grows: ClassVar[bool] = True

    def describe(self) -> str:
        return f"DNS name '{self.name}'"

    def setting(self) -> str:
        return f"GAUDI_CLUSTER_PEERS_DNS={self.name}"

    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        return peers_from_dns(self.name, world.resolve)


@dataclass(frozen=True)
class HostfilePeers(PeerSource):
    path: str  # --hostfile / GAUDI_CLUSTER_HOSTFILE, DeepSpeed's format

    lists_every_node: ClassVar[bool] = True

    def describe(self) -> str:
        return f"hostfile {self.path}"

    def setting(self) -> str:
        return f"GAUDI_CLUSTER_HOSTFILE={self.path}"

    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        return peers_from_hostfile(self.path, world.load_hostfile)


@dataclass(frozen=True)
class SlurmPeers(PeerSource):
    lists_every_node: ClassVar[bool] = True

    def describe(self) -> str:
        return "Slurm node list"

    def setting(self) -> str:
        return "Slurm"

    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        return peers_from_slurm(environ)


@dataclass(frozen=True)
class MpiOperatorPeers(PeerSource):
    lists_every_node: ClassVar[bool] = True

    def describe(self) -> str:
        return "MPI Operator hostfile"

    def setting(self) -> str:
        return "MPI Operator"

    def discover(self, environ: Mapping[str, str], world: World) -> list[Peer]:
        return peers_from_mpi_operator(environ, world.read_text)


def choose_source(
    peers: str | None,
    dns: str | None,
    hostfile: str | None,
    environ: Mapping[str, str],
    exists: Callable[[str], bool],
) -> PeerSource | None:
    """The one source the settings name (an empty value names none; two are refused), else the one
    the engine that started us implies; None: no source, the job runs on this node alone."""
    given: list[PeerSource] = []
    if peers:
        given.append(StaticPeers(peers))
    if dns:
        given.append(DnsPeers(dns))
    if hostfile:
        given.append(HostfilePeers(hostfile))
    if len(given) > 1:
        names = " and ".join(source.setting() for source in given)
        raise ConfigError(f"more than one peer source is configured ({names}); fix: keep only one")
    return given[0] if given else detect_source(environ, exists)


def detect_source(env: Mapping[str, str], exists: Callable[[str], bool]) -> PeerSource | None:
    """The source the engine that started us implies; a Slurm step wins over a mounted MPI hostfile."""
    if slurm.in_slurm_step(env):
        return SlurmPeers()
    if env.get("OMPI_MCA_orte_default_hostfile") or exists(MPI_OPERATOR_HOSTFILE):
        return MpiOperatorPeers()
    return None


def wait_for_peers(
    discover: Callable[[], list[Peer]],
    expected: int | None,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    *,
    source: str = "discovery",
    interval_s: float = 1.0,
    fix: str = "start the missing nodes (worker role) or raise --wait-timeout (GAUDI_CLUSTER_WAIT_TIMEOUT)",
) -> list[Peer]:
    """Poll `discover` under ONE deadline until `expected` peers are found.

    expected=None means "whatever is there", but at least one peer: a DNS name that does not resolve
    yet is the normal state of a starting cluster, not an answer. OSError and ClusterNotReady from
    `discover` count as "none found yet"; ConfigError propagates at once (waiting cannot fix it).
    """
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
        if len(found) >= need:
            return found
        now = clock()
        if now >= deadline:
            break
        sleep(max(0.0, min(interval_s, deadline - now)))
    waited = clock() - start
    names = ", ".join(p.host for p in found) or "none"
    err = f"; last error: {type(last_error).__name__}: {last_error}" if last_error else ""
    raise ClusterNotReady(
        f"found {len(found)} of {need} peers via {source} after {waited:.0f}s: {names}; "
        f"missing {need - len(found)}{err}; fix: {fix}"
    )
