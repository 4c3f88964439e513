"""What the ranks run: the job's argv resolved from the command line, and the device kind. Pure."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parents[2]
DEFAULT_SCRIPT = APP_DIR / "train" / "run_clm.py"
DEFAULT_OUTPUT = "/workspace/output"


def resolve_accelerator(
    requested: str, environ: Mapping[str, str], master_report: Mapping[str, Any] | None = None
) -> str:
    """The device kind of the job: the setting, else what the master reported, else DS_ACCELERATOR.

    Before the master has probed itself (dry runs, the default job's arguments) the image's
    DS_ACCELERATOR is the best guess; afterwards the probe's answer wins.
    """
    if requested != "auto":
        return requested
    if master_report and master_report.get("accelerator"):
        return str(master_report["accelerator"])
    return environ.get("DS_ACCELERATOR") or "cpu"


def default_program(python: str, accelerator: str, environ: Mapping[str, str]) -> list[str]:
    """The bundled workload on its embedded default (a small GPT-2 on text shipped with Python)."""
    from train import DEFAULT_JOB_ARGS, DEFAULT_OUTPUT_DIR  # a constants-only module: cheap

    output_dir = environ.get("GAUDI_CLUSTER_OUTPUT_DIR") or DEFAULT_OUTPUT
    args = [output_dir if arg == DEFAULT_OUTPUT_DIR else arg for arg in DEFAULT_JOB_ARGS]
    if accelerator != "cpu":
        args = ["ds_zero1_bf16" if arg == "ds_cpu" else arg for arg in args]
    if accelerator == "hpu":
        args += ["--use_habana", "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2"]
    return [python, "-u", str(DEFAULT_SCRIPT), *args]


def program_from_args(
    job_argv: Sequence[str], python: str, accelerator: str, environ: Mapping[str, str]
) -> list[str]:
    """`script.py args…` runs under this Python; `-m module args…` too; anything else is a command."""
    argv = list(job_argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return default_program(python, accelerator, environ)
    if argv[0].endswith(".py"):
        return [python, "-u", os.path.abspath(argv[0]), *argv[1:]]
    if argv[0] == "-m":
        return [python, "-u", *argv]
    return argv


def required_paths(program: Sequence[str], cwd: str) -> list[str]:
    """What must exist on every node for the program to start: its script, and the working dir."""
    paths = [cwd]
    for word in program[1:]:
        if word.endswith(".py") and os.path.isabs(word):
            paths.append(word)
            break
    if program and os.path.isabs(program[0]):
        paths.append(program[0])
    return paths


def output_dir(program: Sequence[str], environ: Mapping[str, str], cwd: str | None = None) -> str:
    """Where the job writes: its --output_dir (the transformers convention), else the cluster's
    (GAUDI_CLUSTER_OUTPUT_DIR, or the image's output volume), else, on a host without that volume,
    the working directory: a host run must not create /workspace/output as a side effect."""
    for i, word in enumerate(program):
        if word == "--output_dir" and i + 1 < len(program):
            return program[i + 1]
        if word.startswith("--output_dir="):
            return word.split("=", 1)[1]
    volume = DEFAULT_OUTPUT if os.path.isdir(DEFAULT_OUTPUT) else None
    return environ.get("GAUDI_CLUSTER_OUTPUT_DIR") or volume or cwd or os.getcwd()
