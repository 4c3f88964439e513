#!/usr/bin/env python
"""Causal-LM training and evaluation for gaudi-cluster (run_clm-style; Gaudi, CUDA or CPU).

Accepts the flags of optimum-habana's ``examples/language-modeling/run_clm.py`` (the seed's commands
run verbatim on Gaudi; elsewhere drop ``--use_habana``). Parsing is transformers' ``HfArgumentParser``
over ``ModelArguments``, ``DataTrainingArguments``, ``ClusterArguments`` and the stack's
``TrainingArguments`` (``GaudiTrainingArguments`` on Gaudi; see ``train.device``).

Defaults: with no model and no data named, a small GPT-2 (``configs/tiny-gpt2.json``) is trained from
scratch on the embedded offline corpus and tokenizer (``train.data``). With neither ``--do_train`` nor
``--do_eval`` the run trains. ``--deepspeed NAME`` also finds ``NAME``/``NAME.json`` in ``configs/``.

Non-standard flags (``ClusterArguments``):
  --overwrite_output_dir   ignore and remove this output_dir's checkpoints (kept in transformers 5, which
                           dropped the flag) instead of resuming from them
  --shared_output          nodes share --output_dir (also env GAUDI_CLUSTER_SHARED_OUTPUT=1); default:
                           every node keeps its own copy of checkpoints and the final model
                           (save_on_each_node=True)
  --peak_tflops X          peak TFLOP/s per device for the MFU estimate (default from the device kind)
  --plot / --no_plot       write training_curves.png (default on)
  off Gaudi only, accepted for compatibility: --use_habana false, --use_lazy_mode, --gaudi_config_name,
  --throughput_warmup_steps (used), --adjust_throughput

Evaluation is single-node. ``--do_eval`` in a job whose ranks span more than one host (``CROSS_SIZE``>1
from DeepSpeed's launcher, or ``WORLD_SIZE`` differing from ``LOCAL_WORLD_SIZE``/``LOCAL_SIZE``) is refused
with exit code 2 and a message giving the single-node command, as the optimum-habana guide advises
(multi-node inference "can provide inconsistent results"): train across nodes, then evaluate the saved
``--output_dir`` on one node.

Checkpoints are atomic (``train.checkpoints``); a run whose --output_dir holds complete checkpoints resumes
from the newest one all ranks have (unless --overwrite_output_dir). SIGTERM/SIGINT: every rank finishes
the current step, a checkpoint is saved, and the process exits 143/130.

Exit codes: 0 ok, 1 runtime failure, 2 bad input (one line naming the culprit and the fix),
128+N stopped by signal N.
"""

from __future__ import annotations

import time

_T_START = time.time()

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field, fields, make_dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):  # run as a file: make the `train` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from train.events import emit  # noqa: E402

emit("start", t=_T_START, pid=os.getpid())

from train import device as devmod  # noqa: E402
from train.errors import UsageError  # noqa: E402

log = logging.getLogger("train.run_clm")
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_MODEL_CONFIG = CONFIG_DIR / "tiny-gpt2.json"


# ---------------------------------------------------------------- arguments


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


# (name, type, default, help): ours, plus the Habana flags that must parse off Gaudi. Fields the stack's
# TrainingArguments already has are left out (GaudiTrainingArguments has the Habana ones; transformers 4
# still has overwrite_output_dir).
_EXTRA_FIELDS: list[tuple[str, Any, Any, str]] = [
    ("overwrite_output_dir", bool, False, "Start afresh: remove this output_dir's checkpoints."),
    ("shared_output", bool, False, "Nodes share --output_dir (env GAUDI_CLUSTER_SHARED_OUTPUT=1 too)."),
    ("peak_tflops", float | None, None, "Peak TFLOP/s per device for the MFU estimate."),
    ("plot", bool, True, "Write training_curves.png into output_dir."),
    ("use_habana", bool, False, "Run on Gaudi HPUs (needs habana_frameworks and a device)."),
    ("use_lazy_mode", bool, False, "Gaudi lazy mode (ignored off Gaudi)."),
    ("gaudi_config_name", str | None, None, "GaudiConfig name or path (ignored off Gaudi)."),
    ("throughput_warmup_steps", int, 0, "Steps left out of the throughput numbers."),
    (
        "adjust_throughput",
        bool,
        False,
        "Gaudi: leave logging/eval/save time out of throughput (ignored here).",
    ),
]


def cluster_arguments_class(training_args_cls: type) -> type:
    have = {f.name for f in fields(training_args_cls)}
    spec = [
        (name, typ, field(default=default, metadata={"help": help_}))
        for name, typ, default, help_ in _EXTRA_FIELDS
        if name not in have
    ]
    return make_dataclass("ClusterArguments", spec)


def resolve_config_file(value: str, flag: str) -> str:
    """A path to an existing file; bare names are also looked up in train/configs/."""
    if value.lstrip().startswith("{"):
        return value
    for cand in (Path(value), CONFIG_DIR / value, CONFIG_DIR / f"{value}.json"):
        if cand.is_file():
            return str(cand)
    raise UsageError(f"{flag} {value}: no such file; give a JSON config path (bundled: {bundled_configs()})")


def bundled_configs() -> str:
    return ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.json")))


def rewrite_argv(argv: list[str], name: str, value: str) -> list[str]:
    out, flag, skip = [], f"--{name}", False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok == flag and i + 1 < len(argv):
            out += [flag, value]
            skip = True
        elif tok.startswith(flag + "="):
            out.append(f"{flag}={value}")
        else:
            out.append(tok)
    return out


def spans_hosts(env: dict[str, str]) -> int:
    """Number of hosts the job spans (1 when it cannot tell)."""

    def num(name: str) -> int | None:
        value = env.get(name, "").strip()
        return int(value) if value.isdigit() else None

    cross = num("CROSS_SIZE") or num("GROUP_WORLD_SIZE")
    if cross and cross > 1:
        return cross
    world = num("WORLD_SIZE") or num("OMPI_COMM_WORLD_SIZE")
    local = num("LOCAL_WORLD_SIZE") or num("LOCAL_SIZE") or num("OMPI_COMM_WORLD_LOCAL_SIZE")
    if world and local and world != local:
        return max(2, -(-world // local))
    return 1


def eval_command(argv: list[str], gaudi: bool) -> str:
    """The single-node evaluation command matching a training command line."""
    out = devmod.flag_value(argv, "output_dir") or "OUTPUT_DIR"
    parts = ["python -m train.run_clm", "--model_name_or_path", out]
    for flag in ("dataset_name", "dataset_config_name", "validation_file", "block_size"):
        value = devmod.flag_value(argv, flag)
        if value is not None:
            parts += [f"--{flag}", value]
    parts += ["--do_eval", "--output_dir", out]
    parts += ["--per_device_eval_batch_size", devmod.flag_value(argv, "per_device_eval_batch_size") or "8"]
    if gaudi:
        parts += ["--use_habana", "--use_lazy_mode"]
        if devmod.flag_value(argv, "gaudi_config_name"):
            parts += ["--gaudi_config_name", str(devmod.flag_value(argv, "gaudi_config_name"))]
    return " ".join(parts)


def refuse_multi_host_eval(argv: list[str], gaudi: bool) -> None:
    """--do_eval in a job spanning hosts -> UsageError (checked before parsing, which may set up
    the process group)."""
    hosts = spans_hosts(dict(os.environ))
    if devmod.flag_true(argv, "do_eval") and hosts > 1:
        raise UsageError(
            f"--do_eval refused: this job spans {hosts} hosts and evaluation is single-node; train without "
            "--do_eval, then on one node run: " + eval_command(argv, gaudi)
        )


def parse(argv: list[str], choice: devmod.DeviceChoice) -> tuple[Any, Any, Any, Any, type]:
    training_cls, trainer_cls = devmod.training_stack(choice)
    emit("imports_done")
    from transformers import HfArgumentParser

    ds = devmod.flag_value(argv, "deepspeed")
    if ds is not None:
        argv = rewrite_argv(argv, "deepspeed", resolve_config_file(ds, "--deepspeed"))
    if devmod.flag_value(argv, "report_to") is None:
        argv = [*argv, "--report_to", "none"]
    if choice.kind == "cpu" and devmod.flag_value(argv, "use_cpu") is None:
        # accelerate only sets up a CPU process group (gloo) when told it is on CPU, DeepSpeed included
        argv = [*argv, "--use_cpu"]
    extra_cls = cluster_arguments_class(training_cls)
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, extra_cls, training_cls))
    if len(argv) == 1 and argv[0].endswith(".json"):
        parsed = parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    else:
        try:
            parsed = parser.parse_args_into_dataclasses(args=argv)
        except ValueError as exc:  # __post_init__ checks of TrainingArguments
            raise UsageError(str(exc).strip().splitlines()[0]) from exc
    model_args, data_args, extra, training_args = parsed
    # ClusterArguments fields that the TrainingArguments class has live there: read them uniformly
    for name, _typ, default, _help in _EXTRA_FIELDS:
        if not hasattr(extra, name):
            setattr(extra, name, getattr(training_args, name, default))
    return model_args, data_args, extra, training_args, trainer_cls


def validate(
    argv: list[str],
    model_args: Any,
    data_args: Any,
    extra: Any,
    training_args: Any,
    choice: devmod.DeviceChoice,
) -> None:
    """Bad input -> UsageError, before anything heavy happens."""
    from train.data import check_data_file

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
        from train import checkpoints

        try:
            checkpoints.resolve_explicit(training_args.resume_from_checkpoint)
        except FileNotFoundError as exc:
            raise UsageError(f"{exc}; give a checkpoint-N directory or drop the flag") from exc


def adjust_training_args(argv: list[str], extra: Any, training_args: Any) -> None:
    """Cluster defaults that do not change results."""
    shared = extra.shared_output or os.environ.get("GAUDI_CLUSTER_SHARED_OUTPUT", "") in ("1", "true", "yes")
    object.__setattr__(training_args, "save_on_each_node", not shared)
    if devmod.flag_value(argv, "disable_tqdm") is None and not sys.stderr.isatty():
        training_args.disable_tqdm = True
    if (
        training_args.dataloader_num_workers > 0
        and hasattr(training_args, "dataloader_multiprocessing_context")
        and not training_args.dataloader_multiprocessing_context
    ):
        training_args.dataloader_multiprocessing_context = "spawn"


# ---------------------------------------------------------------- model, tokenizer, data


def load_config(model_args: Any, training_args: Any) -> tuple[Any, bool]:
    """(config, is_embedded_default)."""
    from transformers import AutoConfig

    kwargs = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    name = model_args.config_name
    if name is None and model_args.model_name_or_path is None:
        name = str(DEFAULT_MODEL_CONFIG)
    embedded = False
    if name is not None and not os.path.isdir(name):
        path = None
        for cand in (Path(name), CONFIG_DIR / name, CONFIG_DIR / f"{name}.json"):
            if cand.is_file():
                path = cand
                break
        if path is not None:
            spec = json.loads(path.read_text())
            spec.pop("architectures", None)
            config = AutoConfig.for_model(spec.pop("model_type"), **spec)
            embedded = path.resolve() == DEFAULT_MODEL_CONFIG.resolve()
            name = None
    if name is not None:
        try:
            config = AutoConfig.from_pretrained(name, **kwargs)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--config_name {name}: {str(exc).strip().splitlines()[0]}") from exc
    elif model_args.model_name_or_path and model_args.config_name is None:
        try:
            config = AutoConfig.from_pretrained(model_args.model_name_or_path, **kwargs)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path}: {str(exc).strip().splitlines()[0]}"
            ) from exc
    if training_args.gradient_checkpointing:
        config.use_cache = False
    return config, embedded


def load_tokenizer(model_args: Any, default_dir: Path | None) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is None:
        assert default_dir is not None
        return PreTrainedTokenizerFast.from_pretrained(str(default_dir / "tokenizer"))
    try:
        return AutoTokenizer.from_pretrained(
            name,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            token=model_args.token,
            trust_remote_code=model_args.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"tokenizer {name}: {str(exc).strip().splitlines()[0]}") from exc


def context_length(config: Any) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def choose_block_size(data_args: Any, config: Any, tokenizer: Any) -> int:
    ctx = context_length(config)
    if data_args.block_size is not None:
        if ctx is not None and data_args.block_size > ctx:
            raise UsageError(
                f"--block_size {data_args.block_size} is larger than the model's context length {ctx}; "
                f"use --block_size {ctx} or less"
            )
        return data_args.block_size
    candidates = [1024, ctx or 1024]
    if getattr(tokenizer, "model_max_length", None) and tokenizer.model_max_length < 10**9:
        candidates.append(tokenizer.model_max_length)
    return min(candidates)


def is_default_tokenizer(tokenizer: Any, default_dir: Path) -> bool:
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast.from_pretrained(str(default_dir / "tokenizer"))
    return len(tokenizer) == len(ref) and tokenizer.get_vocab() == ref.get_vocab()


def build_datasets(
    model_args: Any,
    data_args: Any,
    training_args: Any,
    tokenizer: Any,
    block_size: int,
    default_dir: Path | None,
    tokenizer_is_default: bool,
) -> tuple[Any, Any]:
    from train import data as datamod

    named = data_args.dataset_name or data_args.train_file or data_args.validation_file
    if not named and tokenizer_is_default:
        assert default_dir is not None
        train_ds = (
            datamod.default_blocks(default_dir, "train", block_size) if training_args.do_train else None
        )
        eval_ds = (
            datamod.default_blocks(default_dir, "validation", block_size) if training_args.do_eval else None
        )
    else:
        if not named:  # embedded text with another tokenizer: same loading code as local files
            assert default_dir is not None
            data_args.train_file = str(default_dir / "train.txt")
            data_args.validation_file = str(default_dir / "validation.txt")
        raw = datamod.load_raw_datasets(data_args, model_args.cache_dir)
        lm = datamod.tokenize_and_group(raw, tokenizer, block_size, training_args, data_args)
        train_ds = lm["train"] if training_args.do_train and "train" in lm else None
        eval_ds = lm["validation"] if training_args.do_eval and "validation" in lm else None
        if training_args.do_train and train_ds is None:
            raise UsageError("--do_train needs training data: give --train_file or --dataset_name")
        if training_args.do_eval and eval_ds is None:
            raise UsageError("--do_eval needs validation data: give --validation_file or --dataset_name")
    if train_ds is not None and data_args.max_train_samples is not None:
        train_ds = _take(train_ds, data_args.max_train_samples)
    if eval_ds is not None and data_args.max_eval_samples is not None:
        eval_ds = _take(eval_ds, data_args.max_eval_samples)
    for split, ds in (("train", train_ds), ("validation", eval_ds)):
        if ds is not None and len(ds) == 0:
            raise UsageError(f"the {split} data holds fewer than --block_size {block_size} tokens; use less")
    return train_ds, eval_ds


def _take(ds: Any, n: int) -> Any:
    from train.data import BlockDataset

    if isinstance(ds, BlockDataset):
        return BlockDataset(ds.blocks[: max(0, n)])
    return ds.select(range(min(n, len(ds))))


# ---------------------------------------------------------------- resume


def dist_info(training_args: Any) -> tuple[bool, Any]:
    """(distributed with >1 rank, device for small collectives) — initializes the process group."""
    _ = training_args.device  # sets up accelerate / DeepSpeed / torch.distributed
    import torch
    import torch.distributed as dist

    ready = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not ready:
        return False, None
    coll = torch.device("cpu") if dist.get_backend() == "gloo" else training_args.device
    return True, coll


def refresh_deepspeed_config(training_args: Any) -> None:
    """Refill DeepSpeed's "auto" values once the world size is known.

    transformers 5 fills them in TrainingArguments.__post_init__, before the process group exists, so an
    "auto" train_batch_size comes out as if world_size were 1 and DeepSpeed's batch check fails.
    """
    hf_ds = getattr(training_args, "hf_deepspeed_config", None)
    if not training_args.deepspeed or hf_ds is None:
        return
    want = (
        training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * training_args.world_size
    )
    if hf_ds.config.get("train_batch_size") in (want, None):
        return
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    fresh = HfTrainerDeepSpeedConfig(training_args.deepspeed)
    fresh.trainer_config_process(training_args)
    training_args.hf_deepspeed_config = fresh
    training_args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=fresh)


def barrier(ready: bool) -> None:
    if ready:
        import torch.distributed as dist

        dist.barrier()


def choose_checkpoint(extra: Any, training_args: Any, ready: bool, coll: Any) -> str | None:
    from train import checkpoints

    out = Path(training_args.output_dir)
    if training_args.resume_from_checkpoint:
        return str(checkpoints.resolve_explicit(training_args.resume_from_checkpoint))
    if not training_args.do_train:
        return None
    if extra.overwrite_output_dir:
        if training_args.should_save and out.is_dir():
            for _step, path in checkpoints.list_checkpoints(out):
                trash = path.with_name(f".deleting-{path.name}-{os.getpid()}")
                os.rename(path, trash)
                import shutil

                shutil.rmtree(trash, ignore_errors=True)
        barrier(ready)
        return None
    latest = checkpoints.latest_complete(out)
    step = checkpoints.agree_on_step(latest[0] if latest else -1, ready, coll)
    if step < 0:
        return None
    path = out / f"checkpoint-{step}"
    if not checkpoints.all_ranks_true(checkpoints.is_complete(path), ready, coll):
        raise UsageError(
            f"{out}: the ranks hold different complete checkpoints (newest common candidate {path.name} is "
            "missing somewhere); pass --resume_from_checkpoint or --overwrite_output_dir"
        )
    log.info("resuming from %s (newest complete checkpoint on every rank)", path)
    return str(path)


# ---------------------------------------------------------------- main


def run(argv: list[str]) -> int:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if int(os.environ.get("RANK", "0") or 0) == 0 else logging.WARNING,
        stream=sys.stderr,
    )
    choice = devmod.choose(argv)
    refuse_multi_host_eval(argv, choice.gaudi)
    model_args, data_args, extra, training_args, trainer_base = parse(argv, choice)
    devmod.note_ignored_flags(argv, choice)
    validate(argv, model_args, data_args, extra, training_args, choice)
    adjust_training_args(argv, extra, training_args)

    import transformers

    transformers.utils.logging.set_verbosity_warning()
    ready, coll = dist_info(training_args)
    refresh_deepspeed_config(training_args)
    if choice.gaudi:
        from optimum.habana.utils import set_seed  # type: ignore[import-not-found]
    else:
        from transformers import set_seed
    set_seed(training_args.seed)
    checkpoint = choose_checkpoint(extra, training_args, ready, coll)

    from train import data as datamod

    config, _embedded = load_config(model_args, training_args)
    needs_default = model_args.tokenizer_name is None and model_args.model_name_or_path is None
    named_data = data_args.dataset_name or data_args.train_file or data_args.validation_file
    default_dir = None
    if needs_default or not named_data:
        with training_args.main_process_first(local=True, desc="embedded data"):
            default_dir = datamod.ensure_default_data()
    tokenizer = load_tokenizer(model_args, default_dir)
    block_size = choose_block_size(data_args, config, tokenizer)
    tok_default = default_dir is not None and (needs_default or is_default_tokenizer(tokenizer, default_dir))
    train_ds, eval_ds = build_datasets(
        model_args, data_args, training_args, tokenizer, block_size, default_dir, tok_default
    )

    from transformers import AutoModelForCausalLM, default_data_collator

    if model_args.model_name_or_path:
        kwargs: dict[str, Any] = {
            "config": config,
            "cache_dir": model_args.cache_dir,
            "revision": model_args.model_revision,
            "token": model_args.token,
            "trust_remote_code": model_args.trust_remote_code,
            "low_cpu_mem_usage": model_args.low_cpu_mem_usage,
        }
        if model_args.torch_dtype:
            import torch

            dtype = (
                model_args.torch_dtype
                if model_args.torch_dtype == "auto"
                else getattr(torch, model_args.torch_dtype)
            )
            major = int(transformers.__version__.split(".")[0])
            kwargs["dtype" if major >= 5 else "torch_dtype"] = dtype
        try:
            model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path}: {str(exc).strip().splitlines()[0]}"
            ) from exc
    else:
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_args.trust_remote_code)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    n_params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())

    from train.callbacks import ClusterCallback, StopRequest, make_trainer_class
    from train.metrics import StepClock

    world = training_args.world_size
    global_batch = (
        training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world
    )
    clock = StepClock(warmup_steps=int(extra.throughput_warmup_steps or 0))
    stop = StopRequest()
    cb = ClusterCallback(stop, clock, global_batch, coll)
    trainer_cls = make_trainer_class(trainer_base)
    trainer = trainer_cls(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[cb],
        **devmod.gaudi_trainer_kwargs(choice, training_args, model_args.cache_dir),
    )
    trainer.cluster_log_hook = cb.augment_logs
    emit(
        "model_ready",
        params=n_params,
        world_size=world,
        device=choice.kind,
        block_size=block_size,
        resume_from=checkpoint,
    )

    out = Path(training_args.output_dir)
    rank0 = trainer.is_world_process_zero()
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=checkpoint)
        if cb.stopped_at is not None:
            log.warning("stopped by signal %s after step %d; checkpoint saved", stop.signum, cb.stopped_at)
            emit("train_stopped", step=cb.stopped_at, signal=stop.signum)
            return stop.exit_code
        if data_args.save_last_ckpt:
            trainer.save_model()
        metrics = dict(result.metrics)
        from train import metrics as metmod

        metrics.update(metmod.throughput(clock, global_batch, block_size))
        peak = devmod.peak_tflops(choice, extra.peak_tflops)
        value = metmod.mfu(n_params, metrics.get("train_tokens_per_second", 0.0), peak, world)
        if value is not None:
            metrics["mfu"] = round(value, 6)
            metrics["peak_tflops_per_device"] = peak
        metrics.update(metmod.memory_metrics(choice.kind))
        metrics["train_samples"] = len(train_ds)
        metrics["global_batch_size"] = global_batch
        metrics["world_size"] = world
        metrics["n_params"] = n_params
        metrics["global_step"] = trainer.state.global_step
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        if rank0 and extra.plot:
            metmod.plot_curves(trainer.state.log_history, out / metmod.PLOT_NAME)
        emit(
            "train_done",
            step=trainer.state.global_step,
            train_samples_per_second=metrics.get("train_samples_per_second"),
            train_loss=metrics.get("train_loss"),
        )

    if training_args.do_eval:
        from train import metrics as metmod

        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_ds)
        metrics["perplexity"] = metmod.perplexity(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        emit("eval_done", eval_loss=metrics["eval_loss"], perplexity=metrics["perplexity"])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"run_clm: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
