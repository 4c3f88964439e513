"""`python -m bench` (`make bench`): run the benchmarks, write bench/results/latest.{json,md}, print
the table.

  python -m bench                      everything (under 20 minutes on 2 cores)
  python -m bench --only launch,scale  some of them (merged into latest.json / latest.md)
  python -m bench --repeat 5           override every repetition count
Names: render, control, floor, image, throughput, launch (time to first step + overhead), failure, scale,
fabric (the fabric check's wall time and bandwidth beside a plain all-reduce loop), save (a checkpoint save
with issue 24's steps beside the save before them), report (the final report of 8,000 ranks x 50,000 steps:
peak memory beside the base commit's), swarm (the control plane at 64-1,000 nodes x 8 simulated ranks,
beside the old server), elastic (a node killed -> first step on the nodes left, beside torchrun's agent),
slurm (sbatch -> every stub rank running on 32 and 64 Slurm test nodes, ours by srun steps vs plain srun).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    control,
    elastic,
    fabric,
    failure,
    floor,
    image,
    launch,
    report,
    report_scale,
    restart,
    save,
    scale,
    slurm_launch,
    swarm,
    throughput,
)
from bench.common import ROOT, WORK, Ctx, Row, cpu_count, failed_row, image_present, load_average, log
from bench.nodes import sweep

RESULTS = Path(__file__).resolve().parent / "results"

# name -> (runner, share of the time budget in seconds, least seconds one run needs, needs the image).
# Shares are cumulative deadlines: time a bench leaves unused goes to the next ones.
SUITE: dict[str, tuple[Callable[[Ctx], list[Row]], float, float, bool]] = {
    "render": (scale.run_render, 5, 2, False),
    "control": (control.run, 60, 30, False),
    "floor": (floor.run, 180, 60, False),
    "image": (image.run, 50, 30, True),
    "throughput": (throughput.run, 300, 60, False),  # 4 interleaved pairs: the ±3 % check needs them
    "save": (save.run, 60, 40, False),  # checkpoint save, 2 CPU ranks: issue 24's steps vs before
    "launch": (launch.run, 360, 120, True),
    "failure": (failure.run, 430, 200, True),
    "scale": (lambda ctx: scale.run(ctx, RESULTS), 150, 60, True),
    "fabric": (fabric.run, 240, 120, True),
    "report": (report_scale.run, 150, 90, False),  # the final report at 8,000 ranks: peak RSS, ours vs base
    # 64, 256, 1,000 nodes x 8 swarm ranks, ours and the old server; the fan-out over a fake ssh, the
    # check-in-only runs and the soak (SWARM_SOAK_S) on top
    "swarm": (swarm.run, swarm.BUDGET_S, 120, False),
    "elastic": (elastic.run, 900, 400, True),  # a node killed -> next attempt's first step, ours vs torchrun
    "restart": (restart.run, 300, 120, True),  # a rank killed -> next first step, zygote warm vs off
    "slurm": (slurm_launch.run, 600, 300, True),  # 32 and 64 Slurm test nodes: ours (srun steps) vs srun
}
# The whole suite's budget: every share in full (about 59 min on 2 cores).
DEFAULT_BUDGET = float(sum(share for _runner, share, _least, _image in SUITE.values()))


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu_count()} CPU cores ({cpu}), {mem:.0f} GiB RAM, {platform.system()} {platform.release()}"


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that every finally (cluster removal) runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(SUITE)}")
    parser.add_argument("--repeat", type=int, help="repetitions for every measurement (default: per bench)")
    parser.add_argument("--image", default=os.environ.get("GAUDI_CLUSTER_IMAGE", "gaudi-cluster:cpu"))
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help="seconds; a bench that would not finish inside is skipped and says so",
    )
    parser.add_argument("--note", action="append", default=[], help="a note printed above the table")
    args = parser.parse_args(argv)
    names = list(SUITE) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        print(
            f"bench: error: unknown bench {', '.join(unknown)}; choose from {', '.join(SUITE)}",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    WORK.mkdir(parents=True, exist_ok=True)
    key_dir = Path(tempfile.mkdtemp(prefix="keys-", dir=WORK)) / "keys"
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(key_dir)], check=True, capture_output=True)
    ctx = Ctx(image=args.image, key_dir=key_dir, repeat=args.repeat)
    started = time.time()
    notes = [*args.note, f"load average at start: {load_average()}"]
    rows: list[Row] = []
    has_image = image_present(args.image)
    share_end = started
    bench_of: dict[str, str] = {}  # row key -> the bench that measured it (keys need not share its name)
    try:
        for name in names:
            runner, share, estimate, needs_image = SUITE[name]
            share_end += share * args.budget / DEFAULT_BUDGET
            # --only: the benches named share the whole budget (iteration, --repeat)
            ctx.deadline = started + args.budget if args.only else min(share_end, started + args.budget)
            if needs_image and not has_image:
                rows.append(failed_row(f"{name}", name, f"image {args.image} is missing (make image-cpu)"))
                continue
            elapsed = time.time() - started
            if elapsed + estimate > args.budget:
                rows.append(
                    failed_row(
                        f"{name}",
                        name,
                        f"skipped: {elapsed:.0f}s spent, ~{estimate:.0f}s more "
                        f"would pass the {args.budget:.0f}s budget",
                    )
                )
                continue
            log(f"{name}: starting (load average {load_average()})")
            t = time.time()
            try:
                produced = runner(ctx)
            except Exception as exc:
                produced = [failed_row(name, name, f"{type(exc).__name__}: {str(exc)[:600]}")]
            bench_of.update(dict.fromkeys((row.key for row in produced), name))
            rows += produced
            log(f"{name}: done in {time.time() - t:.0f}s")
    finally:
        sweep()
        shutil.rmtree(key_dir.parent, ignore_errors=True)
    notes.append(f"load average at end: {load_average()}")
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "duration_s": time.time() - started,
        "image": args.image,
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
        if (sys.argv[1:] if argv is None else argv)
        else "make bench",
        "benches": names,
        "repeat": args.repeat,
        "notes": notes,
    }
    rows = report.write(RESULTS, rows, meta, merge=bool(args.only), bench_of=bench_of)
    print(report.plain_table(rows))
    print(f"\n{RESULTS / 'latest.md'} ({meta['duration_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
