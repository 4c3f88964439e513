"""latest.json and latest.md: one row per figure with ours/theirs medians, ratio, runs, spread, target."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from bench.common import Row, Stat, row_from_dict


def _num(x: float, unit: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if unit == "GB":
        return f"{x:.2f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_median(s: Stat | None, unit: str) -> str:
    if s is None or not s.values:
        return "—"
    text = _num(s.median, unit)
    if s.median_capped:
        return f"> {_num(s.cap, unit)} (cap)"
    return f"{text} {unit}".strip()


def fmt_spread(s: Stat | None, unit: str) -> str:
    if s is None or not s.values:
        return "—"
    if s.n == 1:
        return "1 run"
    lo, hi = min(s.values), max(s.values)
    text = f"{_num(lo, unit)}–{_num(hi, unit)}"
    if s.capped:
        text += f" ({s.capped} at cap)"
    return text


def fmt_ratio(row: Row) -> str:
    r = row.ratio
    if r is None:
        return "—"
    if row.theirs is not None and row.theirs.median_capped and not row.ours.median_capped:
        return f"< {r:.2f}"
    if row.ours.median_capped and row.theirs is not None and not row.theirs.median_capped:
        return f"> {r:.2f}"
    if row.ours.median_capped and row.theirs is not None and row.theirs.median_capped:
        return "?"
    return f"{r:.2f}"


def fmt_met(row: Row) -> str:
    m = row.met
    if row.target is None:
        return ""
    return {True: "yes", False: "**NO**", None: "?"}[m]


def markdown(rows: list[Row], meta: dict) -> str:
    head = [
        f"Benchmarks of {meta['date']} on {meta['machine']} "
        f"(`{meta.get('command', 'make bench')}`, {meta['duration_s']:.0f} s).",
        "Medians; spread is min–max over the runs; ratio = ours / theirs (medians, same run, interleaved).",
    ]
    head += [f"Note: {n}" for n in meta.get("notes", [])]
    lines = [
        *head,
        "",
        "| figure | ours (median) | theirs (median) | ratio | runs (ours/theirs) | spread ours · theirs "
        "| target | met? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        theirs = fmt_median(row.theirs, row.unit)
        if row.theirs is not None and row.theirs_label:
            theirs += f" ({row.theirs_label})"
        runs = f"{row.ours.n}" + (f"/{row.theirs.n}" if row.theirs is not None else "")
        spread = fmt_spread(row.ours, row.unit) + (
            f" · {fmt_spread(row.theirs, row.unit)}" if row.theirs else ""
        )
        figure = row.figure.replace("|", "\\|")
        if row.note:
            # A note can carry a failed run's log tail: one line, or the table row breaks.
            note = " ".join(row.note.split()).replace("|", "/")
            figure += f" <br><sub>{note[:400]}</sub>"
        lines.append(
            f"| {figure} | {fmt_median(row.ours, row.unit)} | {theirs} | {fmt_ratio(row)} | {runs} | "
            f"{spread} | {row.target.text if row.target else ''} | {fmt_met(row)} |"
        )
    return "\n".join(lines) + "\n"


def plain_table(rows: list[Row]) -> str:
    """The same table for a terminal."""
    out = []
    for row in rows:
        out.append(
            f"{row.figure[:78]:78s} ours {fmt_median(row.ours, row.unit):>16s}  theirs "
            f"{fmt_median(row.theirs, row.unit):>16s}  ratio {fmt_ratio(row):>6s}  n {row.ours.n}"
            f"{'/' + str(row.theirs.n) if row.theirs else '':3s}  "
            f"{row.target.text if row.target else '':>14s} "
            f"{fmt_met(row)}"
        )
        if row.note.startswith("NOT MEASURED"):
            out.append(f"    {row.note[:300]}")
    return "\n".join(out)


def write(
    results_dir: Path, rows: list[Row], meta: dict, merge: bool, bench_of: Mapping[str, str] | None = None
) -> list[Row]:
    """Write latest.json and latest.md. With merge (--only), rows of earlier runs that were not re-measured
    are kept (marked with their own date in the JSON)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    bench_of = bench_of or {}
    data = {
        "meta": meta,
        "rows": [
            {**r.as_dict(), "measured": meta["date"], "bench": bench_of.get(r.key, r.key.split(".")[0])}
            for r in rows
        ],
    }
    if merge and (results_dir / "latest.json").exists():
        try:
            old = json.loads((results_dir / "latest.json").read_text())
            fresh = {r["key"]: r for r in data["rows"]}
            benches = {r["bench"] for r in fresh.values()}  # a re-run bench replaces all its old rows
            merged = [
                fresh.pop(r["key"], r)
                for r in old.get("rows", [])
                if r["key"] in fresh or r.get("bench", r["key"].split(".")[0]) not in benches
            ]
            data["rows"] = merged + list(fresh.values())
            rows = [row_from_dict(r) for r in data["rows"]]
            meta["notes"] = [
                *meta.get("notes", []),
                "partial run (--only): rows not re-measured keep their "
                "earlier values (see 'measured' in latest.json)",
            ]
        except (ValueError, KeyError):
            pass
    tmp = results_dir / "latest.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(results_dir / "latest.json")
    tmp = results_dir / "latest.md.tmp"
    tmp.write_text(markdown(rows, meta))
    tmp.replace(results_dir / "latest.md")
    return rows
