"""Real clusters of containers: a master and workers that train for real through DeepSpeed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from gaudi_cluster_dev.localcluster import WORKER_ALIAS, LocalCluster, node_keys

from tests.support.mounts import user_mounts

if TYPE_CHECKING:
    from tests.cluster.conftest import HeldCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RANK_LINE = re.compile(r"^\[(?P<host>[\w.-]+) rank (?P<rank>\d+)\] ", re.MULTILINE)


def rank_hosts(log: str) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for match in RANK_LINE.finditer(log):
        seen.setdefault(int(match["rank"]), set()).add(match["host"])
    return seen


def copy_from(container: str, path: str, dest) -> str:
    subprocess.run(["docker", "cp", f"{container}:{path}", str(dest)], check=True, capture_output=True)
    return dest.read_text()


METRICS_PORT = 9400
SCRAPE = (
    "import urllib.request, sys; "
    f"url = 'http://127.0.0.1:{METRICS_PORT}/metrics'; "
    "sys.stdout.write(urllib.request.urlopen(url, timeout=3).read().decode())"
)


def scrape_while_running(cluster, until: threading.Event) -> list[str]:
    """The master's /metrics, read from inside its container (the port is bound to its localhost)."""
    seen: list[str] = []
    while not until.is_set():
        done = cluster.exec(cluster.master, "python", "-c", SCRAPE, timeout=20)
        if done.returncode == 0:
            seen.append(done.stdout)
        until.wait(1.0)
    return seen


APP = "/opt/gaudi-cluster/app/train"


def short_job(max_steps: int, save_steps: int) -> list[str]:
    """The bundled workload cut to what a test needs: the default job's 40 steps of 256-token blocks become
    `max_steps` of 64-token ones (a step costs about a quarter), with a loss every step."""
    return [
        f"{APP}/run_clm.py", "--do_train", "--output_dir", "/workspace/output", "--deepspeed",
        f"{APP}/configs/ds_cpu.json", "--max_steps", str(max_steps), "--save_steps", str(save_steps),
        "--logging_steps", "1", "--per_device_train_batch_size", "4", "--learning_rate", "2e-3",
        "--warmup_steps", "0", "--seed", "7", "--block_size", "64", "--no_plot",
    ]  # fmt: skip


def sample(text: str, name: str, **labels: str) -> float | None:
    wanted = "".join(f'{key}="{value}"' for key, value in labels.items())
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if (
            head.split("{")[0] == name
            and all(f'{k}="{v}"' in head for k, v in labels.items())
            and (wanted or "{" not in head)
        ):
            return float(value)
    return None


def test_default_job_trains_across_three_containers(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    cluster.start_master(extra_env={"GAUDI_CLUSTER_METRICS_PORT": str(METRICS_PORT)})
    master_ip = cluster.ip_of(cluster.master)  # read while it runs: a stopped container has none
    stop, scrapes = threading.Event(), []
    scraper = threading.Thread(target=lambda: scrapes.extend(scrape_while_running(cluster, stop)))
    scraper.start()
    try:
        code = cluster.wait_master(timeout_s=900)
    finally:
        stop.set()
        scraper.join()
    log = cluster.logs(cluster.master)
    assert code == 0, log[-4000:]

    # World size is the sum of slots, and each rank ran in its own container (the report names them).
    report = json.loads((cluster.output_dir / "job_report.json").read_text())
    assert {r["rank"]: r["hostname"] for r in report["ranks"]} == {0: "master", 1: "worker-1", 2: "worker-2"}
    assert rank_hosts(log) == {0: {"master"}}  # the console shows rank 0's lines only

    # Every rank's lines are in its file in the master's job directory, named at the end.
    job = re.search(r"job (\S+): 3 ranks on 3 nodes", log)[1]
    named = f"every rank's output: /run/gaudi-cluster/jobs/{job}/ranks/rank-<N>.log"
    assert named in log and report["rank_logs"] == named.split(": ", 1)[1]
    subprocess.run(["docker", "cp", f"{cluster.master}:/run/gaudi-cluster/jobs/{job}/ranks", str(tmp_path)],
                   check=True, capture_output=True)  # fmt: skip
    ranks = {r: (tmp_path / "ranks" / f"rank-{r}.log").read_text().splitlines() for r in range(3)}
    losses = {r: [line for line in lines if line.startswith("{'loss'")] for r, lines in ranks.items()}
    assert all(len(found) >= 2 for found in losses.values()), losses
    assert any("Writing model shards" in line for line in ranks[0])

    # The console: one line per event, the same information (rank 0's log lines), none of the noise.
    console = log.splitlines()
    assert sum(line.startswith("[master rank 0] {'loss'") for line in console) == len(losses[0])
    assert "[master rank 0]   train_loss" in log and "fontManager" not in log
    assert not any("%|" in line or line.rstrip() == "[master rank 0]" for line in console), log
    assert len(console) <= 45, f"{len(console)} console lines (66 before one line per event):\n{log}"

    # Prometheus metrics, scraped during the job: the step moved, every rank has its figures.
    steps = [s for text in scrapes if (s := sample(text, "gaudi_cluster_step")) is not None]
    assert len(set(steps)) >= 2 and steps == sorted(steps), (steps, scrapes[-1:])
    # A scrape while every rank was connected (a rank that has exited leaves the per-rank series).
    # The latest such scrape: the cluster's samples/s needs two distinct steps seen by the master, and
    # its nodes' summaries come every 2 s.
    last = max(reversed(scrapes), key=lambda text: text.count("gaudi_cluster_rank_work_seconds{"))
    for rank, host in ((0, "master"), (1, "worker-1"), (2, "worker-2")):
        assert sample(last, "gaudi_cluster_rank_work_seconds", host=host, rank=str(rank)) is not None, last
        assert sample(last, "gaudi_cluster_rank_heartbeat_age_seconds", host=host, rank=str(rank)) < 10
    assert sample(last, "gaudi_cluster_restarts_total") == 0
    assert sample(last, "gaudi_cluster_samples_per_second") > 0

    # The generated hostfile lists the three containers' addresses with their slots, master first.
    hostfile = copy_from(cluster.master, "/run/gaudi-cluster/hostfile", tmp_path / "hostfile")
    expected_ips = [
        master_ip,
        *sorted(
            (cluster.ip_of(name) for name in cluster.worker_names),
            key=lambda ip: tuple(map(int, ip.split("."))),
        ),
    ]
    assert hostfile.splitlines() == [f"{ip} slots=1" for ip in expected_ips]

    # The three containers share this machine's CPUs: every rank got its share of threads, not all.
    cpus = len(os.sched_getaffinity(0))
    assert f"OMP_NUM_THREADS={max(1, cpus // 3)} for every rank: 3 ranks share {cpus} CPUs" in log

    # Training really happened: loss went down; results, plot and a checkpoint are on the master's volume.
    output = cluster.output_dir
    results = json.loads((output / "all_results.json").read_text())
    assert results["train_samples_per_second"] > 0
    state = json.loads(next(output.glob("checkpoint-*/trainer_state.json")).read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    assert list(output.glob("*.png")), sorted(p.name for p in output.iterdir())
    assert list(output.glob("checkpoint-*"))

    # What the operator sees: progress lines, no machinery on the console, a report, no straggler.
    # The suite runs a training beside this job on the same two cores, so a healthy rank can really
    # take 1.3x its peers for a few steps (seen once: rank 0 at 1.32x); a straggler of that size is
    # scheduling noise here, one of 1.6x or more (the drill's slow rank is 2x and more) is a defect.
    assert "gaudi-cluster-event" not in log
    assert re.search(r"gaudi-cluster: step \d+/40", log), log[-3000:]
    stragglers = [float(x) for x in re.findall(r"straggler: host \S+ rank \d+ .* takes ([\d.]+)x", log)]
    assert all(ratio < 1.6 for ratio in stragglers), log
    events = [json.loads(line)["event"] for line in (output / "events.jsonl").read_text().splitlines()]
    assert events[:2] == ["start", "imports_done"] and "first_step" in events and "train_done" in events
    assert report["state"] == "succeeded" and len(report["nodes"]) == 3
    assert len(report["stragglers"]) == len(stragglers), report["stragglers"]
    assert report["phases_s"]["container_start_to_first_step"] > 0
    assert (output / "job_report.png").read_bytes()[:4] == b"\x89PNG"


def _allreduce_results(shared, world: int) -> list[dict]:
    files = sorted(shared.glob("rank-*.json"))
    assert [f.name for f in files] == [f"rank-{r}.json" for r in range(world)]
    return [json.loads(f.read_text()) for f in files]


@dataclass
class Pair:
    """Two workers and a master of two slots each, held for the module, and the folder their ranks share."""

    cluster: HeldCluster
    shared: Path

    def run(self, *argv: str, env: dict[str, str] | None = None, fresh: str = "rank-*.json") -> str:
        """One job (or command) in the master's container, after the previous run's `fresh` files are gone;
        its output, once it exited 0."""
        for old in self.shared.glob(fresh):
            old.unlink()
        done = self.cluster.in_master(*argv, env=env, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        return output


@pytest.fixture(scope="module")
def pair(hold, tmp_path_factory) -> Pair:
    """The cases that need nothing fresh (they kill, cut and fill nothing) run one after another here."""
    shared = tmp_path_factory.mktemp("shared")
    return Pair(hold(workers=2, slots=2, run_args=user_mounts(shared)), shared)


def test_user_script_runs_through_the_same_master_path(pair):
    pair.run("gaudi-cluster", "master", "/workspace/user/allreduce.py", "--note", "two words")
    results = _allreduce_results(pair.shared, world=6)
    world = 6
    assert all(r["sum"] == world * (world + 1) / 2 for r in results)
    assert all(r["argv"] == ["--note", "two words"] for r in results)
    by_host: dict[str, list[int]] = {}
    for r in results:
        by_host.setdefault(r["host"], []).append(r["rank"])
    assert by_host == {"master": [0, 1], "worker-1": [2, 3], "worker-2": [4, 5]}


def test_seed_command_shape_gaudi_spawn_inside_the_master(pair):
    """The seed's own shape: the master only prepares (hold), then gaudi_spawn.py runs on its hostfile."""
    pair.run(
        "gaudi_spawn.py",
        "--hostfile",
        "/run/gaudi-cluster/hostfile",
        "--use_deepspeed",
        "/workspace/user/allreduce.py",
        "--deepspeed",
        "/opt/gaudi-cluster/app/train/configs/ds_cpu.json",
    )
    results = _allreduce_results(pair.shared, world=6)
    assert {r["host"] for r in results} == {"master", "worker-1", "worker-2"}
    assert all(
        r["argv"] == ["--deepspeed", "/opt/gaudi-cluster/app/train/configs/ds_cpu.json"] for r in results
    )


def test_raw_deepspeed_by_hand_on_the_held_masters_hostfile(pair):
    """What the held master's "cluster ready" promises beyond gaudi_spawn.py: the user's own
    `deepspeed --hostfile` (its ssh check, then pdsh) reaches every node with no flag of ours, its ssh
    reading the master's settings for these nodes (port, key, the CA and the certificates' name)."""
    ready = pair.cluster.logs(pair.cluster.master)
    said = "gaudi-cluster: your ssh reads /run/gaudi-cluster/ssh_config for these nodes"
    assert said in ready, ready[-2000:]
    env = 'cp "$(ls -d /run/gaudi-cluster/jobs/*/ | head -n 1)deepspeed_env" /tmp/raw_env'
    raw = "deepspeed --hostfile /run/gaudi-cluster/hostfile --ssh_port 3022 --no_local_rank"
    pair.run("sh", "-c", f"{env} && DS_ENV_FILE=/tmp/raw_env {raw} /workspace/user/allreduce.py raw")
    results = _allreduce_results(pair.shared, world=6)
    assert {r["host"] for r in results} == {"master", "worker-1", "worker-2"}
    assert all(r["sum"] == 21 and r["argv"] == ["raw"] for r in results)


@pytest.fixture(scope="module")
def one_worker(image, cluster_keys, tmp_path_factory) -> Iterator[LocalCluster]:
    """One worker for the bad-input cases, started once: each case runs its own master against it, which
    fails before it launches or stages anything there, so no case leaves the next one anything."""
    cluster = LocalCluster(
        image=image, key_dir=cluster_keys, workers=1, output_dir=tmp_path_factory.mktemp("o")
    )
    try:
        cluster.create_network()
        cluster.start_workers()
        cluster.wait_healthy(cluster.worker_names)
        yield cluster
    finally:
        cluster.remove()


@pytest.mark.parametrize(
    ("case", "master_env", "expect_code", "expect_text"),
    [
        (
            "peer never answers",
            {
                "GAUDI_CLUSTER_PEERS_DNS": "",
                "GAUDI_CLUSTER_PEERS": "worker-1,ghost-node",
                "GAUDI_CLUSTER_NODES": "3",
                "GAUDI_CLUSTER_WAIT_TIMEOUT": "8",
            },
            3,
            "ghost-node",
        ),
        (
            "wrong ssh port",
            {"GAUDI_CLUSTER_SSH_PORT": "2222", "GAUDI_CLUSTER_WAIT_TIMEOUT": "8"},
            3,
            "port 2222",
        ),
        (
            "peers resolve to nothing",
            {"GAUDI_CLUSTER_PEERS_DNS": "nobody-here", "GAUDI_CLUSTER_WAIT_TIMEOUT": "6"},
            3,
            "nobody-here",
        ),
        ("bad setting", {"GAUDI_CLUSTER_MASTER_PORT": "99999"}, 2, "GAUDI_CLUSTER_MASTER_PORT"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_master_bad_input_fails_clearly_and_launches_nothing(
    one_worker, case, master_env, expect_code, expect_text
):
    cluster = one_worker
    docker_rm_master(cluster)  # the previous case's
    assert cluster.passes_health_check(cluster.worker(1)), cluster.logs(cluster.worker(1))[-3000:]
    cluster.start_master(extra_env=master_env)
    code = cluster.wait_master(timeout_s=120)
    log = cluster.logs(cluster.master)
    assert code == expect_code, log
    errors = [line for line in log.splitlines() if line.startswith("gaudi-cluster: error:")]
    assert len(errors) == 1 and expect_text in errors[0], log
    assert "fix:" in errors[0]
    assert not RANK_LINE.search(log), "a rank was launched on an invalid configuration"


def docker_rm_master(cluster) -> None:
    subprocess.run(["docker", "rm", "-f", cluster.master], check=False, capture_output=True, timeout=120)


def test_worker_without_keys_and_unknown_role_exit_clearly(image):
    no_keys = subprocess.run(
        ["docker", "run", "--rm", image, "worker"], capture_output=True, text=True, timeout=60, check=False
    )
    assert no_keys.returncode != 0
    assert "fix:" in no_keys.stderr and "key" in no_keys.stderr
    unknown = subprocess.run(
        ["docker", "run", "--rm", "-e", "GAUDI_CLUSTER_ROLE=leader", image],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unknown.returncode == 2
    assert "leader" in unknown.stderr


def test_direct_and_deepspeed_launchers_give_every_rank_the_same_world(pair):
    """The same user script under both launchers on the same cluster: DeepSpeed's launch.py and ours
    must be indistinguishable to it (distributed environment, host placement, argv, cwd, results)."""
    seen = {}
    for launcher in ("deepspeed", "direct"):
        job = ("gaudi-cluster", "master", "/workspace/user/allreduce.py", "--note", "two words")
        pair.run(*job, env={"GAUDI_CLUSTER_LAUNCHER": launcher})
        seen[launcher] = _allreduce_results(pair.shared, world=6)
    assert seen["direct"] == seen["deepspeed"]
    assert {r["env"]["LOCAL_SIZE"] for r in seen["direct"]} == {"2"}
    assert [r["env"]["CROSS_RANK"] for r in seen["direct"]] == ["0", "0", "1", "1", "2", "2"]


def test_a_slow_rank_is_named_with_its_host_and_device(make_cluster):
    cluster = make_cluster(workers=2)
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    slow = "GAUDI_CLUSTER_SLOW_RANK=2;GAUDI_CLUSTER_SLOW_MS=700"
    # 16 steps, rank 2 0.7 s slower in each: far above the 1.3x threshold (the others' work is about
    # 0.06 s a step). The check counts the new steps each summary of its node carries (one every 2 s
    # here), so the 3 warm-up steps, then 5 slow ones, with room to spare (the default job's 40 took a
    # minute longer).
    env = {"GAUDI_CLUSTER_ENV": slow, "GAUDI_CLUSTER_STATUS_INTERVAL": "5"}
    cluster.start_master(short_job(16, save_steps=16), extra_env=env)
    assert cluster.wait_master(timeout_s=600) == 0, cluster.logs(cluster.master)[-4000:]
    log = cluster.logs(cluster.master)
    named = [line for line in log.splitlines() if "straggler: host" in line]
    assert named and all("host worker-2 rank 2 (device 0)" in line for line in named), named
    assert any(
        line.startswith("gaudi-cluster: step ") and "slowest: rank 2" in line for line in log.splitlines()
    )
    report = json.loads((cluster.output_dir / "job_report.json").read_text())
    assert [line.split(" takes")[0] for line in report["stragglers"]] == [
        "straggler: host worker-2 rank 2 (device 0)"
    ]


def test_a_full_disk_on_one_worker_is_named_with_its_cause(make_cluster):
    cluster = make_cluster(workers=2, worker_args={2: ["--tmpfs", "/workspace/output:size=4m"]})
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    cluster.start_master(short_job(4, save_steps=2))  # the first save (about 15 MB a rank) fills 4 MB
    assert cluster.wait_master(timeout_s=600) == 1, cluster.logs(cluster.master)[-4000:]
    log = cluster.logs(cluster.master)
    summary = [line for line in log.splitlines() if re.match(r"gaudi-cluster: job \S+ failed:", line)]
    assert len(summary) == 1 and "host worker-2" in summary[0], summary
    assert "No space left on device" in summary[0] and "fix:" in summary[0], summary[0]
    # The preflight warned before launch (a warning: the job may write less than the threshold).
    warned = [line for line in log.splitlines() if "disk" in line and "below --min-free-disk 64 MiB" in line]
    assert len(warned) == 1, log[:3000]


def _worker_hops(cluster, worker_ips: dict[str, str]) -> list[tuple[str, str]]:
    """(worker, worker that logged in to it): what only a tree spawn through a worker does."""
    return [
        (name, other)
        for name in cluster.worker_names
        for other, ip in worker_ips.items()
        if other != name and f"Accepted publickey for root from {ip} " in cluster.logs(name)
    ]


def _trained(cluster) -> None:
    report = json.loads((cluster.output_dir / "job_report.json").read_text())
    assert {r["rank"]: r["hostname"] for r in report["ranks"]} == {0: "master", 1: "worker-1", 2: "worker-2"}
    assert report["state"] == "succeeded"
    state = json.loads(next(cluster.output_dir.glob("checkpoint-*/trainer_state.json")).read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses


def test_mpirun_with_tree_spawn_trains_across_three_containers(make_cluster, cluster_keys, tmp_path):
    """mpirun's ssh arguments name the job's ssh config. By default mpirun starts every daemon itself
    (workers hold no client key); asked for tree spawn, a worker's daemon starts the next worker's over
    ssh with the same arguments, so the config is staged on every node. Radix 1 makes the tree a chain:
    master -> first worker -> second worker."""
    # Every node holds the client key (a worker's daemon logs in to the next worker), each node its own
    # host key: the master make keys' master/, each worker its nodes/<name>/ plus the client key.
    keys = tmp_path / "keys-everywhere"
    cluster = make_cluster(workers=2)
    shutil.copytree(cluster_keys / "master", keys / "master")
    for name in cluster.worker_names:
        shutil.copytree(node_keys(cluster_keys, name, WORKER_ALIAS), keys / "nodes" / name)
        shutil.copy2(cluster_keys / "master" / "id_ed25519", keys / "nodes" / name)
    cluster.key_dir = keys
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    worker_ips = {name: cluster.ip_of(name) for name in cluster.worker_names}
    chain = {"GAUDI_CLUSTER_LAUNCHER": "mpirun", "OMPI_MCA_routed_radix": "1"}
    trains = short_job(6, save_steps=6)  # a loss every step, a checkpoint at the end

    cluster.start_master(trains, extra_env=chain)
    code = cluster.wait_master(timeout_s=900)
    log = cluster.logs(cluster.master)
    assert code == 0, log[-4000:]
    assert "--mca plm_rsh_no_tree_spawn 1" in log and _worker_hops(cluster, worker_ips) == []
    _trained(cluster)
    subprocess.run(["docker", "rm", "-f", cluster.master], check=True, capture_output=True)
    cluster.output_dir = tmp_path / "output-tree"  # a fresh run, not a resume of the first one

    # Open MPI reads MCA parameters from OMPI_MCA_*; set in the master's environment, its choice rules.
    cluster.start_master(trains, extra_env={**chain, "OMPI_MCA_plm_rsh_no_tree_spawn": "0"})
    code = cluster.wait_master(timeout_s=900)
    log = cluster.logs(cluster.master)
    assert code == 0, log[-4000:]
    assert "plm_rsh_no_tree_spawn" not in log.split("launching: ", 1)[1].split("\n", 1)[0]
    assert len(_worker_hops(cluster, worker_ips)) == 1, {
        n: cluster.logs(n)[-2000:] for n in cluster.worker_names
    }
    _trained(cluster)


def test_a_rank_forked_by_the_zygote_sees_what_a_plain_start_gives(pair):
    """Rank by rank, the preimport on (the default) and off: the same environment, argv, cwd, sys.path
    and __main__; on, every rank's parent is its node's zygote, off none is."""
    seen = {}
    for preimport in ("1", "0"):
        log = pair.run(
            "gaudi-cluster",
            "master",
            "/workspace/user/rankview.py",
            "--note",
            "two words",
            env={"GAUDI_CLUSTER_PREIMPORT": preimport},
            fresh="view-*.json",
        )
        assert ("preimport: plain start" in log) is False, log[-4000:]
        assert ("[master rank 0] gaudi-cluster[rank]: preimport: forked" in log) is (preimport == "1")
        files = sorted(pair.shared.glob("view-*.json"))
        assert [f.name for f in files] == [f"view-{r}.json" for r in range(6)]
        # The job's id (new each run) is in a few paths, the ssh session's client port is new each run,
        # and the master's node passes its own environment (the setting itself) on: the values two
        # runs may not share.
        views = [json.loads(f.read_text()) for f in files]
        for view in views:
            for name in ("GAUDI_CLUSTER_PREIMPORT", "SSH_CLIENT", "SSH_CONNECTION"):
                view["env"].pop(name, None)
            job = view["env"]["GAUDI_CLUSTER_JOB_ID"]
            view["env"] = {k: v.replace(job, "JOB") for k, v in view["env"].items()}
        seen[preimport] = views
    assert [r["forked"] for r in seen["1"]] == [True] * 6
    assert [r["forked"] for r in seen["0"]] == [False] * 6
    for rank, (forked, plain) in enumerate(zip(seen["1"], seen["0"], strict=True)):
        for field in ("env", "argv", "cwd", "path", "name", "host"):
            assert forked[field] == plain[field], (rank, field)
        assert forked["env"]["RANK"] == str(rank)
        # ps, pgrep -f: the forked rank's command line reads as the plain start's (one line where the
        # words did not fit the zygote's argument area), not as its zygote's.
        words = plain["cmdline"].rstrip("\0").split("\0")
        assert forked["cmdline"].rstrip("\0").split("\0") in (words, [" ".join(words)]), forked["cmdline"]
        assert words[-3:] == ["/workspace/user/rankview.py", "--note", "two words"], words
        assert forked["argv"] == ["/workspace/user/rankview.py", "--note", "two words"]
    assert len({r["torch_seed"] for r in seen["1"]}) == 6  # every rank seeded afresh


def test_the_bundled_workload_learns_the_same_with_and_without_the_zygote(make_cluster):
    """The smallest job of the bundled run_clm.py (2 nodes, 3 steps, seed 7): the same loss at every
    step whether its ranks were forked from the zygote or started cold."""
    cluster = make_cluster(workers=1)
    cluster.start_workers()
    cluster.wait_healthy(cluster.worker_names)
    losses = {}
    for preimport in ("1", "0"):
        job = [
            word.replace("/workspace/output", f"/workspace/output/p{preimport}") for word in short_job(3, 3)
        ]
        cluster.start_master(job, extra_env={"GAUDI_CLUSTER_PREIMPORT": preimport})
        code = cluster.wait_master(timeout_s=600)
        log = cluster.logs(cluster.master)
        assert code == 0, log[-4000:]
        assert ("rank 0] gaudi-cluster[rank]: preimport: forked" in log) is (preimport == "1"), log[-3000:]
        state = json.loads((cluster.output_dir / f"p{preimport}/checkpoint-3/trainer_state.json").read_text())
        losses[preimport] = [(h["step"], h["loss"]) for h in state["log_history"] if "loss" in h]
        subprocess.run(["docker", "rm", "-f", cluster.master], check=True, capture_output=True)
    assert len(losses["1"]) == 3
    assert losses["1"] == losses["0"]
