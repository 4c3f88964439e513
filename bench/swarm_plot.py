"""bench/results/swarm.png: each swarm row against the node count, ours and the old server's.

The sizes this run did not measure (SWARM_SIZES) come from latest.json's earlier rows, so a rerun of
one size still plots all three.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.common import Row, row_from_dict
from bench.swarm_rows import LARGEST

PNG = "swarm.png"
_KEY = re.compile(r"^swarm\.([a-z0-9_]+?)(?:\.n(\d+))?$")


def series(rows: list[Row]) -> dict[str, dict[str, dict[int, float]]]:
    """name -> side ("ours", "theirs") -> nodes -> median."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for row in rows:
        found = _KEY.match(row.key)
        if not found or row.ours.median is None:
            continue
        name, nodes = found[1], int(found[2] or LARGEST)
        sides = out.setdefault(name, {"ours": {}, "theirs": {}})
        sides["ours"][nodes] = row.ours.median
        if row.theirs is not None and row.theirs.median is not None:
            sides["theirs"][nodes] = row.theirs.median
    return {name: sides for name, sides in out.items() if len(sides["ours"]) > 1}


def _earlier(results_dir: Path) -> list[Row]:
    try:
        data = json.loads((results_dir / "latest.json").read_text())
        return [row_from_dict(r) for r in data.get("rows", []) if r["key"].startswith("swarm.")]
    except (OSError, ValueError, KeyError):
        return []


def keep_earlier(rows: list[Row], results_dir: Path) -> list[Row]:
    """A partial rerun (SWARM_SIZES, SWARM_PARTS): every swarm row it did not measure comes back from
    latest.json as it was (the report's merge would drop them: they are the same bench's), said so."""
    earlier = {row.key: row for row in _earlier(results_dir) if row.key != "swarm.report_rss_mb"}
    mark = "kept from an earlier run (this one left it out)"

    def kept(row: Row) -> Row:
        row.note = row.note if mark in row.note else f"{row.note}; {mark}".lstrip("; ")
        return row

    out = [row if row.ours.values or row.key not in earlier else kept(earlier[row.key]) for row in rows]
    seen = {row.key for row in rows}
    return out + [kept(row) for key, row in earlier.items() if key not in seen]


def plot(rows: list[Row], out_png: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(rows)
    if not lines:
        return None
    columns = 4
    count = len(lines)
    fig, axes = plt.subplots(-(-count // columns), columns, figsize=(4 * columns, 3 * -(-count // columns)))
    flat = list(axes.flat) if hasattr(axes, "flat") else [axes]
    for ax, (name, sides) in zip(flat, sorted(lines.items()), strict=False):
        for side, style in (("ours", "o-"), ("theirs", "s--")):
            points = sorted(sides[side].items())
            if points:
                ax.plot([n for n, _ in points], [v for _, v in points], style, label=side)
        ax.set_xscale("log")
        ax.set_xticks([64, 256, 1000], ["64", "256", "1000"])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("nodes (x 8 ranks)", fontsize=8)
        ax.legend(fontsize=7)
    for ax in flat[count:]:
        ax.set_visible(False)
    fig.suptitle("swarm.* against node count (ours: this tree; theirs: the old server 96699ce or pdsh)")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=80)
    plt.close(fig)
    return out_png


def plot_rows(rows: list[Row], results_dir: Path) -> list[Row]:
    """Draw the plot from this run's rows over the earlier ones; link it from the check-in row's note
    (the markdown table shows notes). Returns no rows of its own."""
    fresh = {row.key for row in rows}
    png = plot([*(r for r in _earlier(results_dir) if r.key not in fresh), *rows], results_dir / PNG)
    if png is not None:
        link = f"plot of every swarm row: [{PNG}]({PNG})"
        for row in rows:  # one link, on the largest size's row (a kept row may carry an older one)
            row.note = row.note.replace(f"; {link}", "").replace(link, "").lstrip("; ")
        checkins = [row for row in rows if row.key.startswith("swarm.checkin_s")]
        for row in sorted(checkins, key=lambda r: r.key != "swarm.checkin_s")[:1]:  # the largest size first
            row.note = row.note if link in row.note else f"{row.note}; {link}".lstrip("; ")
    return []
