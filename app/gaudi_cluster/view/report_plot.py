"""The job report's picture, job_report.png: each rank's own work per step over the run (a small job),
or each node's median and slowest rank (a big one), the stragglers highlighted. Drawn by the master at
the end of an attempt, on matplotlib's Agg backend when matplotlib is there.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# rank -> (step, own work seconds) in step order, each iterable more than once (a list, a WorkHistory):
# 8,000 ranks are read rank by rank, never copied into tuples all at once.
Histories = Mapping[int, Collection[tuple[int, float]]]
PER_RANK_LINES = 16  # up to this many ranks, one line each; beyond, one median and one max per node


@dataclass(frozen=True)
class NodeSeries:
    """One node's work per step: the median and the slowest of its ranks, bucket by bucket."""

    host: str
    steps: tuple[int, ...]
    median_s: tuple[float, ...]
    max_s: tuple[float, ...]


def node_series(histories: Histories, rank_hosts: Mapping[int, str]) -> list[NodeSeries]:
    """Per node, its ranks' points on one grid (the coarsest bucket width among them), then the
    median and the max across its ranks at each step."""
    by_host: dict[str, list[int]] = {}
    for rank in histories:
        by_host.setdefault(rank_hosts.get(rank, "?"), []).append(rank)
    out = []
    for host, ranks in by_host.items():
        width = max((_width(histories[rank]) for rank in ranks), default=1)
        columns: dict[int, list[float]] = {}
        for rank in ranks:
            mine: dict[int, list[float]] = {}
            for step, seconds in histories[rank]:
                mine.setdefault(step // width * width, []).append(seconds)
            for step, values in mine.items():
                columns.setdefault(step, []).append(sum(values) / len(values))
        steps = sorted(columns)
        if steps:
            medians = tuple(statistics.median(columns[s]) for s in steps)
            out.append(NodeSeries(host, tuple(steps), medians, tuple(max(columns[s]) for s in steps)))
    return sorted(out, key=lambda series: series.host)


def _width(points: Iterable[tuple[int, float]]) -> int:
    """The bucket width a downsampled history used: the smallest gap between its steps."""
    return min((b[0] - a[0] for a, b in itertools.pairwise(points)), default=1) or 1


def _pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def warm_up_plotting() -> None:
    """Import matplotlib ahead of the report (about 1 s of CPU here): done during training, it keeps
    the plot out of the time between a failure and the master's exit."""
    _pyplot()


def plot(
    histories: Histories, slow: set[int], path: Path, rank_hosts: Mapping[int, str] | None = None
) -> bool:
    """Work time per step: one line per rank for a small job; beyond PER_RANK_LINES ranks (with their
    hosts known), each node's median and slowest rank, the stragglers' nodes highlighted. False when
    matplotlib is missing or there is nothing to draw."""
    plt = _pyplot() if any(histories.values()) else None
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(histories) <= PER_RANK_LINES or rank_hosts is None:
        _plot_ranks(ax, histories, slow)
        ax.set_title("Per-rank step time")
    else:
        slow_by_host: dict[str, list[int]] = {}
        for rank in sorted(slow):
            slow_by_host.setdefault(rank_hosts.get(rank, "?"), []).append(rank)
        _plot_nodes(ax, node_series(histories, rank_hosts), slow_by_host)
        ax.set_title(f"Per-node step time ({len(histories)} ranks)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("own work per step (s, waits excluded)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_ranks(ax: Any, histories: Histories, slow: set[int]) -> None:
    for rank, points in sorted(histories.items()):
        if not points:
            continue
        steps, seconds = zip(*points, strict=True)
        style = {"color": "tab:red", "linewidth": 2.2} if rank in slow else {"linewidth": 1.0, "alpha": 0.7}
        ax.plot(steps, seconds, label=f"rank {rank}" + (" (straggler)" if rank in slow else ""), **style)


def _plot_nodes(ax: Any, series: Sequence[NodeSeries], slow_by_host: Mapping[str, Sequence[int]]) -> None:
    """Every node's two lines drawn as two collections (one artist each, not one per node), the
    nodes with a straggler on top, each with its own legend entry."""
    from matplotlib.collections import LineCollection

    def lines(values: str, nodes: Sequence[NodeSeries]) -> list[list[tuple[int, float]]]:
        return [list(zip(n.steps, getattr(n, values), strict=True)) for n in nodes]

    ax.add_collection(LineCollection(lines("max_s", series), colors="tab:orange", linewidths=0.6, alpha=0.35,
                                     label="each node: its slowest rank"))  # fmt: skip
    ax.add_collection(LineCollection(lines("median_s", series), colors="tab:blue", linewidths=0.6, alpha=0.35,
                                     label="each node: median of its ranks"))  # fmt: skip
    for node in (n for n in series if n.host in slow_by_host):
        ranks = ", ".join(map(str, slow_by_host[node.host]))
        label = f"{node.host}: straggler rank {ranks}"
        ax.plot(node.steps, node.max_s, color="tab:red", linewidth=2.0, label=label)
    ax.autoscale_view()
