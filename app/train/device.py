"""Which device and which trainer stack a run uses; the only place that knows about Gaudi.

* Gaudi: ``habana_frameworks`` is importable, an HPU is present **and** ``--use_habana`` is given ->
  optimum-habana's ``GaudiTrainingArguments`` / ``GaudiTrainer`` / ``GaudiConfig`` (as its run_clm does).
* Gaudi with ``--trainer native``: transformers' own ``TrainingArguments`` / ``Trainer`` on the HPU, no
  optimum-habana (which reached its end of support on 2026-10-31). transformers >= 4.49 with accelerate
  >= 1.5 find the HPU themselves (``hpu:0``, accelerate's MULTI_HPU over HCCL, the HPU seed and RNG
  state); lazy mode needs mark_step calls that only GaudiTrainer makes, so eager mode
  (``PT_HPU_LAZY_MODE=0``) is the default there, as transformers' Gaudi page advises. What is then
  missing is optimum-habana's: the GaudiConfig (fused AdamW and clip-norm, autocast lists), HPU graphs,
  its Gaudi model patches and the HPU memory figures in the logs.
* Otherwise: transformers' ``TrainingArguments`` / ``Trainer`` on CUDA when present, else on CPU.
* ``--use_habana`` without an HPU is an error (exit 2), never a silent CPU run.
* ``GAUDI_CLUSTER_GAUDI_STACK_ON_CPU=1`` (tests): optimum-habana's stack on CPU (``use_cpu``, no lazy mode,
  ``--gaudi_config_name`` read here as a local file or hub name, since ``GaudiTrainingArguments`` refuses
  it off HPU), so that the workload's Gaudi branch runs against the pinned optimum-habana without a Gaudi.
* Off Gaudi, the Habana-only flags (``--use_habana`` false, ``--use_lazy_mode``, ``--gaudi_config_name``,
  ``--throughput_warmup_steps``, ``--adjust_throughput``) still parse (``train.arguments.HabanaArguments``);
  the ones that do nothing there are ignored with one log line.

Also here: the process group and the device for small collectives (``process_group``), the seed function
of the stack, the refill of DeepSpeed's "auto" values once the world size is known, and DeepSpeed's
node-local checkpoint switch matched to the run's storage.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.wire.kinds import Accelerator

from train.errors import UsageError

log = logging.getLogger("train.device")

GAUDI_STACK_ON_CPU = "GAUDI_CLUSTER_GAUDI_STACK_ON_CPU"

# The one set of words that switch a flag or a variable of the workload off (what HfArgumentParser reads
# as false, plus "off"); any other non-empty word switches it on.
FALSE_WORDS = frozenset({"false", "0", "no", "n", "f", "off"})

# Peak dense bf16 TFLOP/s per device, used for the MFU estimate (override with --peak_tflops).
PEAK_TFLOPS = {
    "gaudi3": 1835.0,
    "gaudi2": 432.0,
    "h200": 989.0,
    "h100": 989.0,
    "a100": 312.0,
    # CPU: a nominal figure (one rank on a few server cores, fp32), so the MFU column is comparable
    # between CPU runs; it says nothing absolute.
    "cpu": 1.0,
}


# --trainer: optimum-habana's GaudiTrainer (default on --use_habana), or transformers' own Trainer.
TRAINERS = ("gaudi", "native")


@dataclass(frozen=True)
class DeviceChoice:
    kind: Accelerator
    gaudi: bool  # True: the optimum-habana stack is used
    native: bool = False  # --trainer native: transformers' own Trainer where GaudiTrainer would run

    def __post_init__(self) -> None:
        # A plain "cpu" (a test's, a setting's) becomes the member, so `is` comparisons hold.
        object.__setattr__(self, "kind", Accelerator(self.kind))


def flag_value(argv: list[str], name: str) -> str | None:
    """The value given to ``--name`` in argv (``"true"`` for a bare boolean flag), else None."""
    flag = f"--{name}"
    value = None
    for i, tok in enumerate(argv):
        if tok == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "true"
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def flag_true(argv: list[str], name: str) -> bool:
    value = flag_value(argv, name)
    return value is not None and value.strip().lower() not in FALSE_WORDS


def env_true(name: str, env: dict[str, str] | None = None) -> bool:
    """An environment switch, read with the control plane's one set of words (unset or empty: off)."""
    from gaudi_cluster.settings.config import parse_bool

    value = (os.environ if env is None else env).get(name, "")
    try:
        return parse_bool(value)
    except ValueError as exc:
        raise UsageError(f"{name}={value!r} {exc}") from None


def habana_present() -> bool:
    """habana_frameworks importable and at least one HPU visible (imports it only when installed)."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    try:
        import habana_frameworks.torch.hpu as hthpu  # type: ignore[import-not-found]

        return bool(hthpu.is_available())
    except Exception as exc:  # broken install: treat as "no HPU", the error below names it
        log.warning("habana_frameworks is installed but unusable: %s", exc)
        return False


def trainer_choice(argv: list[str]) -> str:
    """--trainer gaudi|native (default gaudi)."""
    value = (flag_value(argv, "trainer") or "gaudi").strip().lower()
    if value not in TRAINERS:
        raise UsageError(f"--trainer {value}: use one of {', '.join(TRAINERS)}")
    return value


def choose(argv: list[str]) -> DeviceChoice:
    """Decide before argument parsing (the parser's dataclasses depend on it)."""
    native = trainer_choice(argv) == "native"
    if env_true(GAUDI_STACK_ON_CPU):
        if flag_true(argv, "use_habana"):
            raise UsageError(
                f"--use_habana with {GAUDI_STACK_ON_CPU}=1: the Gaudi stack runs on CPU; drop one"
            )
        return DeviceChoice(Accelerator.CPU, not native, native)
    if flag_true(argv, "use_habana") and native:
        # Eager unless lazy mode is asked for: transformers' Trainer makes no mark_step calls.
        os.environ.setdefault("PT_HPU_LAZY_MODE", "1" if flag_true(argv, "use_lazy_mode") else "0")
        if not habana_present():
            raise UsageError(
                "--use_habana --trainer native given but no Gaudi HPU is usable here (habana_frameworks "
                "missing or no device); drop --use_habana to run on CUDA/CPU"
            )
        return DeviceChoice(Accelerator.HPU, False, True)
    if flag_true(argv, "use_habana"):
        if flag_true(argv, "use_lazy_mode") or flag_value(argv, "use_lazy_mode") is None:
            # optimum-habana wants lazy mode chosen before habana_frameworks is imported
            os.environ.setdefault("PT_HPU_LAZY_MODE", "1")
        else:
            os.environ.setdefault("PT_HPU_LAZY_MODE", "0")
        if not habana_present():
            raise UsageError(
                "--use_habana given but no Gaudi HPU is usable here (habana_frameworks missing or no "
                "device); drop --use_habana to run on CUDA/CPU"
            )
        return DeviceChoice(Accelerator.HPU, True)
    import torch

    return DeviceChoice(Accelerator.CUDA if torch.cuda.is_available() else Accelerator.CPU, False)


def note_ignored_flags(argv: list[str], choice: DeviceChoice) -> None:
    """One log line naming the Habana-only flags that do nothing on this device."""
    if choice.gaudi:
        return
    ignored = [
        f"--{n}" for n in ("gaudi_config_name", "use_lazy_mode", "adjust_throughput") if flag_value(argv, n)
    ]
    if choice.native and choice.kind is Accelerator.HPU:
        # Lazy mode is the HPU's own switch (PT_HPU_LAZY_MODE, set in choose()): the native trainer too.
        ignored = [flag for flag in ignored if flag != "--use_lazy_mode"]
    if ignored:
        where = f"--trainer native on {choice.kind}" if choice.native else f"running on {choice.kind}"
        why = "GaudiTrainer only" if choice.native else "Gaudi only"
        log.warning("%s: %s accepted and ignored (%s)", where, ", ".join(ignored), why)


def training_stack(choice: DeviceChoice) -> tuple[type, type]:
    """(TrainingArguments class, Trainer class) for the choice."""
    if choice.gaudi:
        from optimum.habana import GaudiTrainer, GaudiTrainingArguments  # type: ignore[import-not-found]

        return GaudiTrainingArguments, GaudiTrainer
    from transformers import Trainer, TrainingArguments

    return TrainingArguments, Trainer


def set_seed(choice: DeviceChoice, seed: int) -> None:
    """The stack's seed function (optimum-habana's also seeds the HPU generators)."""
    if choice.gaudi:
        from optimum.habana.utils import set_seed as stack_set_seed  # type: ignore[import-not-found]
    else:
        from transformers import set_seed as stack_set_seed
    stack_set_seed(seed)


def gaudi_trainer_kwargs(
    choice: DeviceChoice, training_args: Any, cache_dir: str | None, argv: list[str] | None = None
) -> dict[str, Any]:
    """Extra Trainer kwargs: the GaudiConfig on Gaudi (name or local path, like optimum-habana's run_clm).
    Off HPU the name comes from the command line (``GaudiTrainingArguments`` refuses it there)."""
    if not choice.gaudi:
        return {}
    from optimum.habana import GaudiConfig  # type: ignore[import-not-found]

    name = training_args.gaudi_config_name or (
        flag_value(argv or [], "gaudi_config_name") if choice.kind is Accelerator.CPU else None
    )
    gaudi_config = GaudiConfig.from_pretrained(name, cache_dir=cache_dir) if name else GaudiConfig()
    return {"gaudi_config": gaudi_config}


def device_name(choice: DeviceChoice) -> str:
    """A lower-case device name for the peak table ("gaudi2", "nvidia h200 ...", "cpu")."""
    try:
        if choice.kind is Accelerator.HPU:
            import habana_frameworks.torch.hpu as hthpu  # type: ignore[import-not-found]

            return str(hthpu.get_device_name()).lower()
        if choice.kind is Accelerator.CUDA:
            import torch

            return torch.cuda.get_device_name().lower()
    except Exception:
        return choice.kind
    return "cpu"


def peak_tflops(choice: DeviceChoice, override: float | None) -> float | None:
    if override:
        return float(override)
    name = device_name(choice).replace(" ", "")
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return PEAK_TFLOPS["cpu"] if choice.kind is Accelerator.CPU else None


def global_batch_size(training_args: Any) -> int:
    """Samples per optimizer step across the job."""
    return (
        training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * training_args.world_size
    )


def process_group(training_args: Any) -> tuple[bool, Any]:
    """(distributed with more than one rank, device for small collectives); sets the process group up."""
    _ = training_args.device  # accelerate / DeepSpeed / torch.distributed start on first access
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False, None
    return True, torch.device("cpu") if dist.get_backend() == "gloo" else training_args.device


def match_checkpoint_storage(training_args: Any) -> None:
    """DeepSpeed's ``checkpoint.use_node_local_storage`` follows the run's storage (``save_on_each_node``).

    Shared storage: only global rank 0 writes the model states (with the switch on, every node's local
    rank 0 would write the same files into the one directory at once). Node-local storage: every node
    writes its own copy (with it off, only rank 0's node could resume)."""
    hf_ds = getattr(training_args, "hf_deepspeed_config", None)
    if not training_args.deepspeed or hf_ds is None:
        return
    node_local = bool(training_args.save_on_each_node)
    section = hf_ds.config.setdefault("checkpoint", {})
    if bool(section.get("use_node_local_storage", False)) != node_local:
        section["use_node_local_storage"] = node_local
        log.info(
            "DeepSpeed checkpoint.use_node_local_storage set to %s to match the output storage", node_local
        )


def refresh_deepspeed_config(training_args: Any) -> None:
    """Refill DeepSpeed's "auto" values once the world size is known.

    transformers 5 fills them in TrainingArguments.__post_init__, before the process group exists, so an
    "auto" train_batch_size comes out as if world_size were 1 and DeepSpeed's batch check fails.
    """
    hf_ds = getattr(training_args, "hf_deepspeed_config", None)
    if not training_args.deepspeed or hf_ds is None:
        return
    if hf_ds.config.get("train_batch_size") in (global_batch_size(training_args), None):
        return
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    fresh = HfTrainerDeepSpeedConfig(training_args.deepspeed)
    fresh.trainer_config_process(training_args)
    training_args.hf_deepspeed_config = fresh
    training_args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=fresh)
