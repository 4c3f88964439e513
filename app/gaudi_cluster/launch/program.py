"""What the ranks run: the job's argv resolved from the command line, and the device kind. Pure."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gaudi_cluster.wire.kinds import Accelerator

APP_DIR = Path(__file__).resolve().parents[2]
DEFAULT_SCRIPT = APP_DIR / "train" / "run_clm.py"
DEFAULT_OUTPUT = "/workspace/output"


def default_program(python: str, accelerator: str, environ: Mapping[str, str]) -> list[str]:
    """The bundled workload on its embedded default (a small GPT-2 on text shipped with Python)."""
    from train import DEFAULT_JOB_ARGS, DEFAULT_OUTPUT_DIR  # a constants-only module: cheap

    output_dir = environ.get("GAUDI_CLUSTER_OUTPUT_DIR") or DEFAULT_OUTPUT
    args = [output_dir if arg == DEFAULT_OUTPUT_DIR else arg for arg in DEFAULT_JOB_ARGS]
    if accelerator != Accelerator.CPU:
        args = ["ds_zero1_bf16" if arg == "ds_cpu" else arg for arg in args]
    if accelerator == Accelerator.HPU:
        args += ["--use_habana", "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2"]
    return [python, "-u", str(DEFAULT_SCRIPT), *args]


def program_from_args(
    job_argv: Sequence[str], python: str, accelerator: str, environ: Mapping[str, str], cwd: str
) -> list[str]:
    """`script.py args…` runs under this Python; `-m module args…` too; anything else is a command."""
    argv = list(job_argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return default_program(python, accelerator, environ)
    if argv[0].endswith(".py"):
        return [python, "-u", os.path.normpath(os.path.join(cwd, argv[0])), *argv[1:]]
    if argv[0] == "-m":
        return [python, "-u", *argv]
    return argv


def required_paths(program: Sequence[str], cwd: str) -> list[str]:
    """What must exist on every node for the program to start: its script, and the working dir."""
    paths = [cwd]
    for word in program[1:]:
        if word.endswith(".py") and word.startswith("/"):
            paths.append(word)
            break
    if program and program[0].startswith("/"):
        paths.append(program[0])
    return paths


def output_dir(program: Sequence[str], environ: Mapping[str, str], cwd: str, output_volume: bool) -> str:
    """Where the job writes: its --output_dir (the transformers convention), else the cluster's
    (GAUDI_CLUSTER_OUTPUT_DIR, or the image's output volume when `output_volume` says it is there),
    else the working directory: a host run must not create /workspace/output as a side effect."""
    for i, word in enumerate(program):
        if word == "--output_dir" and i + 1 < len(program):
            return program[i + 1]
        if word.startswith("--output_dir="):
            return word.split("=", 1)[1]
    return environ.get("GAUDI_CLUSTER_OUTPUT_DIR") or (DEFAULT_OUTPUT if output_volume else cwd)
