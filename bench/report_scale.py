"""The final report of 1,000 nodes x 8 ranks x 50,000 steps: peak memory of a process building and writing
it (job_report.json and job_report.png), ours beside the base commit's (96699ce).

Ours: each rank's WorkHistory (view/history) as the control server leaves it after 50,000 steps. Feeding
400 million pairs through `extend` would take ~6 minutes of Python here, so a few template ranks take
the real 50,000 steps each and every rank is a copy of one of them with its own speed factor: the same
state (bucket sums and counts) those steps leave, hence the same memory and the same plot work.

The base's: a list of every (step, seconds) per rank and a line and a legend entry per rank. 400 million
tuples do not fit this machine (~48 GB), so it is measured at 40 and 80 ranks x 50,000 steps and
extrapolated along the line through those two points (its memory grows with the points it holds).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench.common import APP, ROOT, Ctx, Row, Target, failed_row, log, stat

BASE_COMMIT = "96699ce"
RANKS, PER_NODE, STEPS = 8000, 8, 50_000
OLD_SIZES = (40, 80)  # ranks of the base's runs, each x STEPS

_CHILD = """
import json, random, resource, sys, time
from array import array
from pathlib import Path
app, mode, ranks, steps, per_node, out = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), Path(sys.argv[6])
sys.path.insert(0, app)
from gaudi_cluster.view import report
rng = random.Random(25)
began = time.perf_counter()
def seconds(step, speed):
    return speed * (1.0 + 0.05 * ((step * 7919) % 13) / 13)
if mode == "new":
    from gaudi_cluster.view.history import WorkHistory
    templates = []
    for speed in (0.4, 0.41, 0.42, 0.43):
        history = WorkHistory()
        for start in range(1, steps + 1, 4):  # a beat brings a few steps at a time
            history.extend((s, seconds(s, speed)) for s in range(start, min(start + 4, steps + 1)))
        templates.append(history)
    histories = {}
    for rank in range(ranks):
        twin = templates[rank % 4].copy()
        factor = 2.2 if rank == 4321 else rng.uniform(0.97, 1.03)
        twin._sums = array("d", (total * factor for total in twin._sums))
        histories[rank] = twin
else:
    speeds = {r: 2.2 * 0.4 if r == 7 else 0.4 for r in range(ranks)}
    histories = {r: [(s, seconds(s, speeds[r])) for s in range(1, steps + 1)] for r in range(ranks)}
built_at = time.perf_counter()
hosts = {rank: f"node-{rank // per_node:04d}" for rank in range(ranks)}
slow = {4321 if mode == "new" else 7}
built = report.build(job_id="bench", state="succeeded", exit_code=0, reports={},
    ranks_by_host={h: per_node for h in sorted(set(hosts.values()))}, rank_hosts=hosts, preset_names=[],
    private_names=[], points={}, events=[], stragglers=[], failure=None)
written = report.write(built, histories, slow, out)
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
report_s = time.perf_counter() - built_at
names = [p.name for p in written]
took = {"histories_s": built_at - began, "report_s": report_s}
print(json.dumps({"peak_mb": peak_mb, **took, "written": names}))
"""


def _child(app: Path, mode: str, ranks: int, out: Path, timeout_s: float) -> dict:
    argv = [sys.executable, "-c", _CHILD, str(app), mode, str(ranks), str(STEPS), str(PER_NODE), str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _base_app(into: Path) -> Path:
    """The base commit's package, unpacked from git (no worktree: nothing in the repository changes)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", BASE_COMMIT, "app/gaudi_cluster"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "app"


def run(ctx: Ctx) -> list[Row]:
    key = "swarm.report_rss_mb"
    figure = f"Report of {RANKS:,} ranks x {STEPS:,} steps built and written: peak RSS of the process"
    reps = ctx.reps(2)
    ours, old, details = [], [], {"ours": [], "base": []}
    with tempfile.TemporaryDirectory(prefix="report-scale-") as scratch:
        work = Path(scratch)
        try:
            base = _base_app(work / "base")
        except (subprocess.CalledProcessError, OSError) as error:
            return [failed_row(key, figure, f"base commit {BASE_COMMIT} unavailable: {error}")]
        for rep in range(reps):  # interleaved: ours, then the base's two sizes
            mine = _child(APP, "new", RANKS, work / f"ours-{rep}", 600)
            ours.append(mine["peak_mb"])
            details["ours"].append(mine)
            log(f"report: ours {mine['peak_mb']:.0f} MB in {mine['report_s']:.1f}s")
            small, large = (_child(base, "old", n, work / f"base-{rep}-{n}", 600) for n in OLD_SIZES)
            slope = (large["peak_mb"] - small["peak_mb"]) / (OLD_SIZES[1] - OLD_SIZES[0])
            old.append(small["peak_mb"] + slope * (RANKS - OLD_SIZES[0]))
            details["base"].append({str(OLD_SIZES[0]): small, str(OLD_SIZES[1]): large, "mb_per_rank": slope})
            log(f"report: base {small['peak_mb']:.0f} / {large['peak_mb']:.0f} MB at {OLD_SIZES} ranks")
    return [
        Row(
            key,
            figure,
            "MB",
            stat(ours),
            stat(old),
            f"base {BASE_COMMIT}: every step kept, a line per rank (extrapolated from "
            f"{OLD_SIZES[0]} and {OLD_SIZES[1]} ranks)",
            Target("ours", "<=", 200.0, "≤ 200 MB"),
            note=f"ours: {RANKS // PER_NODE} per-node lines and the slowest ranks named",
            details=details,
        )
    ]
