"""What run_clm's command line means: the argument dataclasses, their parsing and their validation.

Parsing is transformers' ``HfArgumentParser`` over ``ModelArguments``, ``DataTrainingArguments``,
``ClusterArguments`` (gaudi-cluster's own flags) and the stack's ``TrainingArguments`` class
(``GaudiTrainingArguments`` on Gaudi, see ``train.device``), plus two groups of flags that some of those
classes declare and others lack, so that one command line parses everywhere:

* ``OverwriteArguments`` (``--overwrite_output_dir``): transformers 4 declares it, transformers 5 dropped it;
* ``HabanaArguments`` (``--use_habana`` ...): ``GaudiTrainingArguments`` declares them, off Gaudi they are
  accepted for compatibility with optimum-habana's commands.

argparse refuses a flag declared twice, so a group whose names the TrainingArguments class declares is left
to it and its values are read from there (``parser_classes``, ``parse``). Only the standard library is
imported at module level: transformers comes in with the parser.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from train import checkpoints, device
from train.command_line import with_run_defaults
from train.data import check_data_file
from train.errors import UsageError, first_line

log = logging.getLogger("train.arguments")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer (all optional: the embedded tiny GPT-2 is the default)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Model to fine-tune (hub name or local dir); none: train from scratch."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "Config name or path (also a file name in train/configs/); default tiny-gpt2."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer name or path; default: the model's, else the embedded one."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Hub revision (branch, tag or commit)."})
    token: str | None = field(default=None, metadata={"help": "Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the hub."})
    torch_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Load the model in this dtype.",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    low_cpu_mem_usage: bool = field(default=False, metadata={"help": "Create the model empty, then load."})


@dataclass
class DataTrainingArguments:
    """Which data (none named: the embedded offline corpus)."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (datasets library)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data (.txt, .json, .csv)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data (.txt/.json/.csv)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the train blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the eval blocks."})
    block_size: int | None = field(
        default=None, metadata={"help": "Tokens per training block (at most the model's context length)."}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo tokenization."})
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Percent of train used for validation when there is no validation split."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Tokenization processes."})
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks of .txt files."})
    save_last_ckpt: bool = field(default=True, metadata={"help": "Save the final model into output_dir."})


@dataclass
class OverwriteArguments:
    """Start afresh instead of resuming (transformers 5 dropped the flag; its meaning is kept here)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start afresh: remove this output_dir's checkpoints (a job's first attempt only)."},
    )


@dataclass
class ClusterArguments:
    """gaudi-cluster's own flags."""

    shared_output: bool = field(
        default=False, metadata={"help": "Nodes share --output_dir (env GAUDI_CLUSTER_SHARED_OUTPUT=1 too)."}
    )
    peak_tflops: float | None = field(
        default=None, metadata={"help": "Peak TFLOP/s per device for the MFU estimate."}
    )
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png into output_dir."})
    trainer: str = field(
        default="gaudi",
        metadata={
            "help": "With --use_habana: gaudi (optimum-habana's GaudiTrainer) or native (transformers' own).",
            "choices": list(device.TRAINERS),
        },
    )


@dataclass
class HabanaArguments:
    """optimum-habana's flags, for the stacks whose TrainingArguments lacks them (all but Gaudi's)."""

    use_habana: bool = field(
        default=False, metadata={"help": "Run on Gaudi HPUs (needs habana_frameworks and a device)."}
    )
    use_lazy_mode: bool = field(default=False, metadata={"help": "Gaudi lazy mode (ignored off Gaudi)."})
    gaudi_config_name: str | None = field(
        default=None, metadata={"help": "GaudiConfig name or path (ignored off Gaudi)."}
    )
    throughput_warmup_steps: int = field(
        default=0, metadata={"help": "Steps left out of the throughput numbers."}
    )
    adjust_throughput: bool = field(
        default=False,
        metadata={"help": "Gaudi: leave logging/eval/save time out of throughput (ignored here)."},
    )


# The flag groups that a TrainingArguments class may declare itself.
SHARED_GROUPS = (OverwriteArguments, HabanaArguments)


@dataclass(frozen=True)
class Arguments:
    """One run's parsed arguments; every group is present whichever dataclass parsed its flags."""

    model: ModelArguments
    data: DataTrainingArguments
    overwrite: OverwriteArguments
    cluster: ClusterArguments
    habana: HabanaArguments
    training: Any  # the stack's TrainingArguments


def field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def declared_groups(training_cls: type) -> set[type]:
    """The SHARED_GROUPS whose flags ``training_cls`` declares itself."""
    have = field_names(training_cls)
    declared = set()
    for group in SHARED_GROUPS:
        names = field_names(group)
        if names <= have:
            declared.add(group)
        elif names & have:
            raise RuntimeError(
                f"{training_cls.__name__} declares only {sorted(names & have)} of {group.__name__}; "
                "fix: install the optimum-habana / transformers versions of the image"
            )
    return declared


def parser_classes(training_cls: type) -> tuple[type, ...]:
    """The dataclasses for HfArgumentParser, each flag declared once."""
    declared = declared_groups(training_cls)
    ours = [
        group for group in (OverwriteArguments, ClusterArguments, HabanaArguments) if group not in declared
    ]
    return (ModelArguments, DataTrainingArguments, *ours, training_cls)


def parse(argv: list[str], training_cls: type, choice: device.DeviceChoice) -> Arguments:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(parser_classes(training_cls))
    try:
        parsed = parser.parse_args_into_dataclasses(args=with_run_defaults(argv, choice))
    except ValueError as exc:  # __post_init__ checks of TrainingArguments
        raise UsageError(first_line(exc)) from exc
    by_class = {type(obj): obj for obj in parsed}
    training_args = parsed[-1]

    def group(cls: type) -> Any:
        if cls in by_class:
            return by_class[cls]
        return cls(**{name: getattr(training_args, name) for name in field_names(cls)})

    return Arguments(
        model=by_class[ModelArguments],
        data=by_class[DataTrainingArguments],
        overwrite=group(OverwriteArguments),
        cluster=by_class[ClusterArguments],
        habana=group(HabanaArguments),
        training=training_args,
    )


def validate(args: Arguments) -> None:
    """Bad input -> UsageError, before anything heavy happens; no --do_train/--do_eval means train."""
    data_args, training_args = args.data, args.training
    if not training_args.do_train and not training_args.do_eval:
        log.info("neither --do_train nor --do_eval given: training")
        training_args.do_train = True
    check_data_file(data_args.train_file, "--train_file")
    check_data_file(data_args.validation_file, "--validation_file")
    if (
        data_args.dataset_name is None
        and training_args.do_train
        and data_args.validation_file
        and not data_args.train_file
    ):
        raise UsageError("--do_train with only --validation_file: give --train_file too")
    if data_args.block_size is not None and data_args.block_size <= 0:
        raise UsageError(f"--block_size {data_args.block_size}: must be a positive number of tokens")
    if training_args.resume_from_checkpoint:
        try:
            checkpoints.resolve_explicit(training_args.resume_from_checkpoint)
        except FileNotFoundError as exc:
            raise UsageError(f"{exc}; give a checkpoint-N directory or drop the flag") from exc


def apply_cluster_defaults(argv: list[str], args: Arguments) -> None:
    """TrainingArguments settings for a cluster job that do not change results."""
    training_args = args.training
    shared = args.cluster.shared_output or device.env_true("GAUDI_CLUSTER_SHARED_OUTPUT")
    object.__setattr__(training_args, "save_on_each_node", not shared)
    if device.flag_value(argv, "disable_tqdm") is None and not sys.stderr.isatty():
        training_args.disable_tqdm = True
    if (
        training_args.dataloader_num_workers > 0
        and hasattr(training_args, "dataloader_multiprocessing_context")
        and not training_args.dataloader_multiprocessing_context
    ):
        training_args.dataloader_multiprocessing_context = "spawn"
