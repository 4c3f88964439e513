"""Which variables a job's ranks get, from where, and by which channel. Pure.

Layers, later wins:
  1. the master's environment, allow-listed (secrets, and values pdsh would rewrite, are left out
     and reported by name);
  2. the preset (`auto` picks efa | gaudinic | cpu | none; hostnic when asked) and the collective
     timeouts;
  3. the user's own .deepspeed_env files, read as DeepSpeed reads them: ~/NAME, then ./NAME, where
     NAME is $DS_ENV_FILE or .deepspeed_env;
  4. --env / GAUDI_CLUSTER_ENV;
  5. --env-pass NAME: the master's value of NAME, on purpose.
Variables that must not appear on a command line (secrets) or would not survive pdsh and the remote
shell verbatim go through the job's private file instead: 0600, on each node, read by the agent.
HCCL_GAUDI_DIRECT without HCCL_OVER_OFI, from whichever layer, is refused (HCL would terminate).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gaudi_cluster.env.envfile import (
    LAUNCHER_OWNED,
    EnvFile,
    check_variable,
    is_forwarded,
    is_private_by_default,
    is_secret_value,
    parse_env_file,
    value_problem,
)
from gaudi_cluster.env.presets import PRESETS
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.wire.kinds import AUTO, Accelerator, EnvPreset
from gaudi_cluster.wire.node_report import NodeReport

DEFAULT_ENV_FILE_NAME = ".deepspeed_env"


def choose_preset(preset: str, accelerator: str, master_report: NodeReport | None) -> tuple[str, str]:
    """(the preset the job gets, why): `auto` follows the device kind and the master's probe. EFA (AWS
    DL1) shows up as uverbs devices plus libfabric's efa provider; other HPU nodes scale out over their
    Gaudi NICs. Host NICs (hostnic) are never guessed: they need a verbs-capable libfabric, so are asked
    for."""
    if preset != AUTO:
        return preset, "asked for (--env-preset)"
    if accelerator == Accelerator.CPU:
        return EnvPreset.CPU, "auto: cpu ranks"
    if accelerator != Accelerator.HPU:
        return EnvPreset.NONE, f"auto: {accelerator} ranks"
    uverbs = master_report.uverbs_devices if master_report else ()
    efa = master_report.efa_provider if master_report else None
    if uverbs and efa:
        return EnvPreset.EFA, "auto: EFA uverbs devices and libfabric's efa provider on the master"
    if not uverbs:
        return EnvPreset.GAUDINIC, "auto: no /dev/infiniband/uverbs* on the master, so no EFA"
    if efa is None:
        return EnvPreset.GAUDINIC, "auto: the master's probe has no fi_info to look for EFA"
    return EnvPreset.GAUDINIC, "auto: uverbs devices but libfabric has no efa provider on the master"


def check_gaudi_direct(values: Mapping[str, str], origin: Callable[[str], str]) -> None:
    """HCL terminates when HCCL_GAUDI_DIRECT is set without HCCL_OVER_OFI: refuse it before launch."""
    if "HCCL_GAUDI_DIRECT" not in values:
        return
    direct, over_ofi = values["HCCL_GAUDI_DIRECT"], values.get("HCCL_OVER_OFI")
    if over_ofi is None or (direct == "1" and over_ofi != "1"):
        shown = "unset" if over_ofi is None else f"{over_ofi} ({origin('HCCL_OVER_OFI')})"
        raise ConfigError(
            f"HCCL_GAUDI_DIRECT={direct} ({origin('HCCL_GAUDI_DIRECT')}) with HCCL_OVER_OFI {shown}: HCCL "
            "stops at start-up when Gaudi Direct is set without OFI; fix: also set HCCL_OVER_OFI=1 "
            "(--env-preset hostnic sets both) or drop HCCL_GAUDI_DIRECT"
        )


def collective_timeouts(accelerator: str) -> dict[str, str]:
    """Collective timeouts per backend: gloo on CPU fails fast; HCCL graph compiles take longer."""
    minutes = "5" if accelerator == Accelerator.CPU else "30"
    return {"DEEPSPEED_TIMEOUT": minutes, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


@dataclass(frozen=True)
class UserEnvFile:
    path: str
    values: tuple[tuple[str, str], ...]


def user_env_paths(environ: Mapping[str, str], home: str, cwd: str) -> list[str]:
    """Where DeepSpeed's runner looks, in its order (the later file wins); one path if absolute."""
    name = environ.get("DS_ENV_FILE") or DEFAULT_ENV_FILE_NAME
    return list(dict.fromkeys(os.path.join(directory, name) for directory in (home, cwd)))


def read_user_env_files(
    environ: Mapping[str, str], home: str, cwd: str, read_text: Callable[[str], str | None]
) -> list[UserEnvFile]:
    """The user's .deepspeed_env files that exist (read_text returns None for a missing file)."""
    found = []
    for path in user_env_paths(environ, home, cwd):
        text = read_text(path)
        if text is not None:
            found.append(UserEnvFile(path, parse_env_file(text, path).items))
    return found


def build_env_file(
    environ: Mapping[str, str], preset: str, extra: Mapping[str, str], socket_ifname: str | None
) -> EnvFile:
    """Layers 1, 2 and 4: the allow-listed environment, the preset, then the explicit extras."""
    if preset not in PRESETS:
        raise ConfigError(
            f"GAUDI_CLUSTER_ENV_PRESET='{preset}' is unknown; fix: use one of {', '.join(sorted(PRESETS))}"
        )
    values: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    for name in sorted(environ):
        if not is_forwarded(name):
            continue
        secret = is_secret_value(name, environ[name])
        problem = "looks like a secret" if secret else value_problem(environ[name])
        if problem:
            dropped.append((name, problem))
            continue
        values[name] = environ[name]
    for name, value in PRESETS[preset](environ, socket_ifname).items():
        check_variable(name, value, f"env preset '{preset}'")
        values[name] = value
    for name, value in extra.items():
        where = f"extra variable {name} (--env / GAUDI_CLUSTER_ENV)"
        if name in LAUNCHER_OWNED:
            raise ConfigError(
                f"{where}: {name} is set by the launcher for every rank; fix: drop it "
                "(use --master-addr/--master-port for the rendezvous)"
            )
        check_variable(name, value, where)
        values[name] = value
    return EnvFile(tuple(sorted(values.items())), tuple(dropped))


def private_values(
    user_files: Sequence[UserEnvFile], env_pass: Sequence[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """What goes through the job's private file: --env-pass names, and the user files' secrets and
    values pdsh would rewrite, and the master's MLFLOW* (envfile.is_private_by_default: no launcher
    gets them). Known before the survey, so the probe can stage it on every node."""
    private: dict[str, str] = {
        name: value for name, value in sorted(environ.items()) if name.startswith("MLFLOW")
    }
    for user_file in user_files:
        for name, value in user_file.values:
            if name in LAUNCHER_OWNED:
                continue
            private.pop(name, None)
            if is_secret_value(name, value) or is_private_by_default(name, value) or value_problem(value):
                private[name] = value
    for name in env_pass:
        if name not in environ:
            raise ConfigError(
                f"--env-pass {name}: {name} is not set in the master's environment; "
                f"fix: export {name} where the master runs (docker run -e {name} ...)"
            )
        private[name] = environ[name]
    return private


def job_env(
    *,
    preset: str,
    accelerator: str,
    master_report: NodeReport | None,
    environ: Mapping[str, str],
    socket_ifname: str | None,
    extra: Mapping[str, str],
    user_files: Sequence[UserEnvFile] = (),
    env_pass: Sequence[str] = (),
    private: Mapping[str, str] | None = None,
) -> EnvFile:
    """`private`: what private_values() gave for the same files and names (the caller staged it on
    every node before the survey; computed here when not given)."""
    chosen, why = choose_preset(preset, accelerator, master_report)
    # build_env_file validates the extras; they are applied again below, above the user's files.
    base = build_env_file(environ, chosen, {**collective_timeouts(accelerator), **extra}, socket_ifname)
    private = dict(private_values(user_files, env_pass, environ) if private is None else private)
    public = base.as_dict()
    from_user: dict[str, None] = {}
    overridden: dict[str, None] = {}
    dropped = list(base.dropped)
    for user_file in user_files:
        for name, value in user_file.values:
            if name in LAUNCHER_OWNED:
                dropped.append((name, f"is set by the launcher for every rank (in {user_file.path})"))
                continue
            if name in public or name in from_user:
                overridden[name] = None
            from_user[name] = None
            public.pop(name, None)
            if name not in private:
                public[name] = value
    for name, value in extra.items():
        if name not in env_pass:
            private.pop(name, None)
            public[name] = value
    for name in private:
        public.pop(name, None)

    def origin(name: str) -> str:
        if name in env_pass or name in extra:
            return "--env-pass" if name in env_pass else "--env / GAUDI_CLUSTER_ENV"
        files = [f.path for f in user_files if name in dict(f.values)]
        if files:
            return files[-1]
        return (
            f"env preset '{chosen}'"
            if name in PRESETS[chosen](environ, socket_ifname)
            else "the master's env"
        )

    check_gaudi_direct({**public, **private}, origin)
    kept = set(env_pass) | set(from_user) | set(extra)
    return EnvFile(
        items=tuple(sorted(public.items())),
        dropped=tuple((name, reason) for name, reason in dropped if name not in kept),
        private=tuple(sorted(private.items())),
        from_user=tuple(from_user),
        overridden=tuple(overridden),
        preset=chosen,
        preset_reason=why,
    )


def describe(env: EnvFile, user_files: Sequence[UserEnvFile]) -> list[str]:
    """One log line per fact worth knowing about the job's variables: names only, never values."""
    lines = []
    if user_files:
        paths = ", ".join(f.path for f in user_files)
        over = (
            f" (replacing the preset's or the master's: {', '.join(env.overridden)})"
            if env.overridden
            else ""
        )
        lines.append(f"from {paths}: {', '.join(env.from_user) or 'nothing'}{over}")
    if env.private:
        lines.append(
            "delivered privately (0600 file on each node, never on a command line): "
            + ", ".join(name for name, _ in env.private)
        )
    if env.dropped:
        names = ", ".join(f"{name} ({why})" for name, why in env.dropped)
        secrets = [name for name, why in env.dropped if why == "looks like a secret"]
        # gaudi_spawn.py and DistributedRunner take no --env-pass: they read the variable.
        fix = (
            f"--env-pass {' --env-pass '.join(secrets)} (or GAUDI_CLUSTER_ENV_PASS={','.join(secrets)}, "
            "which gaudi_spawn.py and DistributedRunner read too) to forward secrets on purpose"
            if secrets
            else ""
        )
        fix += ("; " if fix else "") + "--env NAME=value to set a value the ranks can receive"
        lines.append(f"warning: not forwarded to the ranks: {names}; fix: {fix}")
    if env.preset:
        lines.append(f"env preset: {env.preset} ({env.preset_reason})")
    return lines
