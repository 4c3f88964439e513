"""The train and evaluation splits of a run, as blocks of ``block_size`` tokens.

With no data named, the embedded corpus (``train.data``) is used: its pre-tokenized streams when the
tokenizer is the embedded one, else its text files, tokenized like any local file. Named data (hub dataset
or local files) is loaded, tokenized and grouped as upstream run_clm does. ``--max_train_samples`` and
``--max_eval_samples`` cut the splits; an empty split is a UsageError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from train import data
from train.errors import UsageError


def names_data(data_args: Any) -> bool:
    return bool(data_args.dataset_name or data_args.train_file or data_args.validation_file)


def needs_embedded_data(model_args: Any, data_args: Any) -> bool:
    """The run uses the embedded tokenizer or the embedded corpus."""
    embedded_tokenizer = model_args.tokenizer_name is None and model_args.model_name_or_path is None
    return embedded_tokenizer or not names_data(data_args)


def is_embedded_tokenizer(tokenizer: Any, embedded_dir: Path) -> bool:
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast.from_pretrained(str(embedded_dir / "tokenizer"))
    return len(tokenizer) == len(ref) and tokenizer.get_vocab() == ref.get_vocab()


def build(
    model_args: Any,
    data_args: Any,
    training_args: Any,
    tokenizer: Any,
    block_size: int,
    embedded_dir: Path | None,
) -> tuple[Any, Any]:
    """(train split or None, evaluation split or None), as ``--do_train`` / ``--do_eval`` ask."""
    pretokenized = False
    if embedded_dir is not None and not names_data(data_args):
        embedded_tokenizer = model_args.tokenizer_name is None and model_args.model_name_or_path is None
        pretokenized = embedded_tokenizer or is_embedded_tokenizer(tokenizer, embedded_dir)
    if pretokenized:
        assert embedded_dir is not None
        train_ds = data.default_blocks(embedded_dir, "train", block_size) if training_args.do_train else None
        eval_ds = (
            data.default_blocks(embedded_dir, "validation", block_size) if training_args.do_eval else None
        )
    else:
        if not names_data(
            data_args
        ):  # embedded text with another tokenizer: same loading code as local files
            assert embedded_dir is not None
            data_args.train_file = str(embedded_dir / "train.txt")
            data_args.validation_file = str(embedded_dir / "validation.txt")
        raw = data.load_raw_datasets(data_args, model_args.cache_dir)
        lm = data.tokenize_and_group(raw, tokenizer, block_size, training_args, data_args)
        train_ds = lm["train"] if training_args.do_train and "train" in lm else None
        eval_ds = lm["validation"] if training_args.do_eval and "validation" in lm else None
        if training_args.do_train and train_ds is None:
            raise UsageError("--do_train needs training data: give --train_file or --dataset_name")
        if training_args.do_eval and eval_ds is None:
            raise UsageError("--do_eval needs validation data: give --validation_file or --dataset_name")
    if train_ds is not None and data_args.max_train_samples is not None:
        train_ds = take(train_ds, data_args.max_train_samples)
    if eval_ds is not None and data_args.max_eval_samples is not None:
        eval_ds = take(eval_ds, data_args.max_eval_samples)
    for split, ds in (("train", train_ds), ("validation", eval_ds)):
        if ds is not None and len(ds) == 0:
            raise UsageError(f"the {split} data holds fewer than --block_size {block_size} tokens; use less")
    return train_ds, eval_ds


def take(ds: Any, n: int) -> Any:
    """The first ``n`` samples."""
    if isinstance(ds, data.BlockDataset):
        return data.BlockDataset(ds.blocks[: max(0, n)])
    return ds.select(range(min(n, len(ds))))
