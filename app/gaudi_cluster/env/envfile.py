"""The .deepspeed_env file as a value: what may go into it, how it is rendered and read. Pure.

sshd gives the remote ranks a fresh environment, and DeepSpeed forwards almost nothing on HPU, so
this file is the channel. Its reader is naive (split on the first '=', strip, wrap in double
quotes when the value has characters outside [\\w@%+=:,./-]) and the result is pasted as
`export K="V";` into the pdsh command line, where pdsh substitutes %h/%u/%n and the remote shell
expands $, backticks and backslashes. Values that would not survive that verbatim, and secrets
(exports show in `ps` and logs), travel in the job's private file instead (see `jobenv`).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.wire import private_args

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Whole parts of a name (split on "_") that mark a secret: HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD,
# but not TOKENIZERS_PARALLELISM, KEYBOARD or HCCL_KEYS.
SECRET_PARTS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS"})
SECRET_PART_SUFFIXES = ("PASSWORD", "PASSWD", "APIKEY")  # PGPASSWORD, OPENAI_APIKEY

ALLOW_PREFIXES: tuple[str, ...] = (
    "HCCL_",
    "HABANA_",
    "PT_HPU_",
    "PT_HCCL_",
    "GC_",
    "FI_",
    "RDMAV_",
    "HF_",
    "CCL_",
    "LOG_LEVEL_",
)
ALLOW_SUFFIXES: tuple[str, ...] = ("_SOCKET_IFNAME",)
ALLOW_NAMES: frozenset[str] = frozenset(
    {
        "LD_LIBRARY_PATH",
        "PATH",
        "PYTHONPATH",
        "DS_ACCELERATOR",
        "TORCH_EXTENSIONS_DIR",
        "OMP_NUM_THREADS",
        "DEEPSPEED_TIMEOUT",
        "ENABLE_CONSOLE",
        "DATA_LOADER_AEON_LIB_PATH",
    }
)
# Node-local or owned by the launcher: forwarding the master's value would be wrong on the others.
DENY_NAMES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "HABANA_VISIBLE_MODULES",
        "HABANA_VISIBLE_DEVICES",
        "HOSTNAME",
        "OLDPWD",
        "PWD",
        "SHLVL",
        "_",
    }
)
DENY_PREFIXES: tuple[str, ...] = ("BASH_FUNC_", "MASTER_")
LAUNCHER_OWNED: frozenset[str] = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_SIZE",
        "CROSS_RANK",
        "CROSS_SIZE",
    }
)

# ", \, $, ` are re-read by the remote shell inside the double quotes DeepSpeed adds; % by pdsh.
_UNSAFE_CHARS = {'"': "a double quote", "\\": "a backslash", "$": "'$'", "`": "a backtick", "%": "'%'"}


@dataclass(frozen=True)
class EnvFile:
    items: tuple[tuple[str, str], ...]
    # (name, reason) of master variables that matched the allow-list but were not forwarded.
    dropped: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # Delivered to the ranks through the job's 0600 file on each node, never on a command line.
    private: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    # Names the user's own .deepspeed_env files set, and those of them that replaced another value.
    from_user: tuple[str, ...] = field(default=(), compare=False)
    overridden: tuple[str, ...] = field(default=(), compare=False)
    # The preset the job got (what `auto` chose), and why.
    preset: str = field(default="", compare=False)
    preset_reason: str = field(default="", compare=False)

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)


def is_secret(name: str) -> bool:
    """Whether a variable name marks a secret, judged on whole name parts."""
    parts = [part for part in name.upper().split("_") if part]
    if not parts:
        return False
    if any(part in SECRET_PARTS or part.endswith(SECRET_PART_SUFFIXES) for part in parts):
        return True
    # *_KEY (API_KEY, ACCESS_KEY, SSH_KEY) is a key; *_KEY_ID, *_KEY_FILE, *_KEY_PATH name one.
    if parts[-1] == "KEY":
        return True
    return any(a == "PRIVATE" and b == "KEY" for a, b in itertools.pairwise(parts))


# A URL's userinfo (`https://user:pass@host`, `https://TOKEN@host`): a credential whatever the name.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\";]+@")


def has_userinfo(value: str) -> bool:
    return _USERINFO.search(value) is not None


def is_secret_value(name: str, value: str) -> bool:
    """A secret by its name (is_secret) or by its value (a URL with userinfo)."""
    return is_secret(name) or has_userinfo(value)


def is_private_by_default(name: str, value: str) -> bool:
    """Variables of the master's environment that reach the ranks only through the private file:
    MLFLOW* (DeepSpeed's runner exports every one of them onto the pdsh command line; tracking URIs
    and passwords among them) and values with URL userinfo."""
    return name.startswith("MLFLOW") or has_userinfo(value)


def launcher_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a launcher process (DeepSpeed's runner, pdsh, mpirun, torchrun) gets of the master's
    environment: everything but secrets (by name or URL userinfo) and MLFLOW*. DeepSpeed's runner
    exports every MLFLOW*, NCCL*, PYTHON*, MV2* and UCX* variable it sees onto the pdsh command line,
    which every node's `ps` shows and the runner logs; secrets and MLFLOW* reach the ranks only
    through the private file (private_values)."""
    return {
        name: value
        for name, value in environ.items()
        if not is_secret_value(name, value) and not name.startswith("MLFLOW")
    }


_EXPORT = re.compile(r"(\bexport\s+[A-Za-z_][A-Za-z0-9_]*=)(\"[^\"]*\"|'[^']*'|[^;\s]*)")
# `--hub_token=X`, `hub_token=X` and `--hub_token X`: the name judged as a variable name (is_secret).
_ARG_ASSIGN = re.compile(r"(?<![\w./-])(-{0,2}([A-Za-z_][A-Za-z0-9_-]*)=)('[^']*'|\"[^\"]*\"|[^\s'\";]+)")
_ARG_FLAG = re.compile(r"(?<![\w./-])(--?([A-Za-z_][A-Za-z0-9_-]*)\s+)(?!-)('[^']*'|\"[^\"]*\"|[^\s'\";]+)")


def _secret_arg_name(name: str) -> bool:
    return is_secret(name.replace("-", "_"))


@dataclass(frozen=True)
class HiddenArguments:
    """A program with the values of its token-like arguments replaced by placeholders
    (wire.private_args), and those values by the private file's variable that carries each."""

    argv: tuple[str, ...]
    values: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The arguments hidden (`--hub_token`, `argument 3`), for the log: never values.
    names: tuple[str, ...] = ()


def hide_secret_arguments(program: Sequence[str]) -> HiddenArguments:
    """The program arguments that look like they carry a secret, hidden: `--hub_token X`, `--token=X`,
    `*_token=X`, a URL with userinfo (named by the argument before it, or its position)."""
    argv, values, names = list(program), {}, []
    taken: set[int] = set()  # a value hidden as the value of the flag before it

    def take(index: int, prefix: str, value: str, name: str) -> None:
        argv[index] = prefix + private_args.placeholder(len(values))
        values[private_args.variable(len(values))] = value
        names.append(name)
        taken.add(index)

    for i, word in enumerate(program):
        if i in taken:
            continue
        name, eq, value = word.partition("=")
        flag = name.lstrip("-")
        if eq and value and NAME_RE.fullmatch(flag.replace("-", "_")) and _secret_arg_name(flag):
            take(i, f"{name}=", value, name)
        elif word.startswith("-") and not eq and _secret_arg_name(flag) and i + 1 < len(program):
            if not program[i + 1].startswith("-"):
                take(i + 1, "", program[i + 1], word)
        elif has_userinfo(word):
            take(i, "", word, program[i - 1] if i and program[i - 1].startswith("-") else f"argument {i + 1}")
    return HiddenArguments(tuple(argv), values, tuple(names))


def secret_arguments(argv: Sequence[str]) -> list[str]:
    """The names of the program arguments that look like they carry a secret (hide_secret_arguments)."""
    return list(hide_secret_arguments(argv).names)


def secret_arguments_warning(program: Sequence[str]) -> str | None:
    """One line for the log when the program's arguments carry what looks like a secret (private_args
    takes their values off every launcher's command line; the program's own argv still holds them)."""
    found = secret_arguments(program)
    if not found:
        return None
    return (
        f"argument(s) {', '.join(dict.fromkeys(found))} look like a secret: they reach the ranks through the "
        "job's private file, never a launcher's command line, but the program's own argv holds them and is "
        "visible to `ps` on every node; fix: put it in the environment instead (export NAME=... on the "
        "master, --env-pass NAME) and have the program read it from there"
    )


def mask_secrets(line: str) -> str:
    """A line for the log (a launcher's output, the `launching:` command) with the values hidden of
    its `export NAME=value` words, token-like arguments (`--hub_token X`, `--token=X`, `*_token=X`)
    and URL userinfo (`https://***@host`); names kept."""
    line = _EXPORT.sub(r"\1***", line)
    line = _ARG_ASSIGN.sub(lambda m: f"{m[1]}***" if _secret_arg_name(m[2]) else m[0], line)
    line = _ARG_FLAG.sub(lambda m: f"{m[1]}***" if _secret_arg_name(m[2]) else m[0], line)
    return _USERINFO.sub(r"\1***@", line)


def is_forwarded(name: str) -> bool:
    """Allow-listed and not denied (secrets are checked separately, to report them)."""
    if name in DENY_NAMES or name.endswith("CUDA_VISIBLE_DEVICES") or name.startswith(DENY_PREFIXES):
        return False
    return name in ALLOW_NAMES or name.startswith(ALLOW_PREFIXES) or name.endswith(ALLOW_SUFFIXES)


def value_problem(value: str) -> str | None:
    """Why `value` would not reach the remote rank verbatim through pdsh and a shell, or None."""
    if "\n" in value or "\r" in value:
        return "contains a newline"
    if "\0" in value:
        return "contains a NUL byte"
    if any(unicodedata.category(c) == "Cc" and c != "\t" for c in value):
        return "contains a control character"
    for ch, words in _UNSAFE_CHARS.items():
        if ch in value:
            return f"contains {words}, which the remote shell or pdsh would rewrite"
    if value != value.strip():
        return "has leading or trailing whitespace, which DeepSpeed strips"
    return None


def check_name(name: str, where: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: '{name}' is not a valid variable name; fix: use [A-Za-z_][A-Za-z0-9_]*")


def check_variable(name: str, value: str, where: str) -> None:
    """Raise ConfigError unless NAME=value can go into the env file; `where` names the origin."""
    check_name(name, where)
    if is_secret_value(name, value):
        raise ConfigError(
            f"{where}: {name} looks like a secret and the env file is pasted into the pdsh command line "
            f"(visible in ps and logs); fix: export it on the master and pass --env-pass {name}"
        )
    problem = value_problem(value)
    if problem:
        raise ConfigError(f"{where}: value of {name} {problem}; fix: remove those characters from the value")


def render_env_file(ef: EnvFile) -> str:
    for name, value in ef.items:
        check_variable(name, value, "env file")
    # No blank lines at all: DeepSpeed's reader crashes on them.
    return "".join(f"{name}={value}\n" for name, value in ef.items)


def parse_env_file(text: str, source: str = "<env file>") -> EnvFile:
    """A user's .deepspeed_env, read as DeepSpeed reads it (split at the first '=', stripped), but also
    taking blank lines and # comments, which DeepSpeed's reader would crash on. Values are checked
    where they are used: a value that pdsh would rewrite goes to the private file instead."""
    values: dict[str, str] = {}
    # Line breaks as DeepSpeed's text-mode readlines() sees them, not str.splitlines()'s wider set.
    for lineno, raw in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if "=" not in line:
            raise ConfigError(f"{where}: line '{line}' has no '='; fix: write NAME=value")
        name, value = (part.strip() for part in line.split("=", 1))
        if name.startswith("export "):
            raise ConfigError(
                f"{where}: '{name}' starts with 'export'; fix: write NAME=value without 'export'"
            )
        check_name(name, where)
        values[name] = value
    return EnvFile(tuple(values.items()))


def parse_assignments(chunks: Iterable[str], source: str) -> dict[str, str]:
    """`NAME=value` items (from --env, GAUDI_CLUSTER_ENV), stripped like DeepSpeed's reader strips."""
    out: dict[str, str] = {}
    for raw in chunks:
        chunk = raw.strip()
        if not chunk:
            continue
        if "=" not in chunk:
            raise ConfigError(f"{source}: '{chunk}' has no '='; fix: write NAME=value")
        name, value = (part.strip() for part in chunk.split("=", 1))
        check_name(name, source)
        out[name] = value
    return out


def split_assignments(values: Sequence[str], source: str) -> dict[str, str]:
    """Repeated `--env` values, each a `K=V` or a `K=V;K=V` list (so no value may contain ';')."""
    return parse_assignments([chunk for value in values for chunk in value.split(";")], source)
