"""The bundled causal-LM workload of gaudi-cluster (a run_clm-style trainer).

Modules, in the order ``run_clm.main`` uses them: ``command_line`` (argv before parsing: the JSON form,
config names, added defaults, the multi-host eval refusal), ``device`` (Gaudi / CUDA / CPU decision and
stack, process group, seed, DeepSpeed refill), ``arguments`` (the argument dataclasses, parsing, checks),
``checkpoints`` (atomic checkpoints on one node's disk), ``timeline`` (the resume and rotation decisions
every rank takes together), ``faults`` (fault injection for drills), ``model`` (config, tokenizer,
model), ``data`` (embedded default data and tokenizer, dataset loading), ``splits`` (the train/eval
blocks of a run),
``callbacks`` (progress, signals, atomic-checkpoint Trainer), ``metrics`` (throughput, MFU, memory, the
reported metrics, plot), ``events`` (event lines). Heavy libraries (torch, transformers, datasets) are
imported lazily.

``DEFAULT_JOB_ARGS`` is the default cluster job (program argv after ``python -m train.run_clm``): the
embedded tiny GPT-2 on the embedded corpus, DeepSpeed ZeRO-0 fp32 on CPU with node-local checkpoints;
about a minute on three 1-rank CPU nodes. Evaluate afterwards on one node with
``python -m train.run_clm --model_name_or_path OUT --do_eval --output_dir OUT``.
"""

DEFAULT_OUTPUT_DIR = "/workspace/output/default"

DEFAULT_JOB_ARGS = [
    "--do_train",
    "--output_dir", DEFAULT_OUTPUT_DIR,
    "--deepspeed", "ds_cpu",
    "--max_steps", "40",
    "--per_device_train_batch_size", "4",
    "--learning_rate", "1e-3",
    "--logging_steps", "5",
    "--save_steps", "20",
    "--save_total_limit", "2",
    "--throughput_warmup_steps", "3",
    "--seed", "42",
]  # fmt: skip
