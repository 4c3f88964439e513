"""A rank killed → the next attempt's first step (issue 34's restart row), zygote warm against off.

On a fresh 3-container cluster with a held master, `gaudi-cluster master --max-restarts 1` runs the
short default job; a few steps in, worker 2's rank is killed (SIGKILL to the process group its pid file
names, as a rank that crashes). The master stops the attempt and starts the next on the same nodes.
Zygote on (the default): each node's zygote, warm from the first attempt, forks the next attempt's
ranks. Zygote off (`GAUDI_CLUSTER_PREIMPORT=0`): every rank of the next attempt imports from cold, as
any launcher's restart does. The figure: the kill → the next attempt's `first_step` event (each
attempt's events file on the master's container), capped. Interleaved, fresh containers each run.
"""

from __future__ import annotations

import time

from bench.common import Ctx, Row, Streamed, Target, failed_row, interleaved, stat
from bench.elastic import first_steps_of_our_attempts
from bench.nodes import bring_up_held, job_argv, new_cluster

CAP = 180.0
LONG_STEPS = 1_000_000
WHO = ("warm", "off")
# The rank's process group, from its pid file ("<group> <agent>"): what a crash ends, not its agent.
KILL_RANKS = 'for f in /run/gaudi-cluster/jobs/*/rank*.pid; do kill -s KILL -- "-$(cut -d" " -f1 "$f")"; done'


def scenario(ctx: Ctx, who: str) -> dict:
    cluster = new_cluster(ctx, f"restart-{who}")
    proc: Streamed | None = None
    try:
        bring_up_held(cluster)
        argv = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0"]
        argv += [] if who == "warm" else ["-e", "GAUDI_CLUSTER_PREIMPORT=0"]
        argv += [cluster.master, "gaudi-cluster", "master", "--max-restarts", "1"]
        proc = Streamed(
            [*argv, *job_argv(f"/workspace/output/restart-{who}", LONG_STEPS)], container=cluster.master
        )
        running = proc

        def steps() -> list[float]:
            return first_steps_of_our_attempts(cluster.master, running.lines)

        if not proc.wait_for(lambda: bool(steps()), 480):
            raise RuntimeError(f"no first step:\n{proc.tail(40)}")
        time.sleep(2.0)  # a few steps in
        t_fault = time.time()
        killed = cluster.exec(cluster.worker(2), "sh", "-c", KILL_RANKS)
        if killed.returncode != 0:
            raise RuntimeError(f"cannot kill worker 2's rank: {killed.stderr}")
        restarted: float | None = None
        while time.time() - t_fault < CAP and restarted is None and proc.t_exit is None:
            later = [t for t in steps() if t > t_fault]
            restarted = later[0] - t_fault if later else None
            time.sleep(0.5)
        return {"restarted_s": restarted, "exit_code": proc.proc.returncode, "tail": proc.tail(12)}
    finally:
        if proc is not None:
            proc.stop()
        cluster.remove()


def run(ctx: Ctx) -> list[Row]:
    results, errors = interleaved(
        ctx,
        "restart: zygote",
        WHO,
        lambda who: scenario(ctx, who),
        lambda result: f"kill → next attempt's first step {result['restarted_s']}",
    )
    figure = "A rank killed mid-run → the next attempt's first step, 3 nodes (ours: zygote warm vs off)"
    if not results["warm"]:
        return [failed_row("restart.rank_kill_to_next_step", figure, "; ".join(errors) or "no run")]

    def values(who: str) -> list[float]:
        return [CAP if r["restarted_s"] is None else r["restarted_s"] for r in results[who]]

    return [
        Row(
            "restart.rank_kill_to_next_step",
            figure,
            "s",
            stat(values("warm"), cap=CAP),
            stat(values("off"), cap=CAP) if results["off"] else None,
            "ours, zygote off (GAUDI_CLUSTER_PREIMPORT=0: the next attempt imports cold)",
            Target("ratio", "<=", 0.5, "ratio ≤ 0.50 (issue 34)"),
            note="; ".join(errors),
            details=results,
        )
    ]
