"""4. Scale of bring-up: discovery + sshd readiness + probes for 4, 8, 16 and 32 simulated nodes, and the
rendering of hostfile/env file/launch plan for 1,000 synthetic peers (in-process).

Light nodes: the same image running only the worker role (sshd). The workers are added incrementally on
one network (alias `worker`) and are healthy before the master starts; the master runs held
(GAUDI_CLUSTER_HOLD=1, nothing is launched) and its log timestamps give the phases:
the entrypoint's hand-over to `gaudi-cluster master` → `nodes: … (found in Xs)` (discovery, the
logged X) → `cluster ready` (sshd wait, probes over ssh in parallel, preflight, files written).
The total (hand-over → ready) includes the control plane's python start.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path

from gaudi_cluster_dev.localcluster import LocalCluster

from bench.common import Ctx, Row, Target, failed_row, first_line, log, stat
from bench.nodes import READY_LINE, new_cluster, start_held_master, start_workers_parallel

# BENCH_SCALE_SIZES=2,4 for a quick try; the first size is the baseline of the ratios
SIZES = tuple(int(x) for x in os.environ.get("BENCH_SCALE_SIZES", "4,8,16,32").split(",") if x.strip())
FLAT_RATIO = 1.5  # "nearly flat": bring-up at 32 nodes at most 1.5x that at 4 nodes


def measure_bringup(ctx: Ctx, sizes: tuple[int, ...], reps: int) -> tuple[dict[int, list[dict]], list[str]]:
    cluster = new_cluster(ctx, "scale", workers=0)
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    problems: list[str] = []
    last = 0.0
    try:
        cluster.create_network()
        have = 0
        for n in sizes:
            if last and not ctx.can_start(last * n / max(have, 1)):
                problems.append(f"time budget: {n} workers not measured")
                continue
            t = time.time()
            start_workers_parallel(cluster, [cluster.worker(i) for i in range(have + 1, n + 1)])
            cluster.workers = n
            have = n
            cluster.wait_healthy(cluster.worker_names, timeout_s=180)
            log(f"scale: {n} workers up and healthy ({time.time() - t:.1f}s for the new ones)")
            for _ in range(reps):
                try:
                    lines = start_held_master(cluster, timeout=240)
                except RuntimeError as exc:
                    problems.append(f"{n} workers: {str(exc)[:600]}")
                    break
                # the held master logs no configuration line: start = the entrypoint handing over
                begin = first_line(lines, "starting gaudi-cluster master")
                nodes = first_line(lines, "gaudi-cluster: nodes:")
                ready = first_line(lines, READY_LINE)
                found = next((x for _t, x in lines if "gaudi-cluster: nodes:" in x), "")
                m = re.search(r"found in ([0-9.]+)s", found)
                if begin is None or nodes is None or ready is None or m is None:
                    raise RuntimeError("master log lines missing:\n" + "\n".join(x for _t, x in lines[-20:]))
                run = {
                    "discovery": float(m.group(1)),
                    "readiness_probes": ready - nodes,
                    "total": ready - begin,
                }
                cpu = master_cpu_seconds(cluster)
                if cpu is not None:
                    run["master_cpu"] = cpu
                runs[n].append(run)
                log(f"scale: {n + 1} nodes: prepare {run['total']:.2f}s (discovery {run['discovery']:.2f}s)")
            last = time.time() - t
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {str(exc)[:600]}")
    finally:
        cluster.remove()
    return runs, problems


def master_cpu_seconds(cluster: LocalCluster) -> float | None:
    """CPU seconds the held master process and its finished children (ssh clients) have used: the part
    of the bring-up that stays on the master when every node has its own CPUs."""
    done = cluster.exec(
        cluster.master, "sh", "-c", 'c=$(cat /proc/1/task/1/children); cat "/proc/${c%% *}/stat"'
    )
    if done.returncode != 0:
        return None
    fields = done.stdout.rsplit(")", 1)[-1].split()
    try:  # after the command name: state is field 3, utime..cstime are fields 14-17
        ticks = sum(int(x) for x in fields[11:15])
    except (ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def plot(runs: dict[int, list[dict]], out_png: Path) -> Path | None:
    sizes = [n for n in sorted(runs) if runs[n]]
    if not sizes:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (
        ("total", "prepare total"),
        ("discovery", "discovery"),
        ("readiness_probes", "sshd readiness + probes"),
        ("master_cpu", "master-side CPU seconds"),
    ):
        if not all(key in r for n in sizes for r in runs[n]):
            continue
        med = [statistics.median(r[key] for r in runs[n]) for n in sizes]
        lo = [min(r[key] for r in runs[n]) for n in sizes]
        hi = [max(r[key] for r in runs[n]) for n in sizes]
        ax.errorbar(
            [n + 1 for n in sizes],
            med,
            yerr=[
                [m - a for m, a in zip(med, lo, strict=True)],
                [b - m for m, b in zip(med, hi, strict=True)],
            ],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks([n + 1 for n in sizes], [str(n + 1) for n in sizes])
    ax.set_xlabel("nodes (master + workers)")
    ax.set_ylabel("seconds (median, min-max)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("gaudi-cluster bring-up vs cluster size (2 shared CPU cores)")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


def run(ctx: Ctx, results_dir: Path) -> list[Row]:
    reps = ctx.reps(2)
    runs, problems = measure_bringup(ctx, SIZES, reps)
    base = runs[SIZES[0]]
    if not base:
        why = "; ".join(problems) or "no run"
        return [failed_row("scale.bringup", "Bring-up (discovery + readiness + probes) vs nodes", why)]
    png = plot(runs, results_dir / "scale.png")
    out: list[Row] = []
    for n in SIZES:
        if not runs[n]:
            why = (
                "; ".join(p for p in problems if p.startswith((f"{n} ", "time")))
                or "; ".join(problems)
                or "no run"
            )
            out.append(failed_row(f"scale.{n}", f"Bring-up, {n} workers + master", why))
            continue
        target = (
            Target("ratio", "<=", FLAT_RATIO, f"ratio ≤ {FLAT_RATIO:g} (flat)") if n == SIZES[-1] else None
        )
        out.append(
            Row(
                f"scale.{n}",
                f"Bring-up (discovery + readiness + probes), {n} workers + master",
                "s",
                stat([r["total"] for r in runs[n]]),
                stat([r["total"] for r in base]),
                f"same, {SIZES[0]} workers",
                target,
                note=f"discovery {statistics.median(r['discovery'] for r in runs[n]):.2f}s, "
                f"readiness+probes {statistics.median(r['readiness_probes'] for r in runs[n]):.2f}s"
                + (f"; plot {png.name}" if png and n == SIZES[-1] else ""),
                details={"runs": runs[n]},
            )
        )
    cpu_sizes = [n for n in SIZES if runs[n] and all("master_cpu" in r for r in runs[n])]
    if SIZES[0] in cpu_sizes:
        for n in cpu_sizes[1:]:
            out.append(
                Row(
                    f"scale.cpu.{n}",
                    f"  master-side CPU for that bring-up, {n} workers (vs {SIZES[0]})",
                    "s",
                    stat([r["master_cpu"] for r in runs[n]]),
                    stat([r["master_cpu"] for r in base]),
                    f"{SIZES[0]} workers",
                    note="user+sys of the master process and its ssh clients: what stays on the master when "
                    "every node has its own CPUs (here all nodes share 2 cores, so the wall time above grows)"
                    if n == cpu_sizes[-1]
                    else "",
                )
            )
    return out


# ---------------------------------------------------------------- 1,000 synthetic peers, in-process


def render_once(n: int) -> float:
    from gaudi_cluster.env import envfile, jobenv
    from gaudi_cluster.launch import launchers, plan
    from gaudi_cluster.nodes.hostfile import HostEntry, make_hostfile, render_hostfile

    environ = {**os.environ, "DS_ACCELERATOR": "cpu", "PATH": "/opt/venv/bin:/usr/bin:/bin"}
    t = time.perf_counter()
    entries = [HostEntry(f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}", 8) for i in range(1, n + 1)]
    hostfile = make_hostfile(entries, master=entries[0].host)
    text = render_hostfile(hostfile)
    env = jobenv.build_env_file(environ, "cpu", {"DEEPSPEED_TIMEOUT": "5"}, "eth0")
    env_text = envfile.render_env_file(env)
    launch = launchers.deepspeed_plan(
        hostfile_path="/run/gaudi-cluster/jobs/j/hostfile",
        master_addr=entries[0].host,
        master_port=29500,
        ssh_port=3022,
        env_file_path="/run/gaudi-cluster/jobs/j/deepspeed_env",
        program=["/opt/venv/bin/python", "-u", "/opt/gaudi-cluster/app/train/run_clm.py", "--do_train"],
        python="/opt/venv/bin/python",
        ssh_config_path="/run/gaudi-cluster/jobs/j/ssh_config",
        agent=plan.AgentSettings("j", "/run/gaudi-cluster/jobs", 10.0, f"{entries[0].host}:29400"),
    )
    shell = plan.render_shell(launch)
    elapsed = time.perf_counter() - t
    assert text.count("\n") == n and env_text and shell
    return elapsed


def run_render(ctx: Ctx) -> list[Row]:
    rounds = 30 if not ctx.quick else 5
    render_once(1000)  # warm imports
    big: list[float] = []
    small: list[float] = []
    for _ in range(rounds):  # interleaved
        big.append(render_once(1000) * 1000)
        small.append(render_once(4) * 1000)
    return [
        Row(
            "render.1000",
            "Render hostfile + env file + plan, 1,000 peers (in-process)",
            "ms",
            stat(big),
            stat(small),
            "same, 4 peers",
            Target("ours", "<=", 100.0, "≤ 100 ms"),
            note="target is ours (the issue sets none)",
        )
    ]
