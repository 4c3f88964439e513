"""Embedded default data and tokenizer, and the loading of user/hub datasets.

The default corpus is the English text of Python's own ``pydoc_data.topics`` (shipped with every CPython),
so nothing is downloaded and every node builds byte-identical files:

* paragraphs are taken in sorted topic order; every 20th paragraph goes to validation, the rest to train;
* a byte-level BPE tokenizer (vocabulary ``VOCAB_SIZE``) is trained on the train text with the
  ``tokenizers`` library on one thread, and saved as a transformers fast tokenizer;
* both splits are tokenized once and stored as flat ``uint16`` token streams (``*.ids.npy``), so a run
  only has to cut them into blocks.

Everything lands in ``<data root>/default-v1`` and is written atomically (built in a temporary sibling
directory, then renamed), so a reader never sees half a data set. The data root is
``$GAUDI_CLUSTER_DATA_DIR``, else ``/opt/gaudi-cluster/data`` when it holds the data or can be written,
else ``~/.cache/gaudi-cluster/data``.

Pre-generate (the image does this at build time)::

    python -m train.data [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from train.errors import UsageError, first_line

DATASET_NAME = "default-v1"
VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"
VALIDATION_EVERY = 20
MODEL_MAX_LENGTH = 256
SYSTEM_DATA_ROOT = Path("/opt/gaudi-cluster/data")
DATA_FILE_EXTENSIONS = {"txt": "text", "text": "text", "json": "json", "jsonl": "json", "csv": "csv"}


# ---------------------------------------------------------------- where the default data lives


def _writable(path: Path) -> bool:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return os.access(probe, os.W_OK)


def data_root() -> Path:
    """The directory that holds the embedded data sets (see the module docstring)."""
    env = os.environ.get("GAUDI_CLUSTER_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if (SYSTEM_DATA_ROOT / DATASET_NAME / "meta.json").is_file() or _writable(SYSTEM_DATA_ROOT):
        return SYSTEM_DATA_ROOT
    return Path.home() / ".cache" / "gaudi-cluster" / "data"


def default_data_dir(root: Path | None = None) -> Path:
    return (root or data_root()) / DATASET_NAME


# ---------------------------------------------------------------- building it


def corpus_paragraphs() -> list[str]:
    """The corpus as paragraphs, in a fixed order."""
    from pydoc_data.topics import topics

    paragraphs: list[str] = []
    for key in sorted(topics):
        for chunk in topics[key].split("\n\n"):
            text = chunk.strip("\n")
            if text.strip():
                paragraphs.append(text)
    return paragraphs


def split_corpus(paragraphs: list[str]) -> tuple[str, str]:
    train = [p for i, p in enumerate(paragraphs) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1]
    valid = [p for i, p in enumerate(paragraphs) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1]
    return "\n\n".join(train) + "\n", "\n\n".join(valid) + "\n"


def train_tokenizer(text: str) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``text`` (deterministic: one thread)."""
    os.environ["RAYON_NUM_THREADS"] = "1"  # the BPE trainer's merge order must not depend on threads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # paragraphs as separate sequences: the counts do not depend on how the text is chunked
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return tok


def _encode_stream(tok: Any, text: str) -> Any:
    """Token ids of ``text`` as one stream: each paragraph followed by the end-of-text token."""
    import numpy as np

    eos = tok.token_to_id(EOS_TOKEN)
    ids: list[int] = []
    for enc in tok.encode_batch(text.split("\n\n")):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def _fsync_tree(path: Path) -> None:
    for sub in sorted(path.rglob("*")):
        if sub.is_file():
            with open(sub, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_default_data(root: Path | None = None, *, force: bool = False) -> Path:
    """Make ``<root>/default-v1`` if absent (atomically); return its path."""
    import numpy as np

    target = default_data_dir(root)
    if (target / "meta.json").is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DATASET_NAME}.tmp-", dir=target.parent))
    try:
        train_text, valid_text = split_corpus(corpus_paragraphs())
        (tmp / "train.txt").write_text(train_text, encoding="utf-8")
        (tmp / "validation.txt").write_text(valid_text, encoding="utf-8")
        tok = train_tokenizer(train_text)
        _save_hf_tokenizer(tok, tmp / "tokenizer")
        for split, text in (("train", train_text), ("validation", valid_text)):
            np.save(tmp / f"{split}.ids.npy", _encode_stream(tok, text))
        meta = {
            "name": DATASET_NAME,
            "source": "pydoc_data.topics",
            "python": sys.version.split()[0],
            "vocab_size": tok.get_vocab_size(),
            "eos_token": EOS_TOKEN,
            "sha256": {
                str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(tmp.rglob("*"))
                if p.is_file()
            },
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        _fsync_tree(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; other users (and later containers) read it
        if force and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "meta.json").is_file():  # somebody else won the race: theirs is as good
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_hf_tokenizer(tok: Any, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
    )
    hf_tok.save_pretrained(str(out))


def ensure_default_data() -> Path:
    """The default data directory, generated on the spot (deterministically) if it is missing."""
    root = data_root()
    target = default_data_dir(root)
    if (target / "meta.json").is_file():
        return target
    if not _writable(root):
        raise UsageError(
            f"embedded data missing at {target} and {root} is not writable; "
            "set GAUDI_CLUSTER_DATA_DIR to a writable directory or run `python -m train.data --out DIR`"
        )
    return build_default_data(root)


# ---------------------------------------------------------------- datasets for training


class BlockDataset:
    """Fixed-length blocks cut from a flat token stream; items are ``{"input_ids", "labels"}`` tensors."""

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks  # LongTensor [n, block_size]

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.blocks[i]
        return {"input_ids": row, "labels": row}


def default_blocks(data_dir: Path, split: str, block_size: int) -> BlockDataset:
    import numpy as np
    import torch

    ids = np.load(data_dir / f"{split}.ids.npy").astype(np.int64)
    n = len(ids) // block_size
    if n == 0:
        raise UsageError(
            f"--block_size {block_size} is longer than the whole {split} split ({len(ids)} tokens)"
        )
    return BlockDataset(torch.from_numpy(ids[: n * block_size].reshape(n, block_size).copy()))


def check_data_file(path: str | None, flag: str) -> str | None:
    """The `datasets` builder name for a local data file, or a UsageError naming the problem."""
    if path is None:
        return None
    ext = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if ext not in DATA_FILE_EXTENSIONS:
        raise UsageError(f"{flag} {path}: unknown file type '.{ext}'; use a .txt, .json, .jsonl or .csv file")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no such file; give an existing .txt/.json/.csv file")
    return DATA_FILE_EXTENSIONS[ext]


def load_raw_datasets(data_args: Any, cache_dir: str | None) -> Any:
    """A DatasetDict with 'train' and 'validation' from the hub or from local files (like run_clm)."""
    import datasets

    pct = data_args.validation_split_percentage
    if data_args.dataset_name is not None:
        builder, files, extra = data_args.dataset_name, None, {}
        name = data_args.dataset_config_name
    else:
        kinds = {
            check_data_file(data_args.train_file, "--train_file"),
            check_data_file(data_args.validation_file, "--validation_file"),
        } - {None}
        if len(kinds) > 1:
            raise UsageError("--train_file and --validation_file must be of the same type (txt, json or csv)")
        builder = kinds.pop()
        files = {}
        if data_args.train_file:
            files["train"] = data_args.train_file
        if data_args.validation_file:
            files["validation"] = data_args.validation_file
        extra = {"keep_linebreaks": data_args.keep_linebreaks} if builder == "text" else {}
        name = None
    try:
        raw = datasets.load_dataset(builder, name, data_files=files, cache_dir=cache_dir, **extra)
        if "validation" not in raw and "train" in raw:
            raw["validation"] = datasets.load_dataset(
                builder, name, data_files=files, split=f"train[:{pct}%]", cache_dir=cache_dir, **extra
            )
            raw["train"] = datasets.load_dataset(
                builder, name, data_files=files, split=f"train[{pct}%:]", cache_dir=cache_dir, **extra
            )
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError, ValueError, ConnectionError) as exc:
        what = data_args.dataset_name or files
        raise UsageError(f"cannot load dataset {what}: {first_line(exc)}") from exc
    return raw


def tokenize_and_group(raw: Any, tokenizer: Any, block_size: int, training_args: Any, data_args: Any) -> Any:
    """Tokenize the text column and cut the concatenation into ``block_size`` blocks (labels = inputs)."""
    from itertools import chain

    split = "train" if "train" in raw else "validation"
    columns = list(raw[split].features)
    text_column = "text" if "text" in columns else columns[0]

    def tokenize(batch: dict[str, list]) -> Any:
        return tokenizer(batch[text_column])

    def group(batch: dict[str, list]) -> dict[str, list]:
        joined = {k: list(chain(*batch[k])) for k in batch}
        total = (len(joined["input_ids"]) // block_size) * block_size
        out = {k: [v[i : i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}
        out["labels"] = [list(x) for x in out["input_ids"]]
        return out

    with training_args.main_process_first(desc="tokenize"):
        tokenized = raw.map(
            tokenize,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=columns,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="tokenizing",
        )
    with training_args.main_process_first(desc="group"):
        return tokenized.map(
            group,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"grouping into blocks of {block_size}",
        )


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m train.data",
        description="Generate the embedded default data set and tokenizer (deterministic, offline).",
    )
    parser.add_argument("--out", help="data root (default: $GAUDI_CLUSTER_DATA_DIR or the system default)")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    root = Path(args.out).expanduser() if args.out else data_root()
    target = build_default_data(root, force=args.force)
    meta = json.loads((target / "meta.json").read_text())
    print(f"{target}: vocab {meta['vocab_size']}, files {sorted(meta['sha256'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
