"""The fabric check on 3 healthy containers: its wall time (`gaudi-cluster doctor --fabric` from a held
master), and its 8 MB world bus bandwidth beside a plain torch.distributed all-reduce timing loop run by
hand on the same containers (`docker exec` of a few lines of Python on each, gloo, same size and count).
The two bandwidths must agree within 10 %.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from gaudi_cluster_dev.localcluster import LocalCluster

from bench.common import Ctx, Row, Target, failed_row, log, stat
from bench.nodes import bring_up_held, new_cluster

SIZE, ITERS = 8 << 20, 5  # the check's largest size and its iteration count
PLAIN = f"""
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for size in (4096, 1 << 20, {SIZE}):  # the check's sizes in its order: the same warm connections
    x = torch.ones(size // 4)
    dist.all_reduce(x)
    t = time.perf_counter()
    for _ in range({ITERS}):
        dist.all_reduce(x)
    s = (time.perf_counter() - t) / {ITERS}
n = dist.get_world_size()
print("BUSBW", {SIZE} / s * 2 * (n - 1) / n, flush=True)
dist.destroy_process_group()  # gloo's threads joined: no abort at exit
"""


def plain_loop(cluster: LocalCluster, nodes: list[str], master_ip: str) -> float:
    """The slowest rank's bus bandwidth (bytes/s), as the check reports per node."""

    def one(rank: int) -> float:
        env = {"RANK": rank, "WORLD_SIZE": len(nodes), "MASTER_ADDR": master_ip, "MASTER_PORT": 29511}
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # what the check's env file gives its ranks here
        flags = [f for k, v in env.items() for f in ("-e", f"{k}={v}")]
        argv = ["docker", "exec", *flags, nodes[rank], "/opt/venv/bin/python", "-c", PLAIN]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"plain loop, rank {rank}: {done.stderr.strip()[-300:]}")
        return float(done.stdout.split("BUSBW")[-1])

    with ThreadPoolExecutor(len(nodes)) as pool:
        return min(pool.map(one, range(len(nodes))))


def run(ctx: Ctx) -> list[Row]:
    try:
        cluster = new_cluster(ctx, "fabric", workers=2)
        bring_up_held(cluster)
        nodes = [cluster.master, *cluster.worker_names]
        master_ip = cluster.ip_of(cluster.master)
        walls, ours, theirs = [], [], []
        for rep in range(ctx.reps(3)):
            started = time.monotonic()
            argv = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0", cluster.master]
            argv += ["gaudi-cluster", "doctor", "--fabric", "--json"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            walls.append(time.monotonic() - started)
            result = json.loads(done.stdout)["fabric"]
            ours.append(min(n["busbw"] for n in result["nodes"]))
            theirs.append(plain_loop(cluster, nodes, master_ip))
            log(
                f"fabric rep {rep}: {walls[-1]:.1f} s, "
                f"ours {ours[-1] / 1e6:.0f} MB/s, plain {theirs[-1] / 1e6:.0f} MB/s"
            )
    except Exception as exc:
        return [failed_row("fabric.check", "fabric check on 3 containers", str(exc)[:300])]
    finally:
        if "cluster" in locals():
            cluster.remove()
    ratio = statistics.median(ours) / statistics.median(theirs)
    return [
        Row("fabric.wall", "doctor --fabric wall time, 3 healthy containers", "s", stat(walls)),
        Row(
            "fabric.busbw",
            "fabric check 8 MB bus bandwidth vs a plain torch.distributed loop",
            "MB/s",
            stat([o / 1e6 for o in ours]),
            theirs=stat([t / 1e6 for t in theirs]),
            theirs_label="plain all_reduce loop",
            note=f"ratio {ratio:.2f} (within 10 %: {0.9 <= ratio <= 1.1}); gloo, {ITERS} iterations",
        ),
        Row(
            "fabric.agreement",
            "  |check / plain loop - 1| of the medians",
            "%",
            stat([abs(ratio - 1) * 100]),
            target=Target("ours", "<=", 10.0, "≤ 10 %"),
        ),
    ]
