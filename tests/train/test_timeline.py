"""One timeline across nodes, without Docker: ranks are threads, each node an output directory, and the
two collectives (MIN, barrier) a threading barrier. What the cluster tests prove on real jobs, here in
milliseconds and for the cases a real job reaches only by accident."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from gaudi_cluster.view import report
from train import checkpoints, faults, timeline


class Group:
    """N ranks' collectives: every rank's value in, the minimum out."""

    def __init__(self, size: int) -> None:
        self.values: list[int] = [0] * size
        self.wall = threading.Barrier(size, timeout=10)


class ThreadCollective(timeline.Collective):
    def __init__(self, group: Group, rank: int) -> None:
        super().__init__(True)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "rank", rank)

    def min(self, value: int) -> int:
        self.group.values[self.rank] = value
        self.group.wall.wait()
        agreed = min(self.group.values)
        self.group.wall.wait()
        return agreed

    def barrier(self) -> None:
        self.group.wall.wait()


def on_every_rank(nodes: list[Path], work: Callable[[Path, timeline.Collective], object]) -> list[object]:
    """`work(node_dir, collective)` on one rank per node, all at once; their results in node order."""
    group = Group(len(nodes))
    results: list[object] = [None] * len(nodes)

    def run(rank: int) -> None:
        try:
            results[rank] = work(nodes[rank], ThreadCollective(group, rank))
        except BaseException as error:  # handed to the test thread, which raises it
            results[rank] = error
            group.wall.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def save(node: Path, step: int, complete: bool = True) -> Path:
    path = node / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        checkpoints.write_marker(path, step, world_size=2)
    return path


def resume(nodes: list[Path], attempt: int = 1, **overrides: object) -> list[timeline.ResumeDecision]:
    def work(node: Path, collective: timeline.Collective) -> timeline.ResumeDecision:
        kwargs: dict = {"explicit": None, "do_train": True, "start_afresh": False, "attempt": attempt,
                        "writer": True, "collective": collective, **overrides}  # fmt: skip
        return timeline.choose_resume(node, **kwargs)

    return on_every_rank(nodes, work)  # type: ignore[return-value]


def rotate(nodes: list[Path], limit: int | None) -> None:
    on_every_rank(nodes, lambda node, c: timeline.rotate(node, limit, writer=True, collective=c))


def names(node: Path) -> list[str]:
    return sorted(p.name for p in node.iterdir()) if node.is_dir() else []


@pytest.fixture
def nodes(tmp_path: Path) -> list[Path]:
    return [tmp_path / "node-a", tmp_path / "node-b"]


@pytest.mark.parametrize(
    ("a", "b", "common"),
    [([4, 8], [4, 8], 8), ([4, 8], [4], 4), ([2, 4, 8], [4, 6], 4), ([4, 8], [6], -1), ([], [4], -1)],
)
def test_newest_common_step_is_the_newest_step_every_rank_has(a, b, common) -> None:
    group = Group(2)
    results: list[int] = [0, 0]

    def run(rank: int, steps: list[int]) -> None:
        results[rank] = timeline.newest_common_step(steps, ThreadCollective(group, rank))

    threads = [threading.Thread(target=run, args=(r, s)) for r, s in enumerate((a, b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == [common, common]


def test_issue_scenario_rotation_never_deletes_the_only_common_checkpoint(nodes) -> None:
    """Issue 24 (1): A marked checkpoint-200 complete, B died before its marker; the restart agrees on
    100, trains on, and a save at 150 with save_total_limit=1 rotates on each node. Before, A kept its
    stale 200 and deleted the 150 it had just written, and the next resume failed."""
    a, b = nodes
    for node in nodes:
        save(node, 100)
    save(a, 200)
    save(b, 200, complete=False)
    first = resume(nodes, attempt=2)
    assert [d.step for d in first] == [100, 100]
    assert first[0].demoted == ("checkpoint-200",) and first[1].demoted == ("checkpoint-200",)
    assert names(a) == ["abandoned-checkpoint-200", "checkpoint-100"]
    for node in nodes:
        save(node, 150)
    rotate(nodes, limit=1)
    assert names(a) == ["abandoned-checkpoint-200", "checkpoint-150"]
    assert names(b) == ["abandoned-checkpoint-200", "checkpoint-150"]
    assert [d.step for d in resume(nodes, attempt=3)] == [150, 150]
    for node in nodes:
        save(node, 200)  # the live run passes the abandoned step: its copy goes
    rotate(nodes, limit=1)
    assert names(a) == names(b) == ["checkpoint-200"]


def test_rotation_keeps_the_common_checkpoint_when_a_node_lacks_the_newest(nodes) -> None:
    a, b = nodes
    for node in nodes:
        save(node, 10)
    save(a, 20)  # B's copy of 20 is missing (an outside hand): 10 is the only common one
    rotate(nodes, limit=1)
    assert names(a) == ["checkpoint-10", "checkpoint-20"] and names(b) == ["checkpoint-10"]


def test_overwrite_output_dir_applies_to_the_first_attempt_only(nodes) -> None:
    for node in nodes:
        save(node, 4)
        save(node, 8)
    again = resume(nodes, attempt=2, start_afresh=True)
    assert [d.step for d in again] == [8, 8]
    assert "first attempt only" in again[0].why
    assert again[0].line().startswith("attempt 2: resuming from step 8 (")
    fresh = resume(nodes, attempt=1, start_afresh=True)
    assert [d.step for d in fresh] == [None, None] and names(nodes[0]) == []


def test_explicit_checkpoint_applies_to_the_first_attempt_only(nodes, tmp_path) -> None:
    elsewhere = save(tmp_path / "pretrained", 3)
    for node in nodes:
        save(node, 6)
    assert [d.step for d in resume(nodes, attempt=2, explicit=str(elsewhere))] == [6, 6]
    first = resume(nodes, attempt=1, explicit=str(elsewhere))
    assert [d.checkpoint for d in first] == [str(elsewhere)] * 2
    assert names(nodes[0]) == ["abandoned-checkpoint-6"]  # newer than step 3: not this timeline


def test_no_common_checkpoint_starts_from_step_0_and_keeps_the_files_aside(nodes) -> None:
    save(nodes[0], 4)
    save(nodes[1], 4, complete=False)
    decisions = resume(nodes, attempt=2)
    assert [d.step for d in decisions] == [None, None]
    assert decisions[0].line() == "attempt 2: training from step 0 (no checkpoint is complete on every node)"
    assert names(nodes[0]) == names(nodes[1]) == ["abandoned-checkpoint-4"]


def test_marker_goes_first_when_a_checkpoint_is_saved_again(tmp_path) -> None:
    ckpt = save(tmp_path, 5)
    assert checkpoints.unmark(ckpt) and not checkpoints.is_complete(ckpt)
    assert not checkpoints.unmark(ckpt)
    assert not checkpoints.unmark(tmp_path / "checkpoint-9")  # nothing there yet


def test_demote_replaces_an_older_abandoned_copy_of_the_same_step(tmp_path) -> None:
    save(tmp_path, 7)
    checkpoints.demote(tmp_path, 0)
    (save(tmp_path, 7) / "new").write_text("x")
    assert checkpoints.demote(tmp_path, 0) == [("checkpoint-7", "abandoned-checkpoint-7")]
    assert (tmp_path / "abandoned-checkpoint-7" / "new").is_file()
    assert names(tmp_path) == ["abandoned-checkpoint-7"]


def test_rotation_plan_keeps_what_resume_needs() -> None:
    inv = checkpoints.Inventory(
        complete=(2, 4, 6, 8), incomplete=(1, 9), abandoned=(5, 12), leftovers=(".deleting-checkpoint-3-7",)
    )
    assert checkpoints.rotation_plan(inv, keep_step=6, save_total_limit=1) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-4", "abandoned-checkpoint-5", ".deleting-checkpoint-3-7",
    ]  # fmt: skip
    assert checkpoints.rotation_plan(inv, keep_step=-1, save_total_limit=1) == [".deleting-checkpoint-3-7"]
    assert "checkpoint-8" not in checkpoints.rotation_plan(inv, keep_step=8, save_total_limit=None)


def test_a_crash_mid_delete_leaves_a_leftover_that_the_next_rotation_removes(tmp_path) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2)

    def crash(_path: Path) -> None:
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        timeline.rotate(tmp_path, 1, writer=True, collective=timeline.Collective(False), on_renamed=crash)
    assert checkpoints.inventory(tmp_path).complete == (2,) and checkpoints.inventory(tmp_path).leftovers
    timeline.rotate(tmp_path, 1, writer=True, collective=timeline.Collective(False))
    assert names(tmp_path) == ["checkpoint-2"]


def test_a_full_disk_is_recognised_from_torchs_error_too(tmp_path) -> None:
    assert checkpoints.disk_full(OSError(28, "No space left on device"), tmp_path)
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert not checkpoints.disk_full(wrapped, tmp_path)  # this disk has room: not the disk's fault
    try:
        raise RuntimeError("serializing failed") from OSError(28, "No space left on device")
    except RuntimeError as error:
        assert checkpoints.disk_full(error, tmp_path)


@pytest.mark.parametrize(
    ("env", "attempt"),
    [({}, 1), ({"GAUDI_CLUSTER_ATTEMPT": "3"}, 3), ({"TORCHELASTIC_RESTART_COUNT": "1"}, 2),
     ({"SLURM_RESTART_COUNT": "0"}, 1), ({"GAUDI_CLUSTER_ATTEMPT": "x"}, 1)],
)  # fmt: skip
def test_attempt_number(env: dict[str, str], attempt: int) -> None:
    assert timeline.attempt_number(env) == attempt


def test_fault_specs_parse_and_bad_ones_are_named() -> None:
    assert faults.parse_faults("before_marker@10:rank=1, sigterm@14:attempt=2", default_rank=0) == (
        faults.Fault("before_marker", 10, 1, 1),
        faults.Fault("sigterm", 14, 0, 2),
    )
    with pytest.raises(ValueError, match="'explode@3'"):
        faults.parse_faults("explode@3")
    with pytest.raises(ValueError, match="rank=N and attempt=N"):
        faults.parse_faults("after_files@3:node=2")


def test_the_job_report_reads_the_resume_event() -> None:
    """The workload's `resume` event (ResumeDecision.to_json) is what view/report reads per attempt."""
    decision = timeline.ResumeDecision(2, 8, "/out/checkpoint-8", "the newest", ("checkpoint-10",))
    assert timeline.ResumeDecision.from_json(json.loads(json.dumps(decision.to_json()))) == decision
    events = [{"event": "start"}, {"event": "resume", **decision.to_json()}]
    assert report.resumed_from_step(events) == 8
    afresh = timeline.ResumeDecision(1, None, None, "--overwrite_output_dir")
    assert report.resumed_from_step([{"event": "resume", **afresh.to_json()}]) == 0
    assert report.resumed_from_step([{"event": "start"}]) is None
    record = report.AttemptRecord(2, "j2", "succeeded", 0, 8)
    assert report.AttemptRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
