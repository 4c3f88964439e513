"""Fast checks of the pure pieces: checkpoint markers, rotation and the resume choice, flag scanning,
throughput math and the metrics a run reports."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from train import checkpoints, device, metrics, timeline
from train.events import parse_events, write_progress


def make_ckpt(root: Path, step: int, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        checkpoints.write_marker(path, step, world_size=2)
    return path


def test_only_marked_checkpoints_count(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 5, True)
    make_ckpt(tmp_path, 10, False)  # crashed mid-save
    assert checkpoints.latest_complete(tmp_path)[0] == 5
    assert json.loads((tmp_path / "checkpoint-5" / checkpoints.COMPLETE_MARKER).read_text())["step"] == 5


def rotate(out: Path, save_total_limit: int | None) -> list[Path]:
    return timeline.rotate(out, save_total_limit, writer=True, collective=timeline.Collective(False))


def test_rotation_keeps_newest_complete_and_drops_stale_partials(tmp_path: Path) -> None:
    for step, done in [(1, True), (2, False), (3, True), (4, True), (5, False)]:
        make_ckpt(tmp_path, step, done)
    removed = rotate(tmp_path, save_total_limit=2)
    assert sorted(p.name for p in removed) == ["checkpoint-1", "checkpoint-2"]
    # checkpoint-5 is newer than the newest complete one: it may still be being written, so it stays
    assert [p.name for _, p in checkpoints.list_checkpoints(tmp_path)] == [
        "checkpoint-3", "checkpoint-4", "checkpoint-5",
    ]  # fmt: skip
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".deleting")]


def test_rotation_with_limit_one_never_leaves_zero_complete(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 1, True)
    make_ckpt(tmp_path, 2, False)
    rotate(tmp_path, save_total_limit=1)
    assert checkpoints.latest_complete(tmp_path)[0] == 1


def test_resolve_explicit(tmp_path: Path) -> None:
    ckpt = make_ckpt(tmp_path, 7, True)
    assert checkpoints.resolve_explicit(str(ckpt)) == ckpt
    assert checkpoints.resolve_explicit(str(tmp_path)) == ckpt  # an output dir: its newest complete one
    with pytest.raises(FileNotFoundError, match="no such file"):
        checkpoints.resolve_explicit(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        checkpoints.resolve_explicit(str(empty))


@pytest.mark.parametrize(
    ("argv", "value", "truth"),
    [
        (["--use_habana"], "true", True),
        (["--use_habana", "--do_train"], "true", True),
        (["--use_habana", "false"], "false", False),
        (["--use_habana=False"], "False", False),
        (["--use_habana_x"], None, False),
        ([], None, False),
    ],
)
def test_flag_scan(argv: list[str], value: str | None, truth: bool) -> None:
    assert device.flag_value(argv, "use_habana") == value
    assert device.flag_true(argv, "use_habana") is truth


def test_throughput_excludes_warmup() -> None:
    clock = metrics.StepClock(warmup_steps=2)
    clock.t_begin, clock.first_step = 0.0, 0
    # step 1 and 2 are slow (warmup), then 1 s per step
    clock.steps, clock.times = [1, 2, 3, 4, 5], [10.0, 20.0, 21.0, 22.0, 23.0]
    got = metrics.throughput(clock, global_batch=8, block_size=256)
    assert got["train_steps_per_second"] == 1.0
    assert got["train_samples_per_second"] == 8.0
    assert got["train_tokens_per_second"] == 8.0 * 256
    # fewer steps than warmup: all steps count
    short = metrics.StepClock(warmup_steps=5)
    short.t_begin, short.first_step, short.steps, short.times = 0.0, 0, [1, 2], [1.0, 2.0]
    assert metrics.throughput(short, 4, 10)["train_steps_per_second"] == 1.0


def test_mfu_formula() -> None:
    assert metrics.mfu(1_000_000, 1000.0, peak_tflops=1.0, world_size=2) == pytest.approx(6e9 / 2e12)
    assert metrics.mfu(1, 1.0, peak_tflops=None, world_size=1) is None


def test_progress_file_is_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "progress.json"
    write_progress(str(target), 3, t=12.5)
    assert json.loads(target.read_text()) == {"step": 3, "t": 12.5}
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]


def test_parse_events_finds_prefixed_lines() -> None:
    text = 'noise\n[n1 rank 0] gaudi-cluster-event {"event": "start", "t": 1.0}\n'
    assert parse_events(text) == [{"event": "start", "t": 1.0}]


def test_marker_gives_every_node_deepspeeds_latest_tag(tmp_path):
    """Node-local checkpoints: DeepSpeed writes 'latest' on global rank 0 only; the others need it too."""
    ckpt = tmp_path / "checkpoint-12"
    (ckpt / "global_step12").mkdir(parents=True)
    checkpoints.write_marker(ckpt, 12, world_size=3)
    assert (ckpt / "latest").read_text() == "global_step12"
    assert checkpoints.is_complete(ckpt)
    (ckpt / "latest").write_text("global_step12")  # rank 0's own tag is left alone
    checkpoints.write_marker(ckpt, 12, world_size=3)
    assert (ckpt / "latest").read_text() == "global_step12"


def test_every_file_of_a_checkpoint_is_on_disk_before_its_marker(tmp_path: Path, monkeypatch) -> None:
    ckpt = tmp_path / "checkpoint-7"
    (ckpt / "global_step7").mkdir(parents=True)
    (ckpt / "global_step7" / "mp_rank_00_model_states.pt").write_bytes(b"w")
    (ckpt / "trainer_state.json").write_text("{}")
    order: list[str] = []
    real_fsync, real_replace = checkpoints.os.fsync, checkpoints.os.replace

    def fsync(fd: int) -> None:
        order.append("fsync " + Path(checkpoints.os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        order.append("rename " + Path(str(dst)).name)
        real_replace(src, dst)

    monkeypatch.setattr(checkpoints.os, "fsync", fsync)
    monkeypatch.setattr(checkpoints.os, "replace", replace)
    checkpoints.write_marker(ckpt, 7, world_size=1)
    marked = order.index("rename " + checkpoints.COMPLETE_MARKER)
    for name in ("mp_rank_00_model_states.pt", "trainer_state.json", "latest", "global_step7"):
        assert "fsync " + name in order[:marked], (name, order)


def test_remove_checkpoints_reports_only_what_it_removed(tmp_path: Path) -> None:
    kept_away = tmp_path / "checkpoint-9"  # already gone: another writer removed it
    gone = [make_ckpt(tmp_path, 1, True), kept_away, make_ckpt(tmp_path, 2, False)]
    assert checkpoints.remove_checkpoints(gone) == [gone[0], gone[2]]
    assert list(tmp_path.iterdir()) == []


def choose(out: Path, **overrides: object) -> str | None:
    kwargs: dict = {"explicit": None, "do_train": True, "start_afresh": False, "attempt": 1, "writer": True,
                    "collective": timeline.Collective(False)}  # fmt: skip
    return timeline.choose_resume(out, **{**kwargs, **overrides}).checkpoint


def test_resume_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    assert choose(tmp_path / "missing") is None
    assert choose(tmp_path) is None
    make_ckpt(tmp_path, 4, True)
    make_ckpt(tmp_path, 8, True)
    make_ckpt(tmp_path, 12, False)  # crashed mid-save
    assert choose(tmp_path, do_train=False) is None  # evaluation only: nothing to resume, nothing moved
    assert (tmp_path / "checkpoint-12").is_dir()
    assert choose(tmp_path) == str(tmp_path / "checkpoint-8")
    # the crashed save belongs to an abandoned run: moved aside, where nothing counts it
    assert [p.name for _, p in checkpoints.list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-8"]
    assert (tmp_path / "abandoned-checkpoint-12").is_dir()


def test_explicit_resume_wins(tmp_path: Path) -> None:
    old = make_ckpt(tmp_path / "other", 3, True)
    make_ckpt(tmp_path, 2, True)
    assert choose(tmp_path, explicit=str(tmp_path / "other"), do_train=False) is None
    assert choose(tmp_path, explicit=str(tmp_path / "other")) == str(old)
    assert checkpoints.latest_complete(tmp_path)[0] == 2  # older than the explicit step: kept
    make_ckpt(tmp_path, 8, True)
    assert choose(tmp_path, explicit=str(old), start_afresh=True) == str(old)
    assert (tmp_path / "abandoned-checkpoint-8").is_dir()  # newer than step 3: another timeline


def test_start_afresh_removes_checkpoints_on_writers_only(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 4, True)
    make_ckpt(tmp_path, 8, False)
    (tmp_path / "config.json").write_text("{}")
    assert choose(tmp_path, start_afresh=True, writer=False) is None
    assert len(checkpoints.list_checkpoints(tmp_path)) == 2
    assert choose(tmp_path, start_afresh=True) is None
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no checkpoint, no .deleting-* left


def test_train_metrics_assembly() -> None:
    clock = metrics.StepClock(warmup_steps=1)
    clock.t_begin, clock.first_step = 0.0, 0
    clock.steps, clock.times = [1, 2, 3], [5.0, 7.0, 9.0]  # 2 s per step after the warmup step
    got = metrics.train_metrics(
        {"train_loss": 2.5, "train_runtime": 9.0},
        clock,
        global_batch=8,
        block_size=16,
        n_params=1000,
        world_size=2,
        peak_tflops=1.0,
        memory={"peak_rss (GB)": 1.5},
        train_samples=100,
        global_step=3,
    )
    tokens_per_second = 0.5 * 8 * 16
    assert got == {
        "train_loss": 2.5,
        "train_runtime": 9.0,
        "train_steps_per_second": 0.5,
        "train_samples_per_second": 4.0,
        "train_tokens_per_second": tokens_per_second,
        "throughput_warmup_steps_applied": 1,
        "mfu": round(6 * 1000 * tokens_per_second / (1e12 * 2), 6),
        "peak_tflops_per_device": 1.0,
        "peak_rss (GB)": 1.5,
        "train_samples": 100,
        "global_batch_size": 8,
        "world_size": 2,
        "n_params": 1000,
        "global_step": 3,
    }
    unknown_peak = metrics.train_metrics(
        {}, clock, global_batch=8, block_size=16, n_params=1000, world_size=2, peak_tflops=None, memory={},
        train_samples=1, global_step=3,
    )  # fmt: skip
    assert "mfu" not in unknown_peak and "peak_tflops_per_device" not in unknown_peak


def test_eval_metrics_add_samples_and_perplexity() -> None:
    got = metrics.eval_metrics({"eval_loss": 2.0}, eval_samples=7)
    assert got == {"eval_loss": 2.0, "eval_samples": 7, "perplexity": pytest.approx(7.389056)}
    assert metrics.eval_metrics({"eval_loss": 1e6}, 1)["perplexity"] == float("inf")


def test_global_batch_and_deepspeed_refill_is_a_no_op_without_deepspeed() -> None:
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=3,
                           deepspeed=None, hf_deepspeed_config=None)  # fmt: skip
    assert device.global_batch_size(args) == 24
    device.refresh_deepspeed_config(args)
    assert args.hf_deepspeed_config is None


@pytest.mark.parametrize(("node_local", "before"), [(True, {}), (False, {"use_node_local_storage": True})])
def test_deepspeeds_node_local_switch_follows_the_storage(node_local: bool, before: dict) -> None:
    """Shared storage: only global rank 0 writes DeepSpeed's model states, never every node into one dir."""
    config = {"zero_optimization": {"stage": 0}, "checkpoint": dict(before)}
    args = SimpleNamespace(deepspeed="ds.json", hf_deepspeed_config=SimpleNamespace(config=config),
                           save_on_each_node=node_local)  # fmt: skip
    device.match_checkpoint_storage(args)
    assert config["checkpoint"]["use_node_local_storage"] is node_local
