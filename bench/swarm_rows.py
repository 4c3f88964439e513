"""The rows of `bench.swarm`: each figure at every size, ours beside the old server's (interleaved runs).

Keys: `swarm.<figure>` at the largest size (where the issue's targets apply), `swarm.<figure>.n<nodes>`
at the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import Row, Target, failed_row, stat

_DETAILS = ("swarm_cpu_pct", "named_line", "error", "welcomed", "checkin_capped", "master_cpu_pct",
            "reset_named_s", "silence_named_s", "stop_all_s", "first_stop_s", "master_died_at_s")  # fmt: skip
LARGEST = 1000  # where the targets apply
OLD_LABEL = "the old server (96699ce: a thread per agent), interleaved"


def _figures(per_node: int, heartbeat_s: float, nodes: int) -> list[tuple[str, str, str, Target]]:
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
    values = []
    for scenario in ("reset", "silence"):
        value = results.get((side, nodes, scenario), {}).get(source)
        if value is not None:
            values.append(float(value))
    return values


def build(
    results: dict[tuple[str, int, str], dict[str, Any]],
    sizes: Sequence[int],
    per_node: int,
    heartbeat_s: float,
    checkin_cap_s: float,
) -> list[Row]:
    rows = []
    for nodes in sizes:
        runs = {
            f"{side} {scenario}": figures for (side, n, scenario), figures in results.items() if n == nodes
        }
        details = {
            label: {k: v for k, v in figures.items() if k in _DETAILS} for label, figures in runs.items()
        }
        for name, figure, unit, target in _figures(per_node, heartbeat_s, nodes):
            key = f"swarm.{name}" if nodes == LARGEST else f"swarm.{name}.n{nodes}"
            cap = checkin_cap_s if name == "checkin_s" else None
            ours, theirs = _values(results, "ours", nodes, name), _values(results, "theirs", nodes, name)
            if not ours:
                errors = [f.get("error") for f in runs.values() if f.get("error")]
                rows.append(
                    failed_row(key, figure, "; ".join(errors)[:300] or "no run finished in the budget")
                )
                continue
            rows.append(
                Row(
                    key, figure, unit, stat(ours, cap), stat(theirs, cap) if theirs else None,
                    OLD_LABEL if theirs else "", target if nodes == LARGEST else None,
                    details=details if name == "checkin_s" else {},
                )
            )  # fmt: skip
    return rows
