"""The local cluster as the benchmarks drive it (on top of gaudi_cluster_dev.localcluster.LocalCluster).

* a fresh cluster: `new_cluster(ctx, tag, workers)`; always `cluster.remove()` in a finally
* a held master (GAUDI_CLUSTER_HOLD=1): prepares the cluster, writes /run/gaudi-cluster/hostfile and
  stays up; jobs are then started inside it with `docker exec`, either by our master
  (`gaudi-cluster master JOB`) or by the raw DeepSpeed launcher over the same hostfile and keys.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gaudi_cluster_dev.localcluster import LocalCluster

from bench.common import NO_SAVE_NO_LOG, Ctx, Streamed, docker_logs_t, unique

APP_IN_IMAGE = "/opt/gaudi-cluster/app"
RUN_CLM = f"{APP_IN_IMAGE}/train/run_clm.py"
DS_CPU = f"{APP_IN_IMAGE}/train/configs/ds_cpu.json"
STABLE_HOSTFILE = "/run/gaudi-cluster/hostfile"
RAW_ENV_FILE = "/tmp/raw.deepspeed_env"
READY_LINE = "cluster ready"
# cmdline of every process of a job (runner, pdsh, ssh, remote shell, launch, rank agent, rank) contains
# the script name; the bracket keeps grep (and the shell running it) from matching itself.
JOB_PATTERN = "run_cl[m]"


def job_argv(output_dir: str, max_steps: int) -> list[str]:
    """The short default job (the bundled workload on its embedded data, DeepSpeed, CPU).

    Nothing is saved (no checkpoint, no final model, no plot): the benches time start-up and steps.
    """
    return [
        RUN_CLM,
        "--do_train",
        "--output_dir",
        output_dir,
        "--deepspeed",
        DS_CPU,
        "--max_steps",
        str(max_steps),
        *NO_SAVE_NO_LOG,
    ]


CREATED: list[LocalCluster] = []  # every cluster of this run, removed again at exit (see sweep)


def new_cluster(ctx: Ctx, tag: str, workers: int = 2) -> LocalCluster:
    cluster = LocalCluster(image=ctx.image, key_dir=ctx.key_dir, workers=workers, name=unique(tag))
    CREATED.append(cluster)
    return cluster


def sweep() -> None:
    """Remove whatever is left of this run's clusters (each is also removed where it was used)."""
    for cluster in CREATED:
        cluster.remove()


def rm_container(name: str) -> None:
    subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True, timeout=120)


def start_workers_parallel(cluster: LocalCluster, names: Sequence[str], parallel: int = 4) -> None:
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda n: cluster.start_workers([n]), names))


def start_held_master(
    cluster: LocalCluster, timeout: float = 180, extra_env: dict[str, str] | None = None
) -> list[tuple[float, str]]:
    """(Re)start the master with GAUDI_CLUSTER_HOLD=1 and wait for 'cluster ready'; its timestamped log."""
    rm_container(cluster.master)
    cluster.start_master(
        extra_env={"GAUDI_CLUSTER_HOLD": "1", "GAUDI_CLUSTER_DRY_RUN": "0", **(extra_env or {})}
    )
    end = time.time() + timeout
    while time.time() < end:
        lines = docker_logs_t(cluster.master)
        if any(READY_LINE in line for _t, line in lines):
            return lines
        if cluster.health(cluster.master) in ("exited", "dead", "missing"):
            break
        time.sleep(0.5)
    raise RuntimeError(f"held master not ready:\n{cluster.logs(cluster.master)[-3000:]}")


def bring_up_held(cluster: LocalCluster) -> None:
    """A fresh cluster's network and workers, then a held master that prepared them ('cluster ready')."""
    cluster.create_network()
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names, timeout_s=120)
    start_held_master(cluster)


def prepare_raw_env(cluster: LocalCluster) -> str:
    """What a user of the raw launcher prepares by hand: the env file the master generated (same values
    for both sides), copied; keys and hostfile are already in place. Returns the master's address."""
    done = cluster.exec(
        cluster.master,
        "sh",
        "-c",
        f'cp "$(ls -d /run/gaudi-cluster/jobs/*/ | head -n 1)deepspeed_env" {RAW_ENV_FILE}',
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot copy the env file: {done.stderr}")
    return cluster.ip_of(cluster.master)


def exec_ours(
    cluster: LocalCluster, job: Sequence[str], launcher: str | None = None, preimport: bool = True
) -> Streamed:
    """Our master, started afresh inside the held master's container: discovery, probes, launch, supervise
    (with its default launcher, or the one named; preimport False: every rank imports from cold)."""
    chosen = ["-e", f"GAUDI_CLUSTER_LAUNCHER={launcher}"] if launcher else []
    chosen += [] if preimport else ["-e", "GAUDI_CLUSTER_PREIMPORT=0"]
    argv = [
        "docker",
        "exec",
        "-e",
        "GAUDI_CLUSTER_HOLD=0",
        *chosen,
        cluster.master,
        "gaudi-cluster",
        "master",
    ]
    return Streamed([*argv, *job], container=cluster.master)


def end_zygotes(cluster: LocalCluster) -> None:
    """Every node as a fresh one is: no warm zygote left by an earlier job (rank/zygote)."""
    for name in [cluster.master, *cluster.worker_names]:
        cluster.exec(name, "pkill", "-KILL", "-f", "gaudi_cluster.rank.zygote")


def end_raw(cluster: LocalCluster, job: Sequence[str]) -> None:
    """What a hung raw launch left on the nodes (its ranks wait in a collective): killed by its own
    output directory, which names that launch only."""
    output = job[job.index("--output_dir") + 1]
    for name in [cluster.master, *cluster.worker_names]:
        cluster.exec(name, "pkill", "-KILL", "-f", "--", f"--output_dir {output}")


def exec_raw(cluster: LocalCluster, master_ip: str, job: Sequence[str]) -> Streamed:
    """The raw DeepSpeed launcher over pdsh/ssh, with the hostfile, keys and env file already in place."""
    return Streamed(
        [
            "docker",
            "exec",
            "-e",
            f"DS_ENV_FILE={RAW_ENV_FILE}",
            "-w",
            "/workspace",
            cluster.master,
            "deepspeed",
            "--hostfile",
            STABLE_HOSTFILE,
            "--master_addr",
            master_ip,
            "--master_port",
            "29500",
            "--ssh_port",
            "3022",
            "--no_local_rank",
            *job,
        ]
    )


def job_processes(cluster: LocalCluster, node: str) -> int | None:
    """How many processes of a job run on `node` (None when the node cannot be asked)."""
    try:
        done = subprocess.run(
            ["docker", "exec", node, "sh", "-c", f"grep -l '{JOB_PATTERN}' /proc/[0-9]*/cmdline 2>/dev/null"],
            check=False,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode not in (0, 1):
        return None
    return len([line for line in done.stdout.splitlines() if line.strip()])
