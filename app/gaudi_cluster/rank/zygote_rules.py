"""Node: the pre-imported rank's decisions (rank/zygote runs them): what the zygote imports, which
settings are its key, which program it may run, and whether it may fork now. Pure.

The zygote imports the workload's heavy libraries once per node and forks each rank from that
state, so a rank does not import torch from cold. Forking is safe only while the parent has one
thread (a lock held by another thread stays held in the child forever) and no accelerator open (a
device context does not survive a fork); everything else falls back to a plain start, said in one
line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Device files of an accelerator: an open one means a device context a child must not inherit.
DEVICE_PREFIXES = ("/dev/accel", "/dev/nvidia", "/dev/hl")
# Variables libraries read while they are imported (torch, DeepSpeed, transformers, OpenMP, the
# Habana bridge, the interpreter itself): a rank whose value differs must not run in this zygote.
KEY_PREFIXES = (
    "PT_",
    "DS_",
    "DEEPSPEED",
    "OMP_",
    "OPENBLAS_",
    "GOTO_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "TORCH",
    "HABANA",
    "CUDA_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "PYTHON",
    "LD_",
    "XDG_",  # the Hugging Face libraries place their caches from XDG_CACHE_HOME and HOME at import
    "ARROW_",  # pyarrow (under the Trainer, through datasets) sets up its memory pool at import
    "JE_",  # and its jemalloc reads JE_ARROW_MALLOC_CONF then
)
KEY_NAMES = ("HOME", "TMPDIR")
# What a warm zygote starts with besides its key: it outlives the job, so none of the job's other
# variables (its secrets among them) stay in its memory.
BASIC_NAMES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "USER", "LOGNAME", "TZ")
# Secrets are no import-time setting, and their names must not make every rank start plain.
_NOT_KEY_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
# The bundled workload's heaviest imports, in order: the Trainer's module is most of what a rank still
# imported after the fork without it (1.8 s of 2.9 s: the models' code, accelerate, datasets).
# numpy's OpenBLAS starts its thread pool at import, a thread per CPU unless a variable says fewer,
# and pyarrow's jemalloc its background thread: with either the guard refuses every fork
# (PRELOAD_ONLY_ENV keeps both off).
CPU_PRELOAD = ("torch", "transformers", "deepspeed", "transformers.trainer")
# Set for the zygote's own imports only, where the ranks' environment does not say otherwise, and
# removed before any fork: a rank's environment stays what a plain start gives. A forked rank sizes
# numpy's BLAS pool as a plain start would (openblas_threads). It runs jemalloc without its background
# purging thread (a plain start's has one): purging happens in the allocating threads instead.
# Without the first, a rank whose OMP_NUM_THREADS is not 1 (an HPU or GPU server's, where nothing
# sets it, or CPU ranks that do not share their cores) was never forked, after waiting for the imports.
PRELOAD_ONLY_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
# OpenBLAS's own order: the first of these that is a positive count, else a thread per CPU it may use.
OPENBLAS_COUNT_NAMES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
# Elsewhere only what is known fork-safe before a device is touched: `import deepspeed` picks its
# accelerator at import (habana_frameworks on HPU, a CUDA query on GPUs), so the child imports it.
DEVICE_PRELOAD = ("torch", "transformers")
# Modules whose presence in the zygote means a device bridge was loaded: never fork then.
BRIDGES = ("habana_frameworks",)


def is_key_name(name: str) -> bool:
    if name in KEY_NAMES:
        return True
    return name.startswith(KEY_PREFIXES) and not any(word in name for word in _NOT_KEY_WORDS)


def zygote_key(env: Mapping[str, str]) -> dict[str, str]:
    """The import-time settings of an environment: what a zygote and each rank it forks share."""
    return {name: value for name, value in env.items() if is_key_name(name)}


def zygote_name(env: Mapping[str, str], python: str) -> str:
    """A warm zygote's name on its node: the same for every rank it may fork (same interpreter, same
    import-time settings), another for any other; names only, never a value, reach the file system."""
    import hashlib  # here: the agents (zygote_client) never name a zygote

    key = json.dumps([python, sorted(zygote_key(env).items())])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def start_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What a warm zygote is started with: the ranks' import-time settings and a few basics."""
    basics = {name: env[name] for name in BASIC_NAMES if name in env}
    return {**basics, **zygote_key(env)}


def key_difference(zygote_env: Mapping[str, str], rank_env: Mapping[str, str]) -> list[str]:
    """The names whose import-time value differs (names only: a value may be private)."""
    ours, theirs = zygote_key(zygote_env), zygote_key(rank_env)
    return sorted(name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name))


def preload_modules(env: Mapping[str, str]) -> tuple[str, ...]:
    """What the zygote imports: the whole bundled stack on CPU, torch and transformers elsewhere."""
    return CPU_PRELOAD if env.get("DS_ACCELERATOR") == "cpu" else DEVICE_PRELOAD


def openblas_threads(env: Mapping[str, str], procs: int) -> int:
    """The threads OpenBLAS gives itself at import under `env` on a node where it sees `procs` CPUs
    (its blas_get_cpu_number): what a forked rank's pool is set back to."""
    for name in OPENBLAS_COUNT_NAMES:
        try:
            count = int(env.get(name, "").strip())
        except ValueError:
            continue
        if count > 0:
            return max(1, min(count, procs))
    return max(1, procs)


def fork_refusal(threads: int, open_files: Sequence[str], modules: Sequence[str]) -> str | None:
    """Why the zygote may not fork now (None: it may): its thread count, the targets of its open file
    descriptors and the names of its imported modules."""
    if threads != 1:
        return f"the zygote has {threads} threads (a fork is safe with one)"
    devices = sorted({path for path in open_files if path.startswith(DEVICE_PREFIXES)})
    if devices:
        return f"the zygote has a device file open ({', '.join(devices)})"
    bridges = sorted({name for name in modules if name.split(".")[0] in BRIDGES})
    if bridges:
        return f"the zygote imported a device bridge ({bridges[0]})"
    return None


@dataclass(frozen=True)
class Script:
    """A program the zygote can run as `__main__`: `python [-u] SCRIPT ARGS...`."""

    path: str
    argv: tuple[str, ...]  # sys.argv as a plain start gives it: the script as written, then its args
    unbuffered: bool


def script_of(program: Sequence[str], python: str, realpath: Any = os.path.realpath) -> Script | str:
    """The script `program` runs under the zygote's own interpreter, or why it is not one
    (another interpreter, `-m`, `-c`, or any interpreter option but -u)."""
    if not program or realpath(program[0]) != realpath(python):
        shown = program[0] if program else "nothing"
        return f"the program runs {shown}, not this interpreter ({python})"
    options = []
    for word in program[1:]:
        if not word.startswith("-") or word == "-":
            break
        options.append(word)
    rest = program[1 + len(options) :]
    if any(option != "-u" for option in options) or not rest or rest[0] == "-":
        return "the program is no `python [-u] SCRIPT` (a module, -c or other interpreter options)"
    return Script(rest[0], tuple(rest), "-u" in options)


@dataclass(frozen=True)
class ForkRequest:
    """An agent's request to the zygote: run this program as this rank (its stdin and output come
    along as file descriptors)."""

    program: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "program", tuple(self.program))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def to_json(self) -> str:
        return json.dumps({"program": list(self.program), "env": dict(self.env), "cwd": self.cwd})

    @classmethod
    def from_json(cls, text: str) -> ForkRequest:
        data = json.loads(text)
        program, env, cwd = data.get("program"), data.get("env"), data.get("cwd")
        if not isinstance(program, list) or not all(isinstance(word, str) for word in program):
            raise ValueError("fork request: 'program' must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError("fork request: 'env' must map names to strings")
        if not isinstance(cwd, str) or not cwd:
            raise ValueError("fork request: 'cwd' must be a path")
        return cls(tuple(program), env, cwd)


@dataclass(frozen=True)
class ForkReply:
    """The zygote's answers, one JSON line each: ready (its imports done), then the rank's pid or why
    not, later the rank's wait status."""

    ready: bool = False
    pid: int | None = None
    refused: str | None = None
    status: int | None = None  # os.waitpid's status of the rank

    def to_json(self) -> str:
        # `is`, not `in`: a status of 0 (a clean exit) equals False.
        return json.dumps({k: v for k, v in vars(self).items() if v is not None and v is not False})

    @classmethod
    def from_json(cls, text: str) -> ForkReply:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"fork reply: not an object: {text[:80]!r}")
        ready, pid, refused, status = (data.get(k) for k in ("ready", "pid", "refused", "status"))
        reply = cls(
            ready is True,
            pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            refused if isinstance(refused, str) else None,
            status if isinstance(status, int) and not isinstance(status, bool) else None,
        )
        if reply == cls():
            raise ValueError(f"fork reply: no ready, pid, refusal or status in {text[:80]!r}")
        return reply
