"""The .deepspeed_env file: what the ranks on other nodes get of the master's environment.

sshd gives the remote ranks a fresh environment, and DeepSpeed forwards almost nothing on HPU, so
this file is the channel. Its reader is naive (split on the first '=', strip, wrap in double
quotes when the value has characters outside [\\w@%+=:,./-]) and the result is pasted as
`export K="V";` into the pdsh command line, where pdsh substitutes %h/%u/%n and the remote shell
expands $, backticks and backslashes. Values that would not survive that verbatim are refused.
Exports also appear in `ps` and logs, so secrets never go in.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)

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

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)


def is_secret(name: str) -> bool:
    return bool(SECRET_RE.search(name))


def is_forwarded(name: str) -> bool:
    """Allow-listed and not denied (secrets are checked separately, to report them)."""
    if name in DENY_NAMES or name.endswith("CUDA_VISIBLE_DEVICES") or name.startswith(DENY_PREFIXES):
        return False
    return name in ALLOW_NAMES or name.startswith(ALLOW_PREFIXES) or name.endswith(ALLOW_SUFFIXES)


def value_problem(value: str) -> str | None:
    """Why `value` would not reach the remote rank verbatim, or None."""
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


def check_variable(name: str, value: str, where: str) -> None:
    """Raise ConfigError unless NAME=value can go into the env file; `where` names the origin."""
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: '{name}' is not a valid variable name; fix: use [A-Za-z_][A-Za-z0-9_]*")
    if is_secret(name):
        raise ConfigError(
            f"{where}: {name} looks like a secret and the env file is pasted into the pdsh command line "
            "(visible in ps and logs); fix: pass it another way (a mounted file, a login on each node)"
        )
    problem = value_problem(value)
    if problem:
        raise ConfigError(f"{where}: value of {name} {problem}; fix: remove those characters from the value")


def _prepend_paths(first: Sequence[str], existing: str | None) -> str:
    parts = list(first)
    for p in (existing or "").split(":"):
        if p and p not in parts:
            parts.append(p)
    return ":".join(parts)


def preset_efa(
    environ: Mapping[str, str], socket_ifname: str | None, *, ofi_wrapper_dir: str = "/usr/lib/habanalabs"
) -> dict[str, str]:
    out = {
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": _prepend_paths(
            [ofi_wrapper_dir, "/opt/amazon/openmpi/lib", "/opt/amazon/efa/lib"],
            environ.get("LD_LIBRARY_PATH"),
        ),
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "RDMAV_FORK_SAFE": "1",
    }
    if socket_ifname:
        out["HCCL_SOCKET_IFNAME"] = socket_ifname
    return out


GAUDINIC_DEFAULTS: dict[str, str] = {
    "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
    "HABANA_LOGS": "/var/log/habana_logs/",
    "HABANA_SCAL_BIN_PATH": "/opt/habanalabs/engines_fw",
    "HABANA_PLUGINS_LIB_PATH": "/opt/habanalabs/habana_plugins",
    "DATA_LOADER_AEON_LIB_PATH": "/usr/lib/habanalabs/libaeon.so",
}


def preset_gaudinic(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    # The image's own values win: the defaults only cover an environment that lacks them.
    out = {k: environ.get(k) or v for k, v in GAUDINIC_DEFAULTS.items()}
    if socket_ifname:
        out["HCCL_SOCKET_IFNAME"] = socket_ifname
    return out


def preset_cpu(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    out = {"DS_ACCELERATOR": "cpu"}
    if socket_ifname:
        out["GLOO_SOCKET_IFNAME"] = socket_ifname
    return out


def preset_none(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    return {}


PRESETS: dict[str, Callable[[Mapping[str, str], str | None], dict[str, str]]] = {
    "efa": preset_efa,
    "gaudinic": preset_gaudinic,
    "cpu": preset_cpu,
    "none": preset_none,
}


def auto_preset(accelerator: str, master_report: Mapping[str, Any]) -> str:
    """The preset for `--env-preset auto`, from the device kind and what the master's probe saw."""
    if accelerator == "cpu":
        return "cpu"
    if accelerator == "hpu":
        # EFA shows up as uverbs devices plus a working efa provider (AWS DL1); else Gaudi NICs.
        efa = master_report.get("uverbs_devices") and master_report.get("efa_provider")
        return "efa" if efa else "gaudinic"
    return "none"


def collective_timeouts(accelerator: str) -> dict[str, str]:
    """Collective timeouts per backend: gloo on CPU fails fast; HCCL graph compiles take longer."""
    minutes = "5" if accelerator == "cpu" else "30"
    return {"DEEPSPEED_TIMEOUT": minutes, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def job_env(
    *,
    preset: str,
    accelerator: str,
    master_report: Mapping[str, Any],
    environ: Mapping[str, str],
    socket_ifname: str | None,
    extra: Mapping[str, str],
) -> EnvFile:
    """The job's env file: the master's allow-listed variables, the preset, timeouts, then `extra`."""
    chosen = auto_preset(accelerator, master_report) if preset == "auto" else preset
    return build_env_file(environ, chosen, {**collective_timeouts(accelerator), **extra}, socket_ifname)


def default_socket_ifname(ifnames: Sequence[str]) -> str | None:
    """First interface that is neither loopback nor a docker bridge, in the given (ifindex) order."""
    for name in ifnames:
        if not name.startswith(("lo", "docker")):
            return name
    return None


def build_env_file(
    environ: Mapping[str, str],
    preset: str,
    extra: Mapping[str, str],
    socket_ifname: str | None,
) -> EnvFile:
    if preset not in PRESETS:
        raise ConfigError(
            f"GAUDI_CLUSTER_ENV_PRESET='{preset}' is unknown; fix: use one of {', '.join(sorted(PRESETS))}"
        )
    values: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    for name in sorted(environ):
        if not is_forwarded(name):
            continue
        if is_secret(name):
            dropped.append((name, "looks like a secret"))
            continue
        problem = value_problem(environ[name])
        if problem:
            dropped.append((name, problem))
            continue
        values[name] = environ[name]
    for name, value in PRESETS[preset](environ, socket_ifname).items():
        check_variable(name, value, f"env preset '{preset}'")
        values[name] = value
    for name, value in extra.items():
        where = f"extra variable {name} (GAUDI_CLUSTER_ENV / --env)"
        if name in LAUNCHER_OWNED:
            raise ConfigError(
                f"{where}: {name} is set by the launcher for every rank; fix: drop it "
                "(use --master-addr/--master-port for the rendezvous)"
            )
        check_variable(name, value, where)
        values[name] = value
    return EnvFile(tuple(sorted(values.items())), tuple(dropped))


def render_env_file(ef: EnvFile) -> str:
    for name, value in ef.items:
        check_variable(name, value, "env file")
    # No blank lines at all: DeepSpeed's reader crashes on them.
    return "".join(f"{name}={value}\n" for name, value in ef.items)


def parse_env_file(text: str, source: str = "<env file>") -> EnvFile:
    """Validate a user-supplied .deepspeed_env (more tolerant on input: blank lines and # comments)."""
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
        check_variable(name, value, where)
        values[name] = value
    return EnvFile(tuple(sorted(values.items())))


def _pairs(chunks: Iterable[str], source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in chunks:
        chunk = raw.strip()
        if not chunk:
            continue
        if "=" not in chunk:
            raise ConfigError(f"{source}: '{chunk}' has no '='; fix: write NAME=value")
        name, value = chunk.split("=", 1)
        # Stripped like DeepSpeed's reader strips, so "A=1; B = 2" means what it looks like.
        name, value = name.strip(), value.strip()
        if not NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{source}: '{name}' is not a valid variable name; fix: use letters, digits and _"
            )
        out[name] = value
    return out


def extra_env_from_spec(spec: str, source: str = "GAUDI_CLUSTER_ENV") -> dict[str, str]:
    """`K=V;K=V` (GAUDI_CLUSTER_ENV); values cannot contain ';' here, use --env for those."""
    return _pairs(spec.split(";"), source)


def extra_env_from_flags(values: Sequence[str], source: str = "--env") -> dict[str, str]:
    """Repeated `--env K=V` values, each taken whole (a value may contain ';')."""
    return _pairs(values, source)
