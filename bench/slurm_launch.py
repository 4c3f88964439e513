"""Bench `slurm`: our launch under a real Slurm against plain `srun` of the same stub ranks.

The Slurm test cluster of tests/slurm (controller + node containers of the image, Slurm 22.05),
grown to 32 and then 64 nodes (SLURM_SIZES). Both sides start one stub rank per node that prints its
start time and exits: ours through the shipped slurm/gaudi-cluster.sbatch in direct mode (node 0
becomes the master, which probes and launches by srun steps: nodes/srun), plain Slurm through
`sbatch --wrap 'srun ...'`.
Figure: sbatch submitted -> the last stub rank running (the latest start time a stub printed; the
containers share the host's clock), interleaved runs. Rows `slurm.launch_ratio` (32 nodes) and
`slurm.launch_ratio.n64` (ours / srun), and the two times beside each.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import time
from pathlib import Path

from bench.common import Ctx, Row, Target, failed_row, log, stat

# Issue 34's rows: 32 nodes (slurm.launch_ratio) and 64 (slurm.launch_ratio.n64); SLURM_SIZES reruns some.
SIZES = tuple(int(n) for n in os.environ.get("SLURM_SIZES", "32,64").split(",") if n)
TARGETS = {32: 1.2, 64: 1.3}
CAP_S = 300.0
# One line per rank: its own start time, printed at once.
STUB = "import time; print('stub-up', repr(time.time()), flush=True)"
_UP = re.compile(r"stub-up (\d+\.\d+)")


def _last_start(output: str, ranks: int) -> float | None:
    starts = [float(found) for found in _UP.findall(output)]
    return max(starts) if len(starts) >= ranks else None


def _masters_lines(output: str, chars: int = 520) -> str:
    """The end of what the master said (a failed run's reason), each line cut to 160 characters (the
    launch line names every node), not the workers' many lines of their end nor the stubs'."""
    noise = ("gaudi-cluster[worker]", "gaudi-cluster[entrypoint]")
    said = [line[:160] for line in output.splitlines() if not (line.startswith(noise) or "stub-up" in line)]
    return " | ".join(said)[-chars:]


def _ours(cluster, ranks: int) -> float:
    began = time.time()
    job = cluster.submit("python3", "-u", "-c", STUB)
    state = cluster.wait_for_end(job, timeout=CAP_S)
    output = cluster.output(job)
    last = _last_start(output, ranks)
    if state != "COMPLETED" or last is None:
        raise RuntimeError(f"ours: job {job} {state or 'timed out'}: {_masters_lines(output)}")
    if "started by srun" not in output:
        raise RuntimeError(f"ours: job {job} was not started by srun: {output[-1500:]}")
    return last - began


def _plain(cluster, ranks: int) -> float:
    from tests.support.slurm import CONTROLLER, JOB_DIR

    wrap = f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 python3 -u -c {shlex.quote(STUB)}"
    began = time.time()
    done = cluster.exec(
        CONTROLLER,
        "sbatch", "--parsable", f"-N{ranks}", "--exclusive", f"--chdir={JOB_DIR}",
        f"--output={JOB_DIR}/gaudi-cluster-%j.out", f"--wrap={wrap}",
        check=True,
    )  # fmt: skip
    job = int(done.stdout.strip().split(";")[0])
    state = cluster.wait_for_end(job, timeout=CAP_S)
    output = cluster.output(job)
    last = _last_start(output, ranks)
    if state != "COMPLETED" or last is None:
        raise RuntimeError(f"srun: job {job} {state or 'timed out'}: {output[-1500:]}")
    return last - began


def run(ctx: Ctx) -> list[Row]:
    from tests.support.docker import docker
    from tests.support.slurm import SLURM_TEST_DIR, slurm_image_tag

    tag = slurm_image_tag(ctx.image)
    docker(
        "build", "-q", "-t", tag, "--build-arg", f"BASE_IMAGE={ctx.image}", str(SLURM_TEST_DIR), timeout=900
    )
    return [row for nodes in SIZES for row in run_size(ctx, tag, nodes)]


def row_key(nodes: int) -> str:
    return "slurm.launch_ratio" if nodes == 32 else f"slurm.launch_ratio.n{nodes}"


def run_size(ctx: Ctx, tag: str, size: int) -> list[Row]:
    from tests.support.slurm import SlurmCluster

    figure = f"sbatch -> every stub rank running, {size} Slurm nodes (ours, srun steps inside, vs plain srun)"
    nodes = tuple(f"node{i}" for i in range(1, size + 1))
    times: dict[str, list[float]] = {"ours": [], "srun": []}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gc-bench-slurm-") as tmp:
        cluster = SlurmCluster(tag, ctx.key_dir, Path(tmp), nodes=nodes)
        try:
            cluster.start()
            reps = ctx.reps(3)
            last = 0.0
            for rep in range(reps):
                for who in ("ours", "srun") if rep % 2 == 0 else ("srun", "ours"):  # interleaved
                    if last and not ctx.can_start(last):
                        errors.append(f"time budget: {who} repetition {rep + 1} not run")
                        continue
                    began = time.time()
                    try:
                        took = (_ours if who == "ours" else _plain)(cluster, size)
                        times[who].append(took)
                        log(f"slurm {size}: {who} {rep + 1}/{reps}: every rank running after {took:.2f}s")
                    except Exception as exc:  # a failed run is a note, not the end of the bench
                        errors.append(str(exc)[:600])
                        log(f"slurm {size}: {who} failed: {str(exc)[:600]}")
                        cluster.cancel_leftovers()
                    last = time.time() - began
        finally:
            cluster.remove()
    if not times["ours"] or not times["srun"]:
        return [failed_row(row_key(size), figure, "; ".join(errors) or "no run")]
    limit = TARGETS.get(size)
    return [
        Row(
            row_key(size),
            figure,
            "s",
            stat(times["ours"], cap=CAP_S),
            stat(times["srun"], cap=CAP_S),
            f"sbatch --wrap 'srun' of the same stub, {size} nodes",
            Target("ratio", "<=", limit, f"ratio ≤ {limit}") if limit else None,
            note="; ".join(errors),
            details={"nodes": size, "cluster_start_s": round(cluster.start_seconds, 2), **times},
        )
    ]
