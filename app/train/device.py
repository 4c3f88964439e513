"""Which device and which trainer stack a run uses; the only place that knows about Gaudi.

* Gaudi: ``habana_frameworks`` is importable, an HPU is present **and** ``--use_habana`` is given ->
  optimum-habana's ``GaudiTrainingArguments`` / ``GaudiTrainer`` / ``GaudiConfig`` (as its run_clm does).
* Otherwise: transformers' ``TrainingArguments`` / ``Trainer`` on CUDA when present, else on CPU.
* ``--use_habana`` without an HPU is an error (exit 2), never a silent CPU run.
* Off Gaudi, the Habana-only flags (``--use_habana`` false, ``--use_lazy_mode``, ``--gaudi_config_name``,
  ``--throughput_warmup_steps``, ``--adjust_throughput``) still parse; the ones that do nothing there are
  ignored with one log line.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any

from train.errors import UsageError

log = logging.getLogger("train.device")

FALSE_WORDS = {"false", "0", "no", "n", "f", "off"}

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


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # "hpu" | "cuda" | "cpu"
    gaudi: bool  # True: the optimum-habana stack is used


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


def choose(argv: list[str]) -> DeviceChoice:
    """Decide before argument parsing (the parser's dataclasses depend on it)."""
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
        return DeviceChoice("hpu", True)
    import torch

    return DeviceChoice("cuda" if torch.cuda.is_available() else "cpu", False)


def note_ignored_flags(argv: list[str], choice: DeviceChoice) -> None:
    """One log line naming the Habana-only flags that do nothing on this device."""
    if choice.gaudi:
        return
    ignored = [
        f"--{n}" for n in ("gaudi_config_name", "use_lazy_mode", "adjust_throughput") if flag_value(argv, n)
    ]
    if ignored:
        log.warning("running on %s: %s accepted and ignored (Gaudi only)", choice.kind, ", ".join(ignored))


def training_stack(choice: DeviceChoice) -> tuple[type, type]:
    """(TrainingArguments class, Trainer class) for the choice."""
    if choice.gaudi:
        from optimum.habana import GaudiTrainer, GaudiTrainingArguments  # type: ignore[import-not-found]

        return GaudiTrainingArguments, GaudiTrainer
    from transformers import Trainer, TrainingArguments

    return TrainingArguments, Trainer


def gaudi_trainer_kwargs(choice: DeviceChoice, training_args: Any, cache_dir: str | None) -> dict[str, Any]:
    """Extra Trainer kwargs: the GaudiConfig on Gaudi (name or local path, like optimum-habana's run_clm)."""
    if not choice.gaudi:
        return {}
    from optimum.habana import GaudiConfig  # type: ignore[import-not-found]

    name = training_args.gaudi_config_name
    gaudi_config = GaudiConfig.from_pretrained(name, cache_dir=cache_dir) if name else GaudiConfig()
    return {"gaudi_config": gaudi_config}


def device_name(choice: DeviceChoice) -> str:
    """A lower-case device name for the peak table ("gaudi2", "nvidia h200 ...", "cpu")."""
    try:
        if choice.kind == "hpu":
            import habana_frameworks.torch.hpu as hthpu  # type: ignore[import-not-found]

            return str(hthpu.get_device_name()).lower()
        if choice.kind == "cuda":
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
    return PEAK_TFLOPS["cpu"] if choice.kind == "cpu" else None
