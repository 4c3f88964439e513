#!/usr/bin/env python
"""Causal-LM training and evaluation for gaudi-cluster (run_clm-style; Gaudi, CUDA or CPU).

Accepts the flags of optimum-habana's ``examples/language-modeling/run_clm.py`` (the seed's commands
run verbatim on Gaudi; elsewhere drop ``--use_habana``), or one JSON file of them. Parsing is transformers'
``HfArgumentParser`` over ``ModelArguments``, ``DataTrainingArguments``, ``ClusterArguments`` and the
stack's ``TrainingArguments`` (``GaudiTrainingArguments`` on Gaudi); see ``train.arguments``.

Defaults: with no model and no data named, a small GPT-2 (``configs/tiny-gpt2.json``) is trained from
scratch on the embedded offline corpus and tokenizer (``train.data``). With neither ``--do_train`` nor
``--do_eval`` the run trains. ``--deepspeed NAME`` also finds ``NAME``/``NAME.json`` in ``configs/``.

Non-standard flags (``train.arguments``: ``OverwriteArguments``, ``ClusterArguments``, ``HabanaArguments``):
  --overwrite_output_dir   remove this output_dir's checkpoints instead of resuming from them, on the
                           job's first attempt only (kept in transformers 5, which dropped the flag)
  --shared_output          nodes share --output_dir (also env GAUDI_CLUSTER_SHARED_OUTPUT=1); default:
                           every node keeps its own copy of checkpoints and the final model
                           (save_on_each_node=True)
  --peak_tflops X          peak TFLOP/s per device for the MFU estimate (default from the device kind)
  --plot / --no_plot       write training_curves.png (default on)
  --trainer gaudi|native   with --use_habana: optimum-habana's GaudiTrainer (default) or transformers'
                           own Trainer on the HPU, without optimum-habana (eager mode; train.device)
  off Gaudi only, accepted for compatibility: --use_habana false, --use_lazy_mode, --gaudi_config_name,
  --throughput_warmup_steps (used), --adjust_throughput

Evaluation is single-node. ``--do_eval`` in a job whose ranks span more than one host (``CROSS_SIZE``>1
from DeepSpeed's launcher, or ``WORLD_SIZE`` differing from ``LOCAL_WORLD_SIZE``/``LOCAL_SIZE``) is refused
with exit code 2 and a message giving the single-node command, as the optimum-habana guide advises
(multi-node inference "can provide inconsistent results"): train across nodes, then evaluate the saved
``--output_dir`` on one node.

Checkpoints are atomic (``train.checkpoints``); a run whose --output_dir holds complete checkpoints resumes
from the newest one complete on every node, and demotes what any node holds beyond it (``train.timeline``);
--overwrite_output_dir starts afresh on the job's first attempt only (the master's GAUDI_CLUSTER_ATTEMPT).
SIGTERM/SIGINT: every rank finishes the current step, a checkpoint is saved, and the process exits 143/130.

Exit codes: 0 ok, 1 runtime failure (a checkpoint it cannot write: one line naming the node), 2 bad input
(one line naming the culprit and the fix), 128+N stopped by signal N.
"""

from __future__ import annotations

import time

_T_START = time.time()

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a file: make the `train` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gaudi_cluster.wire.workload_events import WorkloadEvent  # noqa: E402

from train.events import also_record_in, emit, global_rank  # noqa: E402

emit(WorkloadEvent.START, t=_T_START, pid=os.getpid())

from train import arguments, command_line, device, faults, splits, timeline  # noqa: E402
from train import data as datamod  # noqa: E402
from train import metrics as metmod  # noqa: E402
from train import model as modelmod  # noqa: E402
from train.errors import CheckpointWriteError, UsageError  # noqa: E402

log = logging.getLogger("train.run_clm")


def run(argv: list[str]) -> int:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if int(os.environ.get("RANK", "0") or 0) == 0 else logging.WARNING,
        stream=sys.stderr,
    )
    # arguments: the device decides the stack, which decides the dataclasses
    argv = command_line.argv_from_json_file(argv)
    choice = device.choose(argv)
    command_line.refuse_multi_host_eval(argv, choice.gaudi, dict(os.environ))
    training_cls, trainer_base = device.training_stack(choice)
    emit(WorkloadEvent.IMPORTS_DONE)
    args = arguments.parse(argv, training_cls, choice)
    device.note_ignored_flags(argv, choice)
    arguments.validate(args)
    arguments.apply_cluster_defaults(argv, args)
    model_args, data_args, training_args = args.model, args.data, args.training
    also_record_in(training_args.output_dir)  # rank 0 only

    import transformers

    if global_rank() == 0:
        transformers.utils.logging.set_verbosity_warning()
    else:  # the same warning from every rank is noise: rank 0 says it once
        transformers.utils.logging.set_verbosity_error()
        warnings.filterwarnings("ignore")
    dist_ready, collective_device = device.process_group(training_args)
    device.refresh_deepspeed_config(training_args)
    device.match_checkpoint_storage(training_args)

    device.set_seed(choice, training_args.seed)

    collective = timeline.Collective(dist_ready, collective_device)
    faults.pause_before_resume()
    resume = timeline.choose_resume(
        training_args.output_dir,
        explicit=training_args.resume_from_checkpoint,
        do_train=training_args.do_train,
        start_afresh=args.overwrite.overwrite_output_dir,
        attempt=timeline.attempt_number(os.environ),
        writer=training_args.should_save,
        collective=collective,
    )
    checkpoint = resume.checkpoint
    if training_args.do_train:
        log.info("%s", resume.line())
        emit(WorkloadEvent.RESUME, **resume.to_json())

    # data: the embedded corpus and tokenizer unless others are named, cut into blocks
    config = modelmod.load_config(model_args, training_args)
    embedded_dir = None
    if splits.needs_embedded_data(model_args, data_args):
        with training_args.main_process_first(local=True, desc="embedded data"):
            embedded_dir = datamod.ensure_default_data()
    tokenizer = modelmod.load_tokenizer(model_args, embedded_dir)
    block_size = modelmod.choose_block_size(data_args, config, tokenizer)
    train_ds, eval_ds = splits.build(
        model_args, data_args, training_args, tokenizer, block_size, embedded_dir
    )

    model = modelmod.load_model(model_args, config, tokenizer)
    n_params = modelmod.count_parameters(model)

    from transformers import default_data_collator

    from train.callbacks import ClusterCallback, StopRequest, make_trainer_class

    world = training_args.world_size
    global_batch = device.global_batch_size(training_args)
    clock = metmod.StepClock(warmup_steps=int(args.habana.throughput_warmup_steps or 0))
    stop = StopRequest()
    callback = ClusterCallback(stop, clock, global_batch, collective_device)
    trainer = make_trainer_class(trainer_base)(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[callback],
        **device.gaudi_trainer_kwargs(choice, training_args, model_args.cache_dir, argv),
    )
    trainer.cluster_log_hook = callback.augment_logs
    trainer.cluster_collective = collective
    emit(
        WorkloadEvent.MODEL_READY,
        params=n_params,
        world_size=world,
        device=choice.kind,
        block_size=block_size,
        resume_from=checkpoint,
    )

    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=checkpoint)
        if callback.stopped_at is not None:
            log.warning(
                "stopped by signal %s after step %d; checkpoint saved", stop.signum, callback.stopped_at
            )
            emit(WorkloadEvent.TRAIN_STOPPED, step=callback.stopped_at, signal=stop.signum)
            return stop.exit_code
        if data_args.save_last_ckpt:
            trainer.save_model()
        metrics = metmod.train_metrics(
            result.metrics,
            clock,
            global_batch=global_batch,
            block_size=block_size,
            n_params=n_params,
            world_size=world,
            peak_tflops=device.peak_tflops(choice, args.cluster.peak_tflops),
            memory=metmod.memory_metrics(choice.kind),
            train_samples=len(train_ds),
            global_step=trainer.state.global_step,
        )
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        if trainer.is_world_process_zero() and args.cluster.plot:
            metmod.plot_curves(trainer.state.log_history, Path(training_args.output_dir) / metmod.PLOT_NAME)
        emit(
            WorkloadEvent.TRAIN_DONE,
            step=trainer.state.global_step,
            train_samples_per_second=metrics.get("train_samples_per_second"),
            train_loss=metrics.get("train_loss"),
        )

    if training_args.do_eval:
        metrics = metmod.eval_metrics(trainer.evaluate(), eval_samples=len(eval_ds))
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        emit(WorkloadEvent.EVAL_DONE, eval_loss=metrics["eval_loss"], perplexity=metrics["perplexity"])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except (UsageError, CheckpointWriteError) as exc:
        print(f"run_clm: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
