"""The rows of `bench.swarm`: each figure at every size, ours beside the old server's (interleaved runs).

Keys: `swarm.<figure>` at the largest size (where the issue's targets apply), `swarm.<figure>.n<nodes>`
at the others.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from gaudi_cluster.wire import protocol

from bench import ssh_rss
from bench.common import Row, Target, failed_row, stat
from bench.swarm_soak import SOAK_S

_DETAILS = ("swarm_cpu_pct", "named_line", "error", "welcomed", "checkin_capped", "master_cpu_pct",
            "reset_named_s", "silence_named_s", "stop_all_s", "first_stop_s", "master_died_at_s")  # fmt: skip
LARGEST = 1000  # where the targets apply
_FROM_CHECKINS = ("checkin_s", "handshake_failures")  # at the largest size run: the check-in-only runs
OLD_LABEL = "the old server (96699ce: a thread per agent), interleaved"


def _figures(per_node: int, heartbeat_s: float, nodes: int) -> list[tuple[str, str, str, Target | None]]:
    """(name, figure, unit, target at the largest size)."""
    ranks = f"{nodes} nodes x {per_node} ranks"
    return [
        ("checkin_s", f"Check-in, last agent started -> every rank admitted ({ranks})", "s",
         Target("ours", "<=", 5.0, "≤ 5 s")),
        ("handshake_failures", f"Handshake failures seen by the swarm, per run ({ranks})", "",
         Target("ours", "<=", 0.0, "0")),
        ("master_cpu_pct", f"Master CPU, steady 20 s, server + supervisor + live view ({ranks})", "%",
         Target("ours", "<=", 10.0, "≤ 10 % of one core")),
        ("master_threads", f"Master threads, /proc/PID/task ({ranks})", "",
         Target("ours", "<=", 16.0, "≤ 16")),
        ("master_fds", f"Master file descriptors, /proc/PID/fd ({ranks})", "",
         Target("ours", "<=", nodes + 64.0, f"≤ nodes + 64 = {nodes + 64}")),
        ("master_rss_mb", f"Master RSS with its children ({ranks})", "MB",
         Target("ours", "<=", 2048.0, "≤ 2,048")),
        ("master_own_rss_mb", f"Master RSS, the process and its children, no ssh client ({ranks})", "MB",
         None),
        ("launch_peak_rss_mb", f"Master RSS during the launch, its control masters and launch sessions "
         f"counted ({ranks})", "MB", Target("ours", "<=", 4096.0, "≤ 4,096")),
        ("stop_all_s", f"stop_all -> every rank told, the swarm's last stop ({ranks})", "s",
         Target("ours", "<=", 1.0, "≤ 1 s")),
        ("reset_named_s", f"A node's connections reset -> the supervisor names it ({ranks})", "s",
         Target("ours", "<=", 1.0, "≤ 1 s")),
        ("silent_named_s", f"A node goes silent -> the supervisor names it ({ranks})", "s",
         Target("ours", "<=", heartbeat_s + 1.5, f"≤ heartbeat timeout + 1.5 s = {heartbeat_s + 1.5:.1f} s")),
    ]  # fmt: skip


def _values(
    results: dict[tuple[str, int, str], dict[str, Any]], side: str, nodes: int, name: str
) -> list[float]:
    source = "silence_named_s" if name == "silent_named_s" else name
    if name == "master_own_rss_mb":
        source = name if side == "ours" else "master_rss_mb"  # the old server holds no ssh client
    checkins = _checkins(results, side, nodes)
    if name == "handshake_failures" and checkins:  # the total over the check-in-only runs
        return [float(sum(f.get(name) or 0 for f in checkins))]
    if name == "checkin_s" and checkins:  # the check-in-only runs, many more than the others
        return [float(f[name]) for f in checkins if f.get(name) is not None]
    values = []
    for scenario in ("reset", "silence"):
        value = results.get((side, nodes, scenario), {}).get(source)
        if value is not None:
            values.append(float(value))
    return values


def _checkins(results: dict[tuple[str, int, str], dict[str, Any]], side: str, nodes: int) -> list[dict]:
    return [
        f for (s, n, scenario), f in results.items()
        if (s, n) == (side, nodes) and scenario.startswith("checkin ") and "error" not in f
    ]  # fmt: skip


def count_ssh_clients(
    results: dict[tuple[str, int, str], dict[str, Any]],
    held_per_node: dict[int, float],
    client_mb: float | None,
    at_launch_per_node: dict[int, float] | None = None,
    session_mb: float | None = None,
    sessions_per_node: dict[int, float] | None = None,
) -> None:
    """Ours: add the ssh processes the master holds (held_per_node, from the fan-out bench: a control
    master per node) at the RSS of a real OpenSSH client; the process's own figure stays beside.
    Without the fan-out's count or a client's RSS (a partial rerun) there is no master_rss_mb: a row
    is never rewritten from fewer parts (the earlier one is kept)."""
    for (side, nodes, _), figures in results.items():
        if side != "ours" or "master_rss_mb" not in figures:
            continue
        figures["master_own_rss_mb"] = figures.pop("master_rss_mb")
        if client_mb is not None and nodes in held_per_node:
            held = held_per_node[nodes] * nodes
            figures["ssh_clients_counted"] = held
            figures["master_rss_mb"] = figures["master_own_rss_mb"] + held * client_mb
        at_launch, sessions = at_launch_per_node or {}, sessions_per_node or {}
        if client_mb is not None and session_mb is not None and nodes in at_launch and nodes in sessions:
            # During the launch every node's control master is open, and the direct launcher's
            # sessions (`ssh -T ... launch.node`, each until its node's ranks are seated) ride them:
            # as many at once as the fan-out's run held (its waves bound them).
            figures["sessions_counted"] = sessions[nodes] * nodes
            figures["launch_peak_rss_mb"] = (
                figures["master_own_rss_mb"] + at_launch[nodes] * nodes * client_mb
                + sessions[nodes] * nodes * session_mb
            )  # fmt: skip


def build(
    results: dict[tuple[str, int, str], dict[str, Any]],
    sizes: Sequence[int],
    per_node: int,
    heartbeat_s: float,
    checkin_cap_s: float,
    held_per_node: dict[int, float] | None = None,
    parts: Collection[str] = ("fanout", "scenarios"),
    at_launch_per_node: dict[int, float] | None = None,
    sessions_per_node: dict[int, float] | None = None,
) -> list[Row]:
    client = ssh_rss.load()
    client_mb = client["control_master"]["rss_mb"] if client else None
    session_mb = client["session"]["rss_mb"] if client else None
    count_ssh_clients(
        results, held_per_node or {}, client_mb, at_launch_per_node, session_mb, sessions_per_node
    )
    rows = [] if client is None else [ssh_client_row(client)]
    for nodes in sizes:
        runs = {
            f"{side} {scenario}": figures for (side, n, scenario), figures in results.items() if n == nodes
        }
        details = {
            label: {k: v for k, v in figures.items() if k in _DETAILS} for label, figures in runs.items()
        }
        for name, figure, unit, target in _figures(per_node, heartbeat_s, nodes):
            key = _key(name, nodes)
            cap = checkin_cap_s if name == "checkin_s" else None
            ours, theirs = _values(results, "ours", nodes, name), _values(results, "theirs", nodes, name)
            if name in _FROM_CHECKINS and nodes == sizes[-1] and "checkins" not in parts:
                ours = theirs = []  # the check-in-only runs' row: never rewritten from the scenarios' two
            if not ours:
                errors = [f.get("error") for f in runs.values() if f.get("error")]
                why = "; ".join(errors)[:300] or "no run finished in the budget"
                if name in ("master_rss_mb", "launch_peak_rss_mb") and not errors:
                    why = "needs the fan-out's ssh clients and the scenarios' process (fanout,scenarios)"
                if name in _FROM_CHECKINS and not errors:
                    why = "needs the check-in-only runs (SWARM_PARTS=checkins)"
                rows.append(failed_row(key, figure, why))
                continue
            rows.append(
                Row(
                    key, figure, unit, stat(ours, cap), stat(theirs, cap) if theirs else None,
                    OLD_LABEL if theirs else "", target if nodes == LARGEST else None,
                    details=details if name == "checkin_s" else {},
                    note=_note(name, results, nodes, client_mb),
                )
            )  # fmt: skip
        rows += _checkin_max(results, nodes) + soak_rows(results, nodes, heartbeat_s)
        rows += straggler_rows(results, nodes)
    return rows


def straggler_rows(results: dict[tuple[str, int, str], dict[str, Any]], nodes: int) -> list[Row]:
    """The master's CPU with the straggler scenario (a fifth of the ranks slow), its own row."""
    found = results.get(("ours", nodes, "reset, stragglers"))
    if found is None:
        return []
    key = _key("master_cpu_pct_stragglers", nodes)
    figure = (f"Master CPU, steady 20 s, with the straggler scenario (0.4 + 1e-4 x rank s: every rank past "
              f"the first fifth > 1.3x the median; {nodes} nodes x 8 ranks)")  # fmt: skip
    if found.get("master_cpu_pct") is None:
        return [failed_row(key, figure, found.get("error", "the run ended before its window"))]
    target = Target("ours", "<=", 15.0, "≤ 15 % of one core") if nodes == LARGEST else None
    note = f"swarm {found['swarm_cpu_pct']:.0f} % of a core" if "swarm_cpu_pct" in found else ""
    return [Row(key, figure, "%", stat([found["master_cpu_pct"]]), target=target, note=note)]


def _key(name: str, nodes: int) -> str:
    return f"swarm.{name}" if nodes == LARGEST else f"swarm.{name}.n{nodes}"


def _note(
    name: str, results: dict[tuple[str, int, str], dict[str, Any]], nodes: int, client_mb: float | None
) -> str:
    if name == "launch_peak_rss_mb":
        return (
            "ours: process + children + one control master per node and the launch sessions (ssh -T ... "
            "launch.node) the fan-out held at once (its waves: launch.fanout.LAUNCH_WAVE), each at a real "
            "OpenSSH client's RSS (swarm.ssh_client_rss_mb); a session ends once its node's ranks are seated"
        )
    if name == "master_rss_mb":
        held = {f.get("ssh_clients_counted") for (s, n, _), f in results.items() if (s, n) == ("ours", nodes)}
        held.discard(None)
        if client_mb is None or not held:
            return "ours: the process and its children only (no ssh client figure: python -m bench.ssh_rss)"
        own = [f["master_own_rss_mb"] for (s, n, _), f in results.items()
               if (s, n) == ("ours", nodes) and "master_own_rss_mb" in f]  # fmt: skip
        client = ssh_rss.load() or {}
        private = client.get("control_master", {}).get("private_mb")
        by_private = (
            f"; counted at a client's private memory ({private:.2f} MB, the rest is shared libraries): "
            f"{max(own) + max(held) * private:.0f} MB"
            if private and own
            else ""
        )
        return (
            f"ours: process + children + {max(held):.0f} held control masters x {client_mb:.2f} MB RSS "
            f"(a real OpenSSH client, swarm.ssh_client_rss_mb){by_private}; the old server: its process alone"
        )
    if name in ("checkin_s", "handshake_failures") and _checkins(results, "ours", nodes):
        runs = len(_checkins(results, "ours", nodes))
        return f"ours: {runs} check-in-only runs" + (" (total)" if name == "handshake_failures" else "")
    return ""


def _checkin_max(results: dict[tuple[str, int, str], dict[str, Any]], nodes: int) -> list[Row]:
    values = [float(f["checkin_s"]) for f in _checkins(results, "ours", nodes) if "checkin_s" in f]
    if not values:
        return []
    figure = f"Check-in, the slowest of {len(values)} check-in-only runs ({nodes} nodes x 8 ranks)"
    return [Row(_key("checkin_max_s", nodes), figure, "s", stat([max(values)]))]


def soak_rows(
    results: dict[tuple[str, int, str], dict[str, Any]], nodes: int, heartbeat_s: float
) -> list[Row]:
    soak = results.get(("ours", nodes, "soak"))
    if soak is None:
        return []
    p99, losses = _key("beat_age_p99_s", nodes), _key("false_losses", nodes)
    if soak.get("beat_age_p99_s") is None:
        why = soak.get("error", "no sample")
        return [failed_row(p99, "Beat age p99 over the soak", why), failed_row(losses, "False losses", why)]
    length = f"{soak.get('soak_s', SOAK_S):.0f} s soak" + (
        f", ended at {soak['soak_ended_at_s']:.0f} s by a LOST event" if "soak_ended_at_s" in soak else ""
    )
    big = nodes == LARGEST
    bare = results.get(("ours", nodes, "soak, no straggler check")) or {}
    note = ""
    if bare.get("beat_age_p99_s") is not None:
        note = (f"without jobview's straggler check ({bare['soak_s']:.0f} s soak): p99 "
                f"{bare['beat_age_p99_s']:.2f} s, max {bare['beat_age_max_s']:.2f} s, "
                f"{bare['false_losses']} false losses; ")  # fmt: skip
    if "soak_master_cpu_pct" in soak:
        note += (
            f"master {soak['soak_master_cpu_pct']:.0f} %, swarm {soak['soak_swarm_cpu_pct']:.0f} % of a core"
        )
    details = {"soak": soak, "soak without the straggler check": bare}
    pace = protocol.beat_every(heartbeat_s)  # a relay's summary every `pace` s: the freshest age it allows
    return [
        Row(p99, f"Beat age p99: now - last_seen of every admitted rank, sampled each second ({length}, "
            f"{nodes} nodes x 8)", "s", stat([soak["beat_age_p99_s"]]),
            target=Target("ours", "<=", pace + 0.5, f"≤ a relay's pace + 0.5 s = {pace + 0.5:.1f} s")
            if big else None,
            note=note, details=details),
        Row(losses, f"False losses: LOST events with nobody killed ({length}, {nodes} nodes x 8; heartbeat "
            f"timeout {heartbeat_s:.0f} s)", "", stat([soak["false_losses"]]),
            target=Target("ours", "<=", 0.0, "0") if big else None),
    ]  # fmt: skip


def ssh_client_row(client: dict[str, Any]) -> Row:
    figure = (
        f"One real OpenSSH client's RSS: a control master (open_connections' options) against an sshd "
        f"container of {client['image']} ({client['version'].split(',')[0]})"
    )
    return Row("swarm.ssh_client_rss_mb", figure, "MB", stat([client["control_master"]["rss_mb"]]),
               note=f"measured {client['measured']} by python -m bench.ssh_rss", details=client)  # fmt: skip
