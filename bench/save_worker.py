"""One rank of the save bench (bench/save.py starts two with DeepSpeed's launcher on CPU).

The bundled workload's Trainer (train.callbacks.make_trainer_class over transformers' Trainer) on its
tiny GPT-2, DeepSpeed ds_cpu.json (ZeRO-0, node-local layout), trained one step; then checkpoints are
saved in interleaved pairs, alternating which goes first: the save as it is now (marker first, files,
markers, the collective rotation of issue 24) and the save as it was before (``today_save``: files,
markers, rotation by this node alone; commit 50755ed), each into its own directory with
save_total_limit=2, so that both remove one checkpoint per save. Rank 0 prints ``bench-result {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))
CONFIG = ROOT / "app" / "train" / "configs" / "ds_cpu.json"


def old_rotate(output_dir: Path, save_total_limit: int | None) -> list[Path]:
    """Rotation before issue 24: this node's newest complete checkpoint is kept, whatever the others hold."""
    from train import checkpoints

    every = checkpoints.list_checkpoints(output_dir)
    done = [(s, p) for s, p in every if checkpoints.is_complete(p)]
    if not done:
        return []
    doomed = [p for s, p in every if s < done[-1][0] and not checkpoints.is_complete(p)]
    if save_total_limit:
        doomed += [p for _, p in done[: -max(1, save_total_limit)]]
    return checkpoints.remove_checkpoints(doomed)


def today_save(trainer: Any, base: type) -> None:
    """The atomic save before issue 24 (the baseline)."""
    from train import checkpoints

    limit = trainer.args.save_total_limit
    object.__setattr__(trainer.args, "save_total_limit", None)
    try:
        base._save_checkpoint(trainer, trainer.model, None)
    finally:
        object.__setattr__(trainer.args, "save_total_limit", limit)
    run_dir = Path(trainer._get_output_dir(trial=None))
    ckpt = run_dir / f"checkpoint-{trainer.state.global_step}"
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        checkpoints.write_marker(ckpt, trainer.state.global_step, trainer.args.world_size)
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        old_rotate(run_dir, limit)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()

    import torch.distributed as dist
    from train import callbacks, device, timeline
    from train import data as datamod
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments, set_seed

    out = Path(args.output_dir)
    training_args = TrainingArguments(
        output_dir=str(out / "warmup"),
        max_steps=1,
        per_device_train_batch_size=4,
        save_strategy="no",
        save_total_limit=2,
        save_on_each_node=True,
        report_to="none",
        logging_steps=1_000_000,
        disable_tqdm=True,
        use_cpu=True,
        deepspeed=str(CONFIG),
        seed=42,
    )
    dist_ready, collective_device = device.process_group(training_args)
    device.refresh_deepspeed_config(training_args)
    set_seed(training_args.seed)
    spec = json.loads((ROOT / "app" / "train" / "configs" / "tiny-gpt2.json").read_text())
    spec.pop("architectures", None)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    data_dir = datamod.ensure_default_data()
    trainer = callbacks.make_trainer_class(Trainer)(
        model=AutoModelForCausalLM.from_config(config),
        args=training_args,
        train_dataset=datamod.default_blocks(data_dir, "train", 256),
    )
    trainer.cluster_collective = timeline.Collective(dist_ready, collective_device)
    trainer.train()

    seconds: dict[str, list[float]] = {"ours": [], "today": []}
    for step in range(args.rounds + 1):  # round 0 warms both up (first directories, first writes)
        for who in ("ours", "today") if step % 2 else ("today", "ours"):
            object.__setattr__(trainer.args, "output_dir", str(out / who))
            trainer.state.global_step = step
            dist.barrier()
            started = time.perf_counter()
            if who == "ours":
                trainer._save_checkpoint(trainer.model, None)
            else:
                today_save(trainer, Trainer)
            dist.barrier()
            if step:
                seconds[who].append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        print("bench-result " + json.dumps(seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
