"""Master: the fabric check's figures, its verdict and its table. Pure: the ranks' report comes in as text.

Bus bandwidth is nccl-tests' and hccl_demo's: algorithm bandwidth (bytes / time) x 2(n-1)/n. A slow node
is found from the ring-neighbour pairs: each node's figure is its better pair (a healthy neighbour of a
slow node still has one fast pair), against the median of those figures. A broken node is the one no
pair of it answered for, or that never checked in.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MARK = "GC_FABRIC "  # the rank program's line prefix (train/fabric_check.py prints it)
SLOW_RATIO = 0.5  # a node below half the median pair bandwidth is slow


@dataclass(frozen=True)
class NodeFigures:
    host: str
    ranks: tuple[int, ...]
    pair_busbw: float | None  # bytes/s of its better ring-neighbour pair
    busbw: float | None  # bytes/s of the world all-reduce at the largest size (its slowest rank)
    latency_s: float | None  # one all-reduce at the smallest size
    state: str  # ok | slow | no answer | ports down | no gaudinet
    efa_devices: int | None = None  # /dev/infiniband/uverbs* on the node
    ports_down: tuple[str, ...] = ()  # Gaudi NIC ports "<card>/<port>" that hl-smi reports down


@dataclass(frozen=True)
class FabricResult:
    """What the check found: every node's figures, and the nodes that stop a launch."""

    backend: str
    world: int
    timeout_s: float
    nodes: tuple[NodeFigures, ...]
    median_pair_busbw: float | None
    problems: tuple[str, ...] = ()  # one line each, naming the host and the fix
    bad_hosts: tuple[str, ...] = ()
    details: tuple[str, ...] = field(default=())  # pair errors, as the backend gave them

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FabricResult:
        data = json.loads(text)
        nodes = tuple(
            NodeFigures(**{**n, "ranks": tuple(n["ranks"]), "ports_down": tuple(n.get("ports_down", ()))})
            for n in data.pop("nodes")
        )
        tuples = {k: tuple(data.pop(k, ())) for k in ("problems", "bad_hosts", "details")}
        return cls(nodes=nodes, **data, **tuples)


def report_line(lines: Sequence[str]) -> dict[str, Any] | None:
    """The rank program's report from rank 0's output lines (the last one wins); None: it never came."""
    for line in reversed(lines):
        at = line.find(MARK)
        if at >= 0:
            return json.loads(line[at + len(MARK) :])
    return None


def busbw(size: int, seconds: float, world: int) -> float:
    return size / seconds * (2 * (world - 1) / world) if world > 1 and seconds > 0 else 0.0


def _fix(hosts: Sequence[str]) -> str:
    # DeepSpeed's grammar joins nodes with @ (a comma separates slots).
    drop = "@".join(hosts)
    return f"fix: drop it with --exclude {drop} (or repair its link and rerun with --fabric-check)"


def figures(
    report: Mapping[str, Any], rank_hosts: Mapping[int, str], exclude_as: Mapping[str, str] | None = None
) -> FabricResult:
    """The verdict from the ranks' report; rank_hosts is the launch's (rank -> node name), exclude_as
    each node name's hostfile host (what --exclude takes) where they differ."""
    drop = dict(exclude_as or {})
    world, timeout = int(report["world"]), float(report["timeout_s"])
    by_host: dict[str, list[int]] = {}
    for rank in sorted(rank_hosts):
        by_host.setdefault(rank_hosts[rank], []).append(rank)
    host_of = dict(rank_hosts)
    silent: set[str] = {host_of[r] for r in report.get("no_answer", {}).get("ranks", [])}
    pair_bw: dict[str, list[float]] = {h: [] for h in by_host}
    details = []
    for pair in report.get("pairs", []):
        hosts = [host_of[r] for r in pair["ranks"]]
        if "error" in pair:
            kind = f" ({pair['kind']})" if pair.get("kind") else ""
            details.append(f"pair {' - '.join(hosts)}{kind}: {pair['error']}")
            details += [f"  {line}" for line in pair.get("log_tail", [])]
        elif hosts[0] != hosts[1]:
            for h in hosts:
                pair_bw[h].append(busbw(pair["bytes"], pair["seconds"], 2))
    named, links = localise(report.get("pairs", []), host_of)
    touched = {host_of[r] for p in report.get("pairs", []) if "error" in p for r in p["ranks"]}
    silent |= set(named)
    silent |= _silent_in_world(report.get("full", {}), host_of, set(by_host))
    best = {h: max(v) for h, v in pair_bw.items() if v}
    median = statistics.median(best.values()) if best else None
    full = report.get("full", {})
    facts = report.get("facts", {})
    nodes, problems = [], []
    for host, ranks in by_host.items():
        fact = next((facts[str(r)] for r in ranks if str(r) in facts), {})
        down = tuple(sorted(port for port, state in fact.get("ports", {}).items() if state != "up"))
        gaudinet = fact.get("gaudinet", {})
        runs = [full.get(str(r), []) for r in ranks]
        ok_runs = [[m for m in run if "error" not in m] for run in runs]
        largest = [max(run, key=lambda m: m["bytes"]) for run in ok_runs if run]
        smallest = [min(run, key=lambda m: m["bytes"]) for run in ok_runs if run]
        node_bw = min((busbw(m["bytes"], m["seconds"], world) for m in largest), default=None)
        latency = max((m["seconds"] for m in smallest), default=None)
        # A node with a failed pair is judged on one pair at most: too few to call it slow.
        slow = (
            median is not None
            and len(best) > 2
            and host in best
            and host not in touched
            and best[host] < SLOW_RATIO * median
        )
        state = "no answer" if host in silent else "slow" if slow else "ok"
        if state == "ok" and down:
            state = "ports down"
        elif state == "ok" and gaudinet and not gaudinet.get("present"):
            state = "no gaudinet"
        efa = fact.get("efa_devices")
        nodes.append(NodeFigures(host, tuple(ranks), best.get(host), node_bw, latency, state, efa, down))
        if state == "no answer":
            problems.append(
                f"no answer from host {host} within {timeout:g} s; {_fix([drop.get(host, host)])}"
            )
        elif state == "slow" and median is not None:
            problems.append(
                f"host {host} is slow: {gbps(best[host])} against a median of {gbps(median)} "
                f"(pair all-reduce bus bandwidth); {_fix([drop.get(host, host)])}"
            )
        elif state == "ports down":
            problems.append(
                f"host {host}: Gaudi NIC port(s) {', '.join(down)} down (hl-smi -n link); "
                f"{_fix([drop.get(host, host)])}"
            )
        elif state == "no gaudinet":
            problems.append(
                f"host {host}: {gaudinet.get('path')} is missing (L3 scale-out reads it); fix: write it "
                f"there, or {_fix([drop.get(host, host)])[5:]}"
            )
    for a, b in links:
        problems.append(
            f"no answer between hosts {a} and {b} within {timeout:g} s (each answers its other neighbour); "
            f"fix: check the link between them, or drop one with --exclude {drop.get(a, a)}"
        )
    if not problems and _world_failed(full):
        problems.append(
            f"the world all-reduce failed on every node ({_world_failed(full)}); fix: see the rank logs "
            "and run gaudi-cluster doctor --fabric-check"
        )
    if not problems and not full and not silent:
        problems.append(f"the fabric check gave no figures (backend {report.get('backend')}); see rank logs")
    problems.sort(key=lambda line: not line.startswith("no answer"))  # a dead node first: it stops
    named_links = [h for link in links for h in link]
    bad = tuple(dict.fromkeys([n.host for n in nodes if n.state != "ok"] + named_links))
    return FabricResult(
        str(report.get("backend", "")),
        world,
        timeout,
        tuple(nodes),
        median,
        tuple(problems),
        bad,
        tuple(details),
    )


def localise(
    pairs: Sequence[Mapping[str, Any]], host_of: Mapping[int, str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The hosts the failed pairs name, and the failed links that no named host explains.

    A link (two ranks on two hosts) that failed because one side was still held by an earlier test
    (`late`) is that test's cascade and counts for nothing. A host is a suspect when every link of it
    failed; suspects are named most-failed first (then most blamed: its own side silent, or a peer that
    saw it close) until every failed link has a named host. A pair within one host names that host.
    """
    failed: list[frozenset[str]] = []
    seen: dict[str, int] = {}
    lost: dict[str, int] = {}
    blame: dict[str, int] = {}
    named: list[str] = []
    for pair in pairs:
        a, b = pair["ranks"]
        hosts = (host_of[a], host_of[b])
        if pair.get("late"):
            continue
        if hosts[0] == hosts[1]:
            if "error" in pair and hosts[0] not in named:
                named.append(hosts[0])
            continue
        for h in hosts:
            seen[h] = seen.get(h, 0) + 1
        if "error" not in pair:
            continue
        failed.append(frozenset(hosts))
        sides = pair.get("sides", {})
        for rank, peer in ((a, b), (b, a)):
            lost[host_of[rank]] = lost.get(host_of[rank], 0) + 1
            if sides.get(str(rank)) == "silent" or sides.get(str(peer)) == "closed":
                blame[host_of[rank]] = blame.get(host_of[rank], 0) + 1
    suspects = [h for h in seen if lost.get(h, 0) == seen[h]]
    while True:
        open_links = [link for link in failed if not link & set(named)]
        options = [h for h in suspects if h not in named and any(h in link for link in open_links)]
        if not options:
            break
        named.append(max(options, key=lambda h: (sum(h in link for link in open_links), blame.get(h, 0))))
    left = list(dict.fromkeys(tuple(sorted(link)) for link in failed if not link & set(named)))
    return named, [(a, b) for a, b in left]


def _silent_in_world(full: Mapping[str, Any], host_of: Mapping[int, str], hosts: set[str]) -> set[str]:
    """Hosts with a rank that never answered the world test, where others did (one who answered names it)."""
    quiet = {host_of[int(r)] for r, run in full.items() if any(m.get("kind") == "silent" for m in run)}
    return quiet if quiet != hosts else set()


def _world_failed(full: Mapping[str, Any]) -> str:
    """The first world all-reduce error, or "" when none failed."""
    errors = [m["error"] for run in full.values() for m in run if "error" in m]
    return errors[0] if errors else ""


def no_report(hosts: Sequence[str], timeout_s: float, why: str) -> FabricResult:
    """The check's program never reported (it could not start, or was stopped): no node is named."""
    nodes = tuple(NodeFigures(h, (), None, None, None, "unknown") for h in hosts)
    fix = "fix: see gaudi-cluster doctor --fabric-check"
    line = f"the fabric check gave no answer within its limits ({why}); {fix}"
    return FabricResult("", len(hosts), timeout_s, nodes, None, (line,), ())


def gbps(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e9:.2f} GB/s" if value >= 1e8 else f"{value / 1e6:.1f} MB/s"


def render_table(result: FabricResult) -> str:
    efa = any(n.efa_devices for n in result.nodes)  # the column only where a node has EFA
    rows = [("host", "ranks", "pair bus bw", "bus bw", "latency", *(("efa",) if efa else ()), "state")]
    for n in result.nodes:
        latency = f"{n.latency_s * 1e6:.0f} us" if n.latency_s is not None else "-"
        ranks = ",".join(map(str, n.ranks)) or "-"
        devices = (str(n.efa_devices if n.efa_devices is not None else "-"),) if efa else ()
        rows.append((n.host, ranks, gbps(n.pair_busbw), gbps(n.busbw), latency, *devices, n.state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    median = gbps(result.median_pair_busbw)
    lines.append(
        f"backend {result.backend or '-'}, {result.world} ranks, median pair bus bw {median}, "
        f"limit {result.timeout_s:g} s per test"
    )
    lines += [f"problem: {p}" for p in result.problems]
    lines += [f"  {d}" for d in result.details]
    return "\n".join(lines)
