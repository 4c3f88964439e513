"""run_clm's command line as words, before HfArgumentParser sees it.

* ``run_clm.py ARGS.json`` (upstream run_clm's other form: one JSON object of flags) becomes flags, so every
  check below reads one form;
* ``--deepspeed NAME`` and ``--config_name NAME`` also find ``NAME``/``NAME.json`` in ``train/configs/``;
* defaults added before parsing: ``--report_to none`` unless given, ``--use_cpu`` on CPU;
* ``--do_eval`` in a job that spans hosts is refused here (evaluation is single-node), before parsing, which
  may set up the process group.
"""

from __future__ import annotations

import json
from pathlib import Path

from gaudi_cluster.wire.kinds import Accelerator

from train import device
from train.errors import UsageError, first_line

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_MODEL_CONFIG = CONFIG_DIR / "tiny-gpt2.json"


def find_config_file(name: str) -> Path | None:
    """``name`` as a path, else a file of train/configs/ (with or without ``.json``)."""
    for cand in (Path(name), CONFIG_DIR / name, CONFIG_DIR / f"{name}.json"):
        if cand.is_file():
            return cand
    return None


def bundled_configs() -> str:
    return ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.json")))


def resolve_config_file(value: str, flag: str) -> str:
    """A path to an existing file (inline JSON passes as is); bare names are looked up in train/configs/."""
    if value.lstrip().startswith("{"):
        return value
    found = find_config_file(value)
    if found is None:
        raise UsageError(
            f"{flag} {value}: no such file; give a JSON config path (bundled: {bundled_configs()})"
        )
    return str(found)


def argv_from_json_file(argv: list[str]) -> list[str]:
    """upstream run_clm's other form, ``run_clm.py ARGS.json`` (one JSON object of flags), as flags."""
    if len(argv) != 1 or not argv[0].endswith(".json"):
        return argv
    try:
        spec = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{argv[0]}: {first_line(exc)}; fix: give a JSON file of flag names and values"
        ) from exc
    if not isinstance(spec, dict):
        raise UsageError(f"{argv[0]}: not a JSON object; fix: give a JSON file of flag names and values")
    out: list[str] = []
    for name, value in spec.items():
        if value is None or value == []:
            continue  # the default
        if isinstance(value, bool):
            out += [f"--{name}", "true" if value else "false"]
        elif isinstance(value, list):
            out += [f"--{name}", *(str(item) for item in value)]
        else:
            out += [f"--{name}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return out


def rewrite_argv(argv: list[str], name: str, value: str) -> list[str]:
    """argv with the value of ``--name`` replaced (both ``--name V`` and ``--name=V``)."""
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


def with_run_defaults(argv: list[str], choice: device.DeviceChoice) -> list[str]:
    """argv with --deepspeed resolved to a file, no reporting integrations unless asked, --use_cpu on CPU."""
    ds = device.flag_value(argv, "deepspeed")
    if ds is not None:
        argv = rewrite_argv(argv, "deepspeed", resolve_config_file(ds, "--deepspeed"))
    if device.flag_value(argv, "report_to") is None:
        argv = [*argv, "--report_to", "none"]
    if choice.kind is Accelerator.CPU and device.flag_value(argv, "use_cpu") is None:
        # accelerate only sets up a CPU process group (gloo) when told it is on CPU, DeepSpeed included
        argv = [*argv, "--use_cpu"]
    if choice.gaudi and choice.kind is Accelerator.CPU:
        # GaudiTrainingArguments off HPU: lazy mode (default on) and a GaudiConfig name are refused there;
        # the name is read by device.gaudi_trainer_kwargs instead.
        argv = drop_flag(argv, "gaudi_config_name")
        if device.flag_value(argv, "use_lazy_mode") is None:
            argv = [*argv, "--use_lazy_mode", "false"]
    return argv


def drop_flag(argv: list[str], name: str) -> list[str]:
    """argv without ``--name V`` / ``--name=V``."""
    out, flag, skip = [], f"--{name}", False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
        elif tok == flag:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        elif not tok.startswith(flag + "="):
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
    out = device.flag_value(argv, "output_dir") or "OUTPUT_DIR"
    parts = ["python -m train.run_clm", "--model_name_or_path", out]
    for flag in ("dataset_name", "dataset_config_name", "validation_file", "block_size"):
        value = device.flag_value(argv, flag)
        if value is not None:
            parts += [f"--{flag}", value]
    parts += ["--do_eval", "--output_dir", out]
    parts += ["--per_device_eval_batch_size", device.flag_value(argv, "per_device_eval_batch_size") or "8"]
    if gaudi:
        parts += ["--use_habana", "--use_lazy_mode"]
        gaudi_config = device.flag_value(argv, "gaudi_config_name")
        if gaudi_config:
            parts += ["--gaudi_config_name", gaudi_config]
    return " ".join(parts)


def refuse_multi_host_eval(argv: list[str], gaudi: bool, env: dict[str, str]) -> None:
    """--do_eval in a job spanning hosts -> UsageError (checked before parsing, which may set up the
    process group)."""
    hosts = spans_hosts(env)
    if device.flag_true(argv, "do_eval") and hosts > 1:
        raise UsageError(
            f"--do_eval refused: this job spans {hosts} hosts and evaluation is single-node; train without "
            "--do_eval, then on one node run: " + eval_command(argv, gaudi)
        )
