"""The command line of run_clm: argument classes on both stacks, rewrites before parsing, the JSON form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from train import arguments, command_line, device, model
from train.errors import UsageError
from transformers import HfArgumentParser, Trainer, TrainingArguments

from tests.support.training import APP

CPU = device.DeviceChoice("cpu", False)


@dataclass
class FakeGaudiTrainingArguments(TrainingArguments):
    """The Habana fields as optimum-habana's GaudiTrainingArguments declares them (types and defaults)."""

    use_habana: bool | None = field(default=False, metadata={"help": "HPU"})
    gaudi_config_name: str | None = field(default=None, metadata={"help": "GaudiConfig"})
    use_lazy_mode: bool | None = field(default=True, metadata={"help": "lazy"})
    throughput_warmup_steps: int | None = field(default=0, metadata={"help": "warmup"})
    adjust_throughput: bool = field(default=False, metadata={"help": "adjust"})


@dataclass
class TrainingArgumentsWithOverwrite(TrainingArguments):
    """transformers 4's TrainingArguments still declared --overwrite_output_dir."""

    overwrite_output_dir: bool = field(default=False, metadata={"help": "overwrite"})


@dataclass
class HalfHabanaTrainingArguments(TrainingArguments):
    use_habana: bool = False


def flag_names(classes: tuple[type, ...]) -> list[str]:
    return [f.name for cls in classes for f in fields(cls) if f.init]


@pytest.mark.parametrize(
    ("training_cls", "own_groups"),
    [
        (TrainingArguments, [arguments.OverwriteArguments, arguments.HabanaArguments]),
        (FakeGaudiTrainingArguments, [arguments.OverwriteArguments]),
        (TrainingArgumentsWithOverwrite, [arguments.HabanaArguments]),
    ],
    ids=["transformers-5", "gaudi", "transformers-4"],
)
def test_every_flag_is_declared_once_on_every_stack(training_cls: type, own_groups: list[type]) -> None:
    classes = arguments.parser_classes(training_cls)
    assert [c for c in classes if c in arguments.SHARED_GROUPS] == own_groups
    assert classes[:2] == (arguments.ModelArguments, arguments.DataTrainingArguments)
    assert arguments.ClusterArguments in classes and classes[-1] is training_cls
    names = flag_names(classes)
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    HfArgumentParser(classes)  # argparse raises on a flag declared twice


def test_a_half_declared_group_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"declares only \['use_habana'\] of HabanaArguments"):
        arguments.parser_classes(HalfHabanaTrainingArguments)


def test_habana_flags_parse_off_gaudi(tmp_path: Path) -> None:
    argv = ["--output_dir", str(tmp_path), "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2",
            "--throughput_warmup_steps", "3", "--adjust_throughput", "--overwrite_output_dir",
            "--shared_output", "--peak_tflops", "12.5", "--no_plot"]  # fmt: skip
    args = arguments.parse(argv, TrainingArguments, CPU)
    assert args.habana == arguments.HabanaArguments(
        use_habana=False,
        use_lazy_mode=True,
        gaudi_config_name="Habana/gpt2",
        throughput_warmup_steps=3,
        adjust_throughput=True,
    )
    assert args.overwrite.overwrite_output_dir
    assert args.cluster == arguments.ClusterArguments(shared_output=True, peak_tflops=12.5, plot=False)
    assert args.training.use_cpu and args.training.report_to in ([], "none", ["none"])


def test_on_gaudi_the_habana_flags_are_read_from_the_training_arguments(tmp_path: Path) -> None:
    argv = ["--output_dir", str(tmp_path), "--use_habana", "--use_lazy_mode", "false",
            "--gaudi_config_name", "Habana/gpt2", "--throughput_warmup_steps", "4"]  # fmt: skip
    args = arguments.parse(argv, FakeGaudiTrainingArguments, CPU)
    assert isinstance(args.training, FakeGaudiTrainingArguments)
    assert (args.training.use_habana, args.training.throughput_warmup_steps) == (True, 4)
    assert args.habana == arguments.HabanaArguments(
        use_habana=True,
        use_lazy_mode=False,
        gaudi_config_name="Habana/gpt2",
        throughput_warmup_steps=4,
        adjust_throughput=False,
    )
    assert not args.overwrite.overwrite_output_dir


def test_transformers_4_overwrite_flag_is_read_from_the_training_arguments(tmp_path: Path) -> None:
    args = arguments.parse(
        ["--output_dir", str(tmp_path), "--overwrite_output_dir"], TrainingArgumentsWithOverwrite, CPU
    )
    assert args.training.overwrite_output_dir and args.overwrite.overwrite_output_dir


def test_training_arguments_errors_are_one_line_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        arguments.parse(["--output_dir", str(tmp_path), "--bf16", "--fp16"], TrainingArguments, CPU)
    assert "\n" not in str(info.value) and str(info.value)


def test_shared_output_from_flag_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def save_on_each_node(argv: list[str]) -> bool:
        args = arguments.parse(["--output_dir", str(tmp_path), *argv], TrainingArguments, CPU)
        arguments.apply_cluster_defaults(argv, args)
        return args.training.save_on_each_node

    monkeypatch.delenv("GAUDI_CLUSTER_SHARED_OUTPUT", raising=False)
    assert save_on_each_node([]) is True
    assert save_on_each_node(["--shared_output"]) is False
    monkeypatch.setenv("GAUDI_CLUSTER_SHARED_OUTPUT", "1")
    assert save_on_each_node([]) is False
    monkeypatch.setenv("GAUDI_CLUSTER_SHARED_OUTPUT", "0")
    assert save_on_each_node([]) is True


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), ("True", True), ("yes", True), ("on", True),
     ("", False), ("  ", False), ("0", False), ("false", False), ("OFF", False), ("no", False)],
)  # fmt: skip
def test_env_switch_reads_the_one_word_set(value: str, on: bool) -> None:
    assert device.env_true("X", {"X": value}) is on
    assert device.env_true("X", {}) is False


def test_env_switch_refuses_other_words() -> None:
    with pytest.raises(UsageError, match=r"X='maybe' must be one of 1/0"):
        device.env_true("X", {"X": "maybe"})


def test_run_defaults_are_added_before_parsing() -> None:
    argv = command_line.with_run_defaults(["--deepspeed=ds_cpu", "--do_train"], CPU)
    assert argv[0] == f"--deepspeed={command_line.CONFIG_DIR / 'ds_cpu.json'}"
    assert argv[1:] == ["--do_train", "--report_to", "none", "--use_cpu"]
    cuda = device.DeviceChoice("cuda", False)
    assert command_line.with_run_defaults(["--report_to", "tensorboard"], cuda) == [
        "--report_to",
        "tensorboard",
    ]
    assert command_line.with_run_defaults(["--deepspeed", "{}"], cuda)[:2] == ["--deepspeed", "{}"]


def test_the_gaudi_stack_on_cpu_leaves_out_what_gaudi_training_arguments_refuses_off_hpu() -> None:
    gaudi_cpu = device.DeviceChoice("cpu", True)
    argv = ["--gaudi_config_name", "/c/gaudi_config.json", "--do_train", "--gaudi_config_name=x"]
    assert command_line.with_run_defaults(argv, gaudi_cpu) == [
        "--do_train", "--report_to", "none", "--use_cpu", "--use_lazy_mode", "false",
    ]  # fmt: skip
    given = command_line.with_run_defaults(["--use_lazy_mode", "true"], gaudi_cpu)
    assert given.count("--use_lazy_mode") == 1
    # On an HPU the flags stay for GaudiTrainingArguments.
    hpu = device.DeviceChoice("hpu", True)
    assert command_line.with_run_defaults(["--gaudi_config_name", "Habana/gpt2"], hpu)[:2] == [
        "--gaudi_config_name",
        "Habana/gpt2",
    ]


def test_the_gaudi_stack_on_cpu_is_a_switch(monkeypatch) -> None:
    monkeypatch.setenv(device.GAUDI_STACK_ON_CPU, "1")
    assert device.choose(["--do_train"]) == device.DeviceChoice("cpu", True)
    with pytest.raises(UsageError, match="drop one"):
        device.choose(["--use_habana"])
    monkeypatch.setenv(device.GAUDI_STACK_ON_CPU, "0")
    assert device.choose(["--do_train"]).gaudi is False


def test_the_native_trainer_is_transformers_own_on_the_hpu(monkeypatch) -> None:
    monkeypatch.setenv(device.GAUDI_STACK_ON_CPU, "1")
    assert device.choose(["--trainer", "native"]) == device.DeviceChoice("cpu", False, True)
    monkeypatch.setenv(device.GAUDI_STACK_ON_CPU, "0")
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    monkeypatch.setattr(device, "habana_present", lambda: True)
    assert device.choose(["--use_habana", "--trainer", "native"]) == device.DeviceChoice("hpu", False, True)
    # transformers' Trainer makes no mark_step calls: eager unless lazy mode is asked for.
    assert os.environ["PT_HPU_LAZY_MODE"] == "0"
    assert device.training_stack(device.DeviceChoice("hpu", False, True)) == (TrainingArguments, Trainer)
    monkeypatch.setattr(device, "habana_present", lambda: False)
    with pytest.raises(UsageError, match="--use_habana --trainer native given but no Gaudi HPU"):
        device.choose(["--use_habana", "--trainer=native"])
    with pytest.raises(UsageError, match="--trainer fast: use one of gaudi, native"):
        device.choose(["--trainer", "fast"])
    # Without --use_habana the flag changes nothing: transformers' Trainer is what runs anyway.
    assert device.choose(["--trainer", "native"]).gaudi is False


def test_unknown_deepspeed_config_names_the_bundled_ones() -> None:
    with pytest.raises(UsageError, match=r"--deepspeed nope: no such file; .*ds_cpu\.json"):
        command_line.resolve_config_file("nope", "--deepspeed")


def test_json_arguments_file_becomes_flags(tmp_path: Path) -> None:
    spec = {"do_train": True, "plot": False, "max_steps": 3, "learning_rate": 1e-3, "report_to": ["none"],
            "cache_dir": None, "deepspeed": {"train_batch_size": "auto"}, "output_dir": "out"}  # fmt: skip
    path = tmp_path / "args.json"
    path.write_text(json.dumps(spec))
    assert command_line.argv_from_json_file([str(path)]) == [
        "--do_train", "true", "--plot", "false", "--max_steps", "3", "--learning_rate", "0.001",
        "--report_to", "none", "--deepspeed", '{"train_batch_size": "auto"}', "--output_dir", "out",
    ]  # fmt: skip
    assert command_line.argv_from_json_file(["--output_dir", "x.json"]) == ["--output_dir", "x.json"]


def test_json_arguments_file_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UsageError, match=r"broken\.json: .*fix: give a JSON file"):
        command_line.argv_from_json_file([str(broken)])
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(UsageError, match=r"list\.json: not a JSON object"):
        command_line.argv_from_json_file([str(listed)])


def test_rewrite_argv_replaces_both_spellings() -> None:
    assert command_line.rewrite_argv(["--a", "1", "--ds", "x", "--ds=y"], "ds", "z") == [
        "--a", "1", "--ds", "z", "--ds=z",
    ]  # fmt: skip


def test_config_file_without_model_type_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps({"n_layer": 2}))
    with pytest.raises(UsageError, match='no "model_type"'):
        model.config_from_file(bad, str(bad))
    bad.write_text("{nope")
    with pytest.raises(UsageError, match=r"--config_name .*cfg\.json: "):
        model.config_from_file(bad, str(bad))


def test_bundled_config_by_name_and_block_size_limit() -> None:
    @dataclass
    class Names:
        config_name: str | None = "tiny-gpt2"
        model_name_or_path: str | None = None
        cache_dir: str | None = None
        model_revision: str = "main"
        token: str | None = None
        trust_remote_code: bool = False
        block_size: int | None = None

    @dataclass
    class Training:
        gradient_checkpointing: bool = True

    config = model.load_config(Names(), Training())
    assert config.model_type == "gpt2" and config.use_cache is False
    ctx = model.context_length(config)
    assert model.choose_block_size(Names(block_size=ctx), config, tokenizer=None) == ctx
    with pytest.raises(UsageError, match=f"use --block_size {ctx} or less"):
        model.choose_block_size(Names(block_size=ctx + 1), config, tokenizer=None)


def test_start_event_comes_before_heavy_imports(tmp_path: Path) -> None:
    """Importing the script prints the start event with neither torch nor transformers loaded."""
    code = (
        "import sys; import train.run_clm; "
        "print('heavy:', sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(APP), "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith('gaudi-cluster-event {"event": "start"'), done.stdout
    assert lines[-1] == "heavy: []"


def test_json_arguments_file_runs_like_flags(
    train_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``run_clm.py ARGS.json`` reaches the same checks as the flags (here: a missing --train_file)."""
    from train import run_clm

    for key, value in train_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    spec = {"do_train": True, "train_file": "missing.txt", "output_dir": str(tmp_path / "out")}
    (tmp_path / "args.json").write_text(json.dumps(spec))
    rc = run_clm.main(["args.json"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run_clm: error:")]
    assert rc == 2
    assert errors == [
        "run_clm: error: --train_file missing.txt: no such file; give an existing .txt/.json/.csv file"
    ]
