"""Elastic recovery: a node killed mid-run → the first training step of the next attempt on the nodes left.

Ours: `gaudi-cluster master --min-nodes 2 --max-restarts 1` on a fresh 3-container cluster (held master,
the job started inside it with `docker exec`, as in the failure bench). Theirs: what a PyTorch user
picks for the same thing, torchrun's elastic agent (`--nnodes 2:3`, c10d rendezvous on the master's
container, `--max-restarts 3`), one agent per container, the same workload and arguments. Both sides
save a checkpoint every few steps and resume from the newest one; both get the same collective timeout
(DEEPSPEED_TIMEOUT, the smallest the workload takes: 1 minute), since torchrun learns of a lost node only
when a collective fails. The fault is `docker kill` of worker 2 a few steps in; the figure is the fault
→ the workload's `first_step` event of the restarted ranks (rank 0 prints it under torchrun and writes it
to its job's events file under our master), capped.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

from gaudi_cluster_dev.localcluster import LocalCluster

from bench.common import EVENT_PREFIX, Ctx, Row, Streamed, Target, failed_row, interleaved, stat
from bench.nodes import DS_CPU, RUN_CLM, bring_up_held, new_cluster, prepare_raw_env

CAP = 300.0
RDZV_PORT = 29400
TIMEOUT_MINUTES = "1"
_JOB = re.compile(r"job (\S+): \d+ ranks on")


def job(out: str) -> list[str]:
    return [
        RUN_CLM, "--do_train", "--output_dir", out, "--deepspeed", DS_CPU, "--max_steps", "1000000",
        "--save_steps", "4", "--save_total_limit", "2", "--logging_steps", "1", "--no_plot",
    ]  # fmt: skip


def first_steps(lines: list[tuple[float, str]]) -> list[float]:
    """The times of every `first_step` event printed (one per start of rank 0's process)."""
    found = []
    for _t, line in lines:
        index = line.find(EVENT_PREFIX)
        if index >= 0:
            with contextlib.suppress(ValueError):
                record = json.loads(line[index + len(EVENT_PREFIX) :])
                if record.get("event") == "first_step":
                    found.append(float(record["t"]))
    return found


def first_steps_of_our_attempts(container: str, lines: list[tuple[float, str]]) -> list[float]:
    """Every attempt's `first_step` time, from each attempt's events file on the master's container."""
    times = []
    jobs = dict.fromkeys(m[1] for _t, line in lines if (m := _JOB.search(line)))
    for job_id in jobs:
        with tempfile.TemporaryDirectory() as tmp:
            source = f"{container}:/run/gaudi-cluster/jobs/{job_id}/events.jsonl"
            subprocess.run(["docker", "cp", source, tmp], capture_output=True, check=False, timeout=30)
            path = Path(tmp) / "events.jsonl"
            if path.exists():
                lines_of_job = [(0.0, EVENT_PREFIX + text) for text in path.read_text().splitlines()]
                times += first_steps(lines_of_job)[:1]
    return times


def torchrun_env(cluster: LocalCluster) -> list[str]:
    """The variables the master gives every rank (the raw launcher's env file), as `docker exec -e`."""
    done = cluster.exec(cluster.master, "cat", "/tmp/raw.deepspeed_env")
    pairs = [line for line in done.stdout.splitlines() if "=" in line]
    return [word for pair in pairs for word in ("-e", pair)]


def start_ours(cluster: LocalCluster) -> list[Streamed]:
    argv = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0", "-e", f"DEEPSPEED_TIMEOUT={TIMEOUT_MINUTES}"]
    argv += [cluster.master, "gaudi-cluster", "master", "--min-nodes", "2", "--max-restarts", "1"]
    return [Streamed([*argv, *job("/workspace/output/elastic-ours")], container=cluster.master)]


def start_torchrun(cluster: LocalCluster, master_ip: str) -> list[Streamed]:
    env = [*torchrun_env(cluster), "-e", f"DEEPSPEED_TIMEOUT={TIMEOUT_MINUTES}"]
    agents = []
    for node in [cluster.master, cluster.worker(1), cluster.worker(2)]:
        argv = ["docker", "exec", *env, "-w", "/workspace", node, "torchrun", "--nnodes", "2:3"]
        argv += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench-elastic"]
        # Three restarts, not one: its first re-rendezvous may still count the killed node (its
        # keep-alive has not expired yet), and that restart then fails connecting to it.
        argv += ["--rdzv-endpoint", f"{master_ip}:{RDZV_PORT}", "--max-restarts", "3"]
        argv += ["--monitor-interval", "1"]
        agents.append(Streamed([*argv, *job("/workspace/output/elastic-torchrun")]))
    return agents


def scenario(ctx: Ctx, who: str) -> dict:
    cluster = new_cluster(ctx, f"elastic-{who}")
    procs: list[Streamed] = []
    try:
        bring_up_held(cluster)
        master_ip = prepare_raw_env(cluster)
        procs = start_ours(cluster) if who == "ours" else start_torchrun(cluster, master_ip)

        def steps() -> list[float]:
            if who == "ours":
                return first_steps_of_our_attempts(cluster.master, procs[0].lines)
            return sorted(t for proc in procs for t in first_steps(proc.lines))

        end = time.time() + 480
        while not steps() and time.time() < end:
            time.sleep(1.0)
        if not steps():
            raise RuntimeError(f"no first step:\n{procs[0].tail(40)}")
        time.sleep(12.0)  # a few steps and a checkpoint in
        t_fault = time.time()
        subprocess.run(["docker", "kill", cluster.worker(2)], check=True, capture_output=True, timeout=60)
        resumed: float | None = None
        while time.time() - t_fault < CAP and resumed is None:
            later = [t for t in steps() if t > t_fault]
            resumed = later[0] - t_fault if later else None
            if resumed is None and all(proc.t_exit is not None for proc in procs):
                break  # nothing will restart
            time.sleep(1.0)
        codes = [proc.proc.returncode for proc in procs]
        return {"resumed_s": resumed, "exit_codes": codes, "tails": [proc.tail(30) for proc in procs]}
    finally:
        for proc in procs:
            proc.stop()
        cluster.remove()


def run(ctx: Ctx) -> list[Row]:
    results, errors = interleaved(
        ctx,
        "elastic",
        ("ours", "torchrun"),
        lambda who: scenario(ctx, who),
        lambda result: f"fault → next attempt's first step {result['resumed_s']}",
    )
    figure = "Worker docker kill mid-run → first training step on the nodes left (ours vs torchrun elastic)"
    if not results["ours"]:
        return [failed_row("elastic.kill_to_next_step", figure, "; ".join(errors) or "no run")]

    def values(who: str) -> list[float]:
        return [CAP if r["resumed_s"] is None else r["resumed_s"] for r in results[who]]

    return [
        Row(
            "elastic.kill_to_next_step",
            figure,
            "s",
            stat(values("ours"), cap=CAP),
            stat(values("torchrun"), cap=CAP) if results["torchrun"] else None,
            "torchrun --nnodes 2:3, c10d rendezvous",
            Target("ratio", "<=", 1.0, "ratio ≤ 1.0"),
            note="; ".join(errors),
            details=results,
        )
    ]
