"""The bundled workload, for real: DeepSpeed training on 2 CPU ranks, resume, evaluation, signals,
and bad input. Nothing reaches for the network (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train import checkpoints
from train.events import parse_events

from tests.support.training import (
    BLOCK_SIZE,
    ROOT,
    SAVE_STEPS,
    SCRIPT,
    TRAIN_STEPS,
    Run,
    read_json,
    run_clm,
    run_deepspeed,
    train_args,
)

EVENT_ORDER = ["start", "imports_done", "model_ready", "first_step", "train_done"]


def losses(state: dict) -> list[tuple[int, float]]:
    return [(h["step"], h["loss"]) for h in state["log_history"] if "loss" in h]


@pytest.mark.slow
def test_two_rank_deepspeed_training_learns_and_reports(trained: tuple[Path, Run]) -> None:
    out, run = trained
    state = read_json(out / "trainer_state.json")
    assert state["global_step"] == TRAIN_STEPS
    curve = losses(state)
    assert len(curve) == TRAIN_STEPS
    first, last = curve[0][1], sum(v for _, v in curve[-3:]) / 3
    assert last < first - 0.3, f"loss did not go down: {curve}"

    train = read_json(out / "train_results.json")
    every = read_json(out / "all_results.json")
    for key in ("train_samples_per_second", "train_tokens_per_second", "train_runtime", "train_loss", "mfu"):
        assert train[key] > 0, key
        assert every[key] == train[key]
    assert train["world_size"] == 2
    assert train["global_batch_size"] == 8
    assert train["throughput_warmup_steps_applied"] == 2
    assert train["train_tokens_per_second"] == pytest.approx(
        train["train_samples_per_second"] * BLOCK_SIZE, rel=1e-3
    )
    assert train["peak_rss (GB)"] > 0
    png = out / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    names = [e["event"] for e in run.events]
    assert [n for n in names if n in EVENT_ORDER] == EVENT_ORDER, names  # rank 0 only, once each, in order
    times = [run.event(n)["t"] for n in EVENT_ORDER]
    assert times == sorted(times)
    assert run.event("model_ready")["world_size"] == 2

    done = checkpoints.complete_checkpoints(out)
    assert [s for s, _ in done] == [SAVE_STEPS, TRAIN_STEPS]
    assert (out / f"checkpoint-{TRAIN_STEPS}" / f"global_step{TRAIN_STEPS}").is_dir()  # DeepSpeed's own state


@pytest.mark.slow
def test_resume_continues_from_saved_step(trained: tuple[Path, Run], train_env: dict, tmp_path: Path) -> None:
    out, _ = trained
    ckpt = out / f"checkpoint-{TRAIN_STEPS}"
    out2 = tmp_path / "resumed"
    run = run_deepspeed([*train_args(out2, max_steps=TRAIN_STEPS + 2), "--resume_from_checkpoint", str(ckpt)],
                        train_env)  # fmt: skip
    assert run.rc == 0, run.err[-5000:]
    assert run.event("model_ready")["resume_from"] == str(ckpt)
    state = read_json(out2 / "trainer_state.json")
    assert state["global_step"] == TRAIN_STEPS + 2
    steps = [s for s, _ in losses(state)]
    assert steps == list(range(1, TRAIN_STEPS + 3)), (
        steps
    )  # history carried over, then the new steps appended
    assert run.event("first_step")["step"] == TRAIN_STEPS + 1


@pytest.mark.slow
def test_eval_on_saved_output_dir_single_process(
    trained: tuple[Path, Run], train_env: dict, tmp_path: Path
) -> None:
    out, _ = trained
    model_dir = tmp_path / "model"
    shutil.copytree(out, model_dir, ignore=shutil.ignore_patterns("checkpoint-*"))
    run = run_clm(["--model_name_or_path", str(model_dir), "--do_eval", "--output_dir", str(model_dir),
                   "--per_device_eval_batch_size", "8"], train_env)  # fmt: skip
    assert run.rc == 0, run.err[-5000:]
    result = read_json(model_dir / "eval_results.json")
    assert math.isfinite(result["perplexity"]) and result["perplexity"] > 1
    assert result["perplexity"] == pytest.approx(math.exp(result["eval_loss"]))
    assert result["eval_samples"] > 0
    assert run.event("eval_done")["perplexity"] == pytest.approx(result["perplexity"])
    # the model learned something: far better than uniform over the 4096-token vocabulary
    assert result["perplexity"] < 4096 / 2


@pytest.mark.slow
def test_seed_eval_command_runs_on_cpu(trained: tuple[Path, Run], train_env: dict, data_root: Path,
                                       tmp_path: Path) -> None:  # fmt: skip
    """The seed's single-node evaluation, --use_habana dropped, wikitext replaced by a local text file."""
    out, _ = trained
    model_dir = tmp_path / "gpt2_multi_node"
    shutil.copytree(out, model_dir, ignore=shutil.ignore_patterns("checkpoint-*"))
    valid = tmp_path / "valid.txt"
    valid.write_text((data_root / "default-v1" / "validation.txt").read_text())
    run = run_clm(
        ["--model_name_or_path", str(model_dir), "--gaudi_config_name", "Habana/gpt2",
         "--validation_file", str(valid), "--do_eval", "--output_dir", str(model_dir),
         "--per_device_eval_batch_size", "8", "--use_lazy_mode"],
        train_env, module=True,
    )  # fmt: skip
    assert run.rc == 0, run.err[-5000:]
    ignored = [line for line in run.err.splitlines() if "accepted and ignored" in line]
    assert len(ignored) == 1 and "--gaudi_config_name" in ignored[0] and "--use_lazy_mode" in ignored[0]
    result = read_json(model_dir / "eval_results.json")
    assert math.isfinite(result["perplexity"]) and result["eval_samples"] > 0


@pytest.mark.slow
def test_sigterm_saves_checkpoint_then_fresh_start_resumes(train_env: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    progress = tmp_path / "progress.json"
    env = {**train_env, "GAUDI_CLUSTER_PROGRESS_FILE": str(progress)}
    args = [*train_args(out, max_steps=1000), "--save_steps", "1000"]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if progress.exists() and read_json(progress)["step"] >= 2:
                break
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            time.sleep(0.2)
        else:
            pytest.fail("no progress within 120 s")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-4000:]
    stopped = [e for e in parse_events(stdout) if e["event"] == "train_stopped"]
    assert stopped and stopped[0]["signal"] == signal.SIGTERM
    step = stopped[0]["step"]
    assert step >= 2
    assert read_json(progress)["step"] == step
    assert [s for s, _ in checkpoints.complete_checkpoints(out)] == [step]

    # a fresh start on the same output_dir resumes from the newest complete checkpoint
    again = run_clm([*train_args(out, max_steps=step + 2)], train_env)
    assert again.rc == 0, again.err[-4000:]
    assert again.event("model_ready")["resume_from"] == str(out / f"checkpoint-{step}")
    assert read_json(out / "trainer_state.json")["global_step"] == step + 2


def test_use_habana_without_hpu_is_one_clear_error(train_env: dict) -> None:
    run = run_clm(["--use_habana", "--do_train", "--output_dir", "/nonexistent/x"], train_env)
    assert run.rc == 2
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("run_clm: error: --use_habana"), run.err


BAD_INPUT = [
    (["--do_train", "--train_file", "missing.txt"], "--train_file missing.txt: no such file"),
    (["--do_train", "--train_file", "data.parquet"], "unknown file type"),
    (["--do_eval", "--validation_file", "nowhere.json"], "--validation_file nowhere.json: no such file"),
    (["--do_train", "--block_size", "512"], "--block_size 512 is larger than the model's context length 256"),
    (["--do_train", "--deepspeed", "no_such_ds.json"], "--deepspeed no_such_ds.json: no such file"),
    (["--do_train", "--resume_from_checkpoint", "/no/such/ckpt"], "--resume_from_checkpoint /no/such/ckpt"),
    (["--do_train", "--use_habana"], "--use_habana given but no Gaudi HPU"),
    (["--do_eval", "--dataset_name", "no_such_dataset_xyz"], "cannot load dataset no_such_dataset_xyz"),
    (["--do_train", "--no_such_flag", "1"], None),  # argparse: exit 2 with its usage message
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a[1:3]) for a, _ in BAD_INPUT])
def test_bad_input_exits_2(
    args: list[str], message: str | None, train_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """In-process (imports paid once): each case returns 2 with a one-line message naming the culprit."""
    import datasets
    import huggingface_hub.constants
    from train import run_clm as script

    for key, value in train_env.items():
        monkeypatch.setenv(key, value)
    # Both libraries read HF_*_OFFLINE when first imported, which an earlier test in this process may
    # have done without them: offline as run_clm started with train_env is, not 20 s of hub retries.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    try:
        rc = script.main([*args, "--output_dir", str(tmp_path / "out")])
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    if message is not None:
        errors = [line for line in err.splitlines() if line.startswith("run_clm: error:")]
        assert len(errors) == 1 and message in errors[0], err


def test_eval_refused_when_job_spans_hosts(train_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    from train import run_clm as script

    for key, value in {**train_env, "CROSS_SIZE": "3", "WORLD_SIZE": "3", "LOCAL_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    rc = script.main(["--do_eval", "--output_dir", str(tmp_path / "o"), "--per_device_eval_batch_size", "8"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "spans 3 hosts" in err
    assert f"python -m train.run_clm --model_name_or_path {tmp_path / 'o'} --do_eval" in err
    assert "--per_device_eval_batch_size 8" in err


@pytest.mark.parametrize(
    ("env", "hosts"),
    [
        ({}, 1),
        ({"WORLD_SIZE": "2", "LOCAL_SIZE": "2", "CROSS_SIZE": "1"}, 1),
        ({"WORLD_SIZE": "3", "LOCAL_SIZE": "1", "CROSS_SIZE": "3"}, 3),
        ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 2),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 1),
    ],
)
def test_spans_hosts(env: dict, hosts: int) -> None:
    from train.command_line import spans_hosts

    assert spans_hosts(env) == hosts


def test_embedded_data_is_deterministic(data_root: Path, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "train.data", "--out", str(tmp_path)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "app")}, capture_output=True)  # fmt: skip
    a = read_json(data_root / "default-v1" / "meta.json")
    b = read_json(tmp_path / "default-v1" / "meta.json")
    assert a["sha256"] == b["sha256"]
    assert a["vocab_size"] == 4096
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_seed_training_flags_parse_off_gaudi(train_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag of the seed's training command parses with the CPU stack (only --use_habana dropped)."""
    from train import arguments, device

    for key, value in train_env.items():
        monkeypatch.setenv(key, value)
    argv = [
        "--model_name_or_path", "gpt2-xl", "--gaudi_config_name", "Habana/gpt2",
        "--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1", "--do_train",
        "--output_dir", "/tmp/gpt2_xl_multi_node", "--learning_rate", "4e-04",
        "--per_device_train_batch_size", "16", "--gradient_checkpointing", "--num_train_epochs", "1",
        "--use_lazy_mode", "--throughput_warmup_steps", "3", "--deepspeed", "ds_cpu",
        "--overwrite_output_dir", "--block_size", "128", "--save_steps", "50", "--logging_steps", "5",
        "--seed", "3", "--max_steps", "7",
    ]  # fmt: skip
    cpu = device.DeviceChoice("cpu", False)
    training_cls, _ = device.training_stack(cpu)
    args = arguments.parse(argv, training_cls, cpu)
    model_args, data_args, training_args = args.model, args.data, args.training
    assert model_args.model_name_or_path == "gpt2-xl"
    assert (data_args.dataset_name, data_args.dataset_config_name, data_args.block_size) == (
        "wikitext", "wikitext-2-raw-v1", 128,
    )  # fmt: skip
    assert training_args.learning_rate == 4e-4 and training_args.per_device_train_batch_size == 16
    assert training_args.gradient_checkpointing and training_args.do_train
    assert training_args.deepspeed.endswith("configs/ds_cpu.json")
    assert args.habana.throughput_warmup_steps == 3 and args.habana.use_lazy_mode
    assert args.overwrite.overwrite_output_dir
    assert args.habana.gaudi_config_name == "Habana/gpt2" and not args.habana.use_habana
    assert training_args.report_to in ([], "none", ["none"])
