"""The model, its config and its tokenizer (as upstream run_clm loads them, plus the embedded defaults).

* config: ``--config_name`` (a hub name, a directory, or a JSON file, also one of ``train/configs/``), else
  the model's, else the embedded tiny GPT-2 (``configs/tiny-gpt2.json``);
* tokenizer: ``--tokenizer_name``, else the model's, else the embedded one (``train.data``);
* model: ``--model_name_or_path`` loaded, else a fresh one from the config; embeddings grow to the
  tokenizer's vocabulary when it is larger.

Hub and file errors become one-line UsageErrors naming the flag.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from train.command_line import DEFAULT_MODEL_CONFIG, find_config_file
from train.errors import UsageError, first_line


def config_from_file(path: Path, name: str) -> Any:
    """A config from a config.json-style file (its ``model_type`` names the class)."""
    from transformers import AutoConfig

    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--config_name {name}: {first_line(exc)}") from exc
    if not isinstance(spec, dict) or "model_type" not in spec:
        raise UsageError(f'--config_name {name}: no "model_type" in it; give a config.json of a causal LM')
    spec.pop("architectures", None)
    try:
        return AutoConfig.for_model(spec.pop("model_type"), **spec)
    except ValueError as exc:  # an unknown model_type
        raise UsageError(f"--config_name {name}: {first_line(exc)}") from exc


def load_config(model_args: Any, training_args: Any) -> Any:
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
    config = None
    if name is not None and not os.path.isdir(name):
        path = find_config_file(name)
        if path is not None:
            config = config_from_file(path, name)
    if config is None:
        flag = "--config_name" if name is not None else "--model_name_or_path"
        source = name if name is not None else model_args.model_name_or_path
        try:
            config = AutoConfig.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{flag} {source}: {first_line(exc)}") from exc
    if training_args.gradient_checkpointing:
        config.use_cache = False
    return config


def load_tokenizer(model_args: Any, embedded_dir: Path | None) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is None:
        assert embedded_dir is not None
        return PreTrainedTokenizerFast.from_pretrained(str(embedded_dir / "tokenizer"))
    try:
        return AutoTokenizer.from_pretrained(
            name,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            token=model_args.token,
            trust_remote_code=model_args.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"tokenizer {name}: {first_line(exc)}") from exc


def context_length(config: Any) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def choose_block_size(data_args: Any, config: Any, tokenizer: Any) -> int:
    """--block_size (at most the context length), else the smallest of 1024, the context and the tokenizer's
    maximum length."""
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


def load_model(model_args: Any, config: Any, tokenizer: Any) -> Any:
    import transformers
    from transformers import AutoModelForCausalLM

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

            dtype = model_args.torch_dtype
            if dtype != "auto":
                dtype = getattr(torch, dtype)
            major = int(transformers.__version__.split(".")[0])
            kwargs["dtype" if major >= 5 else "torch_dtype"] = dtype  # transformers 5 renamed it
        try:
            model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path}: {first_line(exc)}"
            ) from exc
    else:
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_args.trust_remote_code)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    return model


def count_parameters(model: Any) -> int:
    """Parameters, tied ones counted once."""
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
