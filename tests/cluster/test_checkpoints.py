"""No checkpoint is ever lost (issue 24): the fault matrix on real two-node jobs, both storage ways.

One cluster for the module: the master (rank 0; its output dir is a host directory) and worker-1
(rank 1; its /workspace/output is a 256 MB tmpfs, so that its disk can fill), plus a 256 MB tmpfs
volume every container mounts as shared storage. Faults are injected at exact points of a save
(``train.faults``); on every restart rank 0 pauses before choosing its checkpoint so that the test
reads every node's checkpoints as the fault left them.

The chain: one master run with --overwrite_output_dir and 7 restarts, each attempt dying at the next
fault point, then a second run that finishes the job. Node-local storage: the worker's rank dies
(the master's keeps its own copy); shared storage: rank 0, the only writer, dies.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import LocalCluster, docker
from train import checkpoints
from train.checkpoints import Inventory

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SCRIPT = "/opt/gaudi-cluster/app/train/run_clm.py"
CPU_CONFIG = "/opt/gaudi-cluster/app/train/configs/ds_cpu.json"
LOCAL = "/workspace/output"
SHARED = "/workspace/shared-out"
WORKER = "worker-1"
MAX_STEPS = 22
# (fault point, save step) of attempts 1..8, and the step each next attempt must resume from
CHAIN = [
    ("before_files", 4, 2),
    ("during_files", 6, 4),
    ("after_files", 8, 6),
    ("before_marker", 10, 8),
    ("after_marker", 12, 12),
    ("during_rotation", 14, 14),
    ("fill_disk", 16, 14),
]
STOP_STEP = 18  # attempt 8: SIGTERM reaches the master while rank 0 writes checkpoint-18


def job(out: str, max_steps: int, save_steps: int, *extra: str) -> list[str]:
    """64-token blocks (the default: the model's 256): a step costs about a quarter; the saves, faults
    and resumes under test are the same."""
    return [
        SCRIPT, "--do_train", "--output_dir", out, "--deepspeed", CPU_CONFIG,
        "--max_steps", str(max_steps), "--save_steps", str(save_steps), "--save_total_limit", "1",
        "--logging_steps", "1", "--per_device_train_batch_size", "4", "--learning_rate", "2e-3",
        "--warmup_steps", "0", "--seed", "7", "--block_size", "64", "--no_plot", *extra,
    ]  # fmt: skip


_LIST = (
    'cd "$1" 2>/dev/null || exit 0; for d in checkpoint-* abandoned-checkpoint-* .deleting-* .fault-filler; '
    f'do [ -e "$d" ] || continue; if [ -f "$d/{checkpoints.COMPLETE_MARKER}" ]; then echo "$d +"; '
    'else echo "$d -"; fi; done'
)


def parse_listing(text: str) -> Inventory:
    complete, incomplete, abandoned, other = [], [], [], []
    for name, mark in (line.split() for line in text.splitlines() if line.strip()):
        if m := re.fullmatch(r"checkpoint-(\d+)", name):
            (complete if mark == "+" else incomplete).append(int(m.group(1)))
        elif m := re.fullmatch(r"abandoned-checkpoint-(\d+)", name):
            abandoned.append(int(m.group(1)))
        else:
            other.append(name)
    return Inventory(
        tuple(sorted(complete)), tuple(sorted(incomplete)), tuple(sorted(abandoned)), tuple(other)
    )


@dataclass
class Rig:
    cluster: LocalCluster
    host_out: Path  # the master's /workspace/output

    def run(self, argv: list[str], env: dict[str, str], pause: Path | None = None) -> Run:
        """One master run; with `pause`, every restart is held until its checkpoints are recorded."""
        docker("rm", "-f", self.cluster.master, check=False)
        self.cluster.start_master(argv, extra_env={"GAUDI_CLUSTER_STOP_GRACE": "20", **env})
        run = Run()
        attempt = 2
        while pause is not None:
            flag = pause / f"paused-{attempt}"
            deadline = time.monotonic() + 300
            while not flag.exists() and self.cluster.state(self.cluster.master) == "running":
                assert time.monotonic() < deadline, self.cluster.logs(self.cluster.master)[-4000:]
                time.sleep(0.2)
            if not flag.exists():
                break
            run.paused[attempt] = self.snapshot(argv)
            run.logs_at_pause[attempt] = self.cluster.logs(self.cluster.master)
            if any(".fault-filler" in inv.leftovers for inv in run.paused[attempt].values()):
                self.worker_sh('rm -f "$1/.fault-filler"', out_dir(argv))  # the operator frees the disk
            (pause / f"go-{attempt}").touch()
            attempt += 1
        run.code = self.cluster.wait_master(timeout_s=600)
        run.log = self.cluster.logs(self.cluster.master)
        run.after = self.snapshot(argv)
        return run

    def worker_sh(self, script: str, *args: str) -> str:
        done = self.cluster.exec(self.cluster.worker(1), "sh", "-c", script, "sh", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def snapshot(self, argv: list[str]) -> dict[str, Inventory]:
        out = out_dir(argv)
        if out.startswith(SHARED):
            return {"shared": parse_listing(self.worker_sh(_LIST, out))}
        master = self.host_out / Path(out).relative_to(LOCAL)
        return {"master": parse_listing(_listing(master)), WORKER: parse_listing(self.worker_sh(_LIST, out))}

    def read(self, path: str) -> str:
        if path.startswith(SHARED):
            return self.worker_sh('cat "$1"', path)
        return (self.host_out / Path(path).relative_to(LOCAL)).read_text()


def _listing(directory: Path) -> str:
    if not directory.is_dir():
        return ""
    lines = []
    for child in sorted(directory.iterdir()):
        if re.fullmatch(r"(abandoned-)?checkpoint-\d+|\.deleting-.*|\.fault-filler", child.name):
            lines.append(f"{child.name} {'+' if checkpoints.is_complete(child) else '-'}")
    return "\n".join(lines)


def out_dir(argv: list[str]) -> str:
    return argv[argv.index("--output_dir") + 1]


@dataclass
class Run:
    code: int = -1
    log: str = ""
    after: dict[str, Inventory] = field(default_factory=dict)
    paused: dict[int, dict[str, Inventory]] = field(default_factory=dict)
    logs_at_pause: dict[int, str] = field(default_factory=dict)


def newest_common(snapshot: dict[str, Inventory]) -> int:
    common = set.intersection(*(set(inv.complete) for inv in snapshot.values()))
    return max(common, default=-1)


def history(rig: Rig, out: str) -> tuple[list[dict], dict]:
    """(the final job report's attempts, the final trainer_state.json)."""
    report = json.loads(rig.read(f"{out}/job_report.json"))
    return report["attempts"], json.loads(rig.read(f"{out}/trainer_state.json"))


@pytest.fixture(scope="module")
def rig(image, cluster_keys, tmp_path_factory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("checkpoints")
    volume = f"gc24-shared-{uuid.uuid4().hex[:6]}"
    docker("volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
           "--opt", "o=size=256m", volume)  # fmt: skip
    cluster = LocalCluster(
        image=image,
        key_dir=cluster_keys,
        workers=1,
        output_dir=root / "output",
        run_args=["-v", f"{volume}:{SHARED}"],
        worker_args={1: ["--tmpfs", f"{LOCAL}:rw,size=256m"]},
    )
    try:
        cluster.create_network()
        cluster.start_workers()
        cluster.wait_healthy(cluster.worker_names)
        yield Rig(cluster, root / "output")
    finally:
        cluster.remove()
        docker("volume", "rm", "-f", volume, check=False)


@dataclass
class Chain:
    shared: bool
    out: str
    first: Run
    first_attempts: list[dict]  # the first run's job report
    second: Run
    seeded: int


@pytest.fixture(scope="module")
def reference(rig: Rig) -> dict:
    """The same job without a fault: the losses every resumed timeline must reproduce."""
    argv = job(f"{LOCAL}/reference", MAX_STEPS, 2)
    run = rig.run(argv, {})
    assert run.code == 0, run.log[-4000:]
    return json.loads(rig.read(f"{LOCAL}/reference/trainer_state.json"))


@pytest.fixture(scope="module", params=["node-local", "shared"])
def chain(request, rig: Rig) -> Chain:
    shared = request.param == "shared"
    out = f"{SHARED}/chain" if shared else f"{LOCAL}/chain"
    extra = ["--shared_output"] if shared else []
    seeded = 100  # a previous run's checkpoint: --overwrite_output_dir removes it on attempt 1
    rig.worker_sh(f'mkdir -p "$1/checkpoint-{seeded}" && echo {{}} > "$1/checkpoint-{seeded}/'
                  f'{checkpoints.COMPLETE_MARKER}"', out)  # fmt: skip
    if not shared:
        (rig.host_out / "chain" / f"checkpoint-{seeded}").mkdir(parents=True)
        checkpoints.write_marker(rig.host_out / "chain" / f"checkpoint-{seeded}", seeded, 2)
    writer = 0 if shared else 1
    faults = [f"{point}@{step}:attempt={n}" for n, (point, step, _) in enumerate(CHAIN, start=1)]
    faults.append(f"sigterm_in_save@{STOP_STEP}:attempt={len(CHAIN) + 1}:rank=0")
    pause = rig.host_out / f"pause-{request.param}"
    env = {
        "GAUDI_CLUSTER_MAX_RESTARTS": str(len(CHAIN)),
        "GAUDI_CLUSTER_ENV": f"GAUDI_CLUSTER_FAULTS={','.join(faults)};GAUDI_CLUSTER_FAULT_RANK={writer};"
        f"GAUDI_CLUSTER_FAULT_PAUSE_DIR={LOCAL}/pause-{request.param}",
    }
    argv = job(out, MAX_STEPS, 2, *extra)
    first = rig.run([*argv, "--overwrite_output_dir"], env, pause=pause)
    attempts = json.loads(rig.read(f"{out}/job_report.json"))["attempts"]
    second = rig.run(argv, {}) if first.code == 143 else Run()
    for attempt, held in sorted(first.paused.items()):  # the outcome table (shown with -s, or on failure)
        print(f"{request.param} attempt {attempt}: {held}")
    print(f"{request.param} after the stop: {first.after}; after the second run: {second.after}")
    return Chain(shared, out, first, attempts, second, seeded)


def test_restarts_resume_and_overwrite_output_dir_applies_to_the_first_attempt_only(chain: Chain):
    """Issue 24 (3): before, every restart of a job started with --overwrite_output_dir began at 0."""
    attempts = chain.first_attempts
    expected = [0] + [resume for _, _, resume in CHAIN]
    assert [a["resumed_from_step"] for a in attempts] == expected, attempts
    assert [a["attempt"] for a in attempts] == list(range(1, len(CHAIN) + 2)), attempts
    assert chain.first.code == 143, chain.first.log[-5000:]
    assert [a["state"] for a in attempts] == ["failed"] * len(CHAIN) + ["stopped"]
    for attempt, step in enumerate(expected[1:], start=2):
        assert f"attempt {attempt}: resuming from step {step} (" in chain.first.log
    assert "--overwrite_output_dir applies to the first attempt only" in chain.first.log
    assert all(chain.seeded not in inv.abandoned + inv.complete for inv in chain.first.paused[2].values())


def test_every_fault_resumes_from_the_newest_checkpoint_complete_on_every_node(chain: Chain):
    for attempt, (point, step, resume) in enumerate(CHAIN, start=2):
        before = chain.first.paused[attempt]
        assert newest_common(before) == resume, (point, before)
        # what the fault left: the save of `step` is complete nowhere (unless every marker was written)
        complete_everywhere = all(step in inv.complete for inv in before.values())
        assert complete_everywhere == (point in ("after_marker", "during_rotation")), (point, before)
    if not chain.shared:  # node-local: the abandoned run's checkpoint the issue is about
        marker_fault = chain.first.paused[5]
        assert 10 in marker_fault["master"].complete and 10 in marker_fault[WORKER].incomplete
    # the rotation fault: the writer died between renaming the oldest checkpoint and deleting it
    rotation_fault = chain.first.paused[7][WORKER if not chain.shared else "shared"]
    assert any(name.startswith(".deleting-checkpoint-10-") for name in rotation_fault.leftovers)
    assert 14 in rotation_fault.complete


def test_a_full_disk_names_the_node_and_the_previous_checkpoint_survives(chain: Chain):
    attempt = len(CHAIN) + 1
    log = chain.first.logs_at_pause[attempt]
    failed = [line for line in log.splitlines() if "failed:" in line and "No space left on device" in line]
    node = "master rank 0" if chain.shared else "worker-1 rank 1"
    assert failed and node in failed[-1], log[-5000:]
    assert "checkpoint-14, is intact" in failed[-1]
    for inv in chain.first.paused[attempt].values():
        assert 14 in inv.complete and 16 not in inv.complete


def test_a_stop_during_a_save_and_the_next_run_finishes_the_same_timeline(chain: Chain, rig, reference):
    stop = chain.first.after
    stopped_at = newest_common(stop)
    assert stopped_at >= STOP_STEP, stop  # the save under way when SIGTERM came completed
    assert chain.second.code == 0, chain.second.log[-5000:]
    assert f"resuming from step {stopped_at} (" in chain.second.log
    attempts, state = history(rig, chain.out)
    assert [a["resumed_from_step"] for a in attempts] == [stopped_at]
    for inv in chain.second.after.values():  # one timeline left: the final checkpoint, nothing aside
        assert inv == Inventory(complete=(MAX_STEPS,)), chain.second.after
    got = [(h["step"], h["loss"]) for h in state["log_history"] if "loss" in h]
    want = [(h["step"], h["loss"]) for h in reference["log_history"] if "loss" in h]
    assert [s for s, _ in got] == list(range(1, MAX_STEPS + 1))
    for (step, loss), (_, ref) in zip(got, want, strict=True):
        assert loss == pytest.approx(ref, rel=1e-3), (step, got, want)


def test_issue_scenario_a_later_save_never_deletes_the_only_common_checkpoint(rig):
    """Issue 24 (1), node-local: the master marks checkpoint-20 complete, the worker dies before its
    marker; the restart resumes from 10 and is stopped at ~15, so a save lands between 10 and the
    abandoned 20. Before, rotation with save_total_limit=1 on the master kept its stale 20 and deleted
    the 15 it had just written, and the next run failed: "the ranks hold different complete checkpoints"."""
    out = f"{LOCAL}/scenario"
    faults = "before_marker@20:rank=1:attempt=1,sigterm@14:rank=0:attempt=2"
    env = {
        "GAUDI_CLUSTER_MAX_RESTARTS": "1",
        "GAUDI_CLUSTER_ENV": f"GAUDI_CLUSTER_FAULTS={faults};"
        f"GAUDI_CLUSTER_FAULT_PAUSE_DIR={LOCAL}/pause-scenario",
    }
    first = rig.run(job(out, 30, 10), env, pause=rig.host_out / "pause-scenario")
    assert first.code == 143, first.log[-5000:]
    held = first.paused[2]
    assert held["master"].complete == (10, 20) and held[WORKER] == Inventory((10,), (20,)), held
    stopped = newest_common(first.after)
    assert 14 < stopped < 20, first.after
    for node, inv in first.after.items():
        assert inv == Inventory(complete=(stopped,), abandoned=(20,)), (node, first.after)
    second = rig.run(job(out, 30, 10), {})
    assert second.code == 0, second.log[-5000:]
    assert f"resuming from step {stopped} (" in second.log
    for node, inv in second.after.items():
        assert inv == Inventory(complete=(30,)), (node, second.after)
