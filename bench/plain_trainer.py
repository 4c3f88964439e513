"""The bundled workload's model, data and batch under a plain transformers Trainer (the baseline of the
throughput bench). Same config JSON (app/train/configs/tiny-gpt2.json), same embedded tokenizer and
token stream (train.data), same block size, batch, seed and steps; no gaudi-cluster callbacks.

Prints the same `gaudi-cluster-event` lines for start and first_step, and one `bench-result {json}` line
with samples/s measured like train.metrics does (optimizer steps after the warmup steps).
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))


def event(name: str, t: float | None = None) -> None:
    print(
        "gaudi-cluster-event " + json.dumps({"event": name, "t": time.time() if t is None else t}), flush=True
    )


event("start", T_START)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--block_size", type=int, default=256)
    args = parser.parse_args()

    from train import data as datamod
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    event("imports_done")
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        save_strategy="no",
        report_to="none",
        logging_steps=1_000_000,
        # The Trainer's own default (a progress bar), as in the bundled workload: a user running either
        # gets it, and it cost 7 % of samples/s here when only one side had it.
        seed=42,
    )
    set_seed(training_args.seed)
    spec = json.loads((ROOT / "app" / "train" / "configs" / "tiny-gpt2.json").read_text())
    spec.pop("architectures", None)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    data_dir = datamod.ensure_default_data()
    train_ds = datamod.default_blocks(data_dir, "train", args.block_size)
    model = AutoModelForCausalLM.from_config(config)

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            times.append(time.perf_counter())
            if len(times) == 1:
                event("first_step")

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        data_collator=default_data_collator,
        callbacks=[Clock()],
    )
    event("model_ready")
    trainer.train()
    warm = args.warmup if args.warmup < len(times) else 0
    t0 = times[warm - 1] if warm > 0 else times[0]
    steps = len(times) - max(warm, 1)
    sps = steps / (times[-1] - t0) * args.batch
    print("bench-result " + json.dumps({"train_samples_per_second": sps, "steps": len(times)}), flush=True)
    event("train_done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
