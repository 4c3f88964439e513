"""Cluster configuration: command-line flags, then GAUDI_CLUSTER_* variables, then defaults.

One table (SETTINGS) declares every setting once; the CLI adds the flags from it and
`resolve_config` merges the three layers into a frozen ClusterConfig. Pure: the environment is a
parameter.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.errors import ConfigError

ENV_PREFIX = "GAUDI_CLUSTER_"


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 65535:
        raise ValueError("must be a port number between 1 and 65535")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be a positive number of seconds")
    return number


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    name: str  # ClusterConfig field; flag is --name-with-dashes, env is GAUDI_CLUSTER_NAME
    parse: Callable[[str], Any]
    default: Any
    help: str
    example: str
    is_switch: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("peers", str, None, "static peer list, entries host or host:slots", "worker-1,worker-2:8"),
    Setting(
        "peers_dns",
        str,
        None,
        "DNS name resolving to every peer (compose service, headless service)",
        "worker",
    ),
    Setting("hostfile", str, None, "existing hostfile listing the nodes (host slots=N)", "/job/hostfile"),
    Setting(
        "nodes",
        _positive_int,
        None,
        "expected number of nodes, master included; wait until all are found",
        "3",
    ),
    Setting(
        "wait_timeout", _seconds, 120.0, "one deadline (s) for discovery, sshd readiness and probes", "120"
    ),
    Setting("ssh_port", _port, 3022, "sshd port on every node", "3022"),
    Setting(
        "ssh_dir", str, "/run/secrets/gaudi-cluster", "directory holding the cluster key id_ed25519", "/keys"
    ),
    Setting("accelerator", _choice("auto", "hpu", "cuda", "cpu"), "auto", "device kind", "hpu"),
    Setting("slots", _positive_int, None, "ranks per node (default: devices detected; 1 on cpu)", "2"),
    Setting("launcher", _choice("deepspeed", "mpirun", "torchrun"), "deepspeed", "launcher", "mpirun"),
    Setting(
        "master_addr", str, None, "address the ranks rendezvous on (default: master's interface)", "10.0.0.1"
    ),
    Setting("master_port", _port, 29500, "torch.distributed rendezvous port", "29500"),
    Setting("control_port", _port, 29400, "port of the master's job control channel", "29400"),
    Setting(
        "env_preset",
        _choice("auto", "efa", "gaudinic", "cpu", "none"),
        "auto",
        ".deepspeed_env preset",
        "efa",
    ),
    Setting("env", str, "", "extra variables for every rank, K=V separated by ';'", "HCCL_DEBUG=1;FOO=bar"),
    Setting("socket_ifname", str, None, "network interface for HCCL/GLOO/NCCL sockets", "eth0"),
    Setting(
        "heartbeat_timeout", _seconds, 10.0, "seconds without heartbeat before a node counts as lost", "10"
    ),
    Setting("start_timeout", _seconds, 120.0, "seconds for every rank to check in after launch", "120"),
    Setting(
        "stuck_timeout",
        _seconds,
        600.0,
        "seconds without training progress before a rank counts as stuck",
        "600",
    ),
    Setting("stop_grace", _seconds, 8.0, "seconds ranks get to save and exit after a stop", "20"),
    Setting(
        "max_restarts",
        _non_negative_int,
        0,
        "re-run a failed job up to N times (resumes from checkpoints)",
        "1",
    ),
    Setting("skip_doctor", _flag, False, "skip the preflight checks before launch", "1", is_switch=True),
    Setting(
        "dry_run", _flag, False, "print hostfile, env file and command; launch nothing", "1", is_switch=True
    ),
    Setting(
        "hold",
        _flag,
        False,
        "prepare the cluster and stay up instead of launching (launch by hand)",
        "1",
        is_switch=True,
    ),
    Setting(
        "job_root", str, "/run/gaudi-cluster/jobs", "where per-job state lives on every node", "/tmp/jobs"
    ),
)


PEER_SOURCES = ("peers", "peers_dns", "hostfile")


@dataclass(frozen=True)
class ClusterConfig:
    peers: str | None = None
    peers_dns: str | None = None
    hostfile: str | None = None
    nodes: int | None = None
    wait_timeout: float = 120.0
    ssh_port: int = 3022
    ssh_dir: str = "/run/secrets/gaudi-cluster"
    accelerator: str = "auto"
    slots: int | None = None
    launcher: str = "deepspeed"
    master_addr: str | None = None
    master_port: int = 29500
    control_port: int = 29400
    env_preset: str = "auto"
    env: str = ""
    socket_ifname: str | None = None
    heartbeat_timeout: float = 10.0
    start_timeout: float = 120.0
    stuck_timeout: float = 600.0
    stop_grace: float = 8.0
    max_restarts: int = 0
    skip_doctor: bool = False
    dry_run: bool = False
    hold: bool = False
    job_root: str = "/run/gaudi-cluster/jobs"

    def describe(self) -> str:
        """One line with every non-default setting, for the log."""
        changed = [
            f"{field.name}={_redacted(field.name, getattr(self, field.name))!r}"
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != field.default
        ]
        return "effective configuration: " + (", ".join(changed) if changed else "all defaults")


def _redacted(name: str, value: Any) -> Any:
    """Values of secret-looking variables in --env never reach a log line."""
    if name != "env" or not value:
        return value
    from gaudi_cluster.envfile import is_secret

    entries = []
    for entry in str(value).split(";"):
        key, sep, _ = entry.partition("=")
        entries.append(f"{key}=***" if sep and is_secret(key.strip()) else entry)
    return ";".join(entries)


def add_config_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """Add one flag per setting; defaults stay None so the env layer can tell 'not given'."""
    for setting in SETTINGS:
        if names is not None and setting.name not in names:
            continue
        help_text = f"{setting.help} (env {setting.env}; default {setting.default})"
        if setting.is_switch:
            parser.add_argument(
                setting.flag, dest=setting.name, action="store_const", const="1", help=help_text
            )
        else:
            parser.add_argument(setting.flag, dest=setting.name, metavar=setting.example, help=help_text)


def resolve_config(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> ClusterConfig:
    """Merge flags > GAUDI_CLUSTER_* > defaults; a bad value is a ConfigError naming its source."""
    values: dict[str, Any] = {}
    # The peer source is one choice: a source given as a flag replaces every source set in the env.
    flag_sources = [name for name in PEER_SOURCES if flags.get(name) is not None]
    for setting in SETTINGS:
        raw = flags.get(setting.name)
        source = setting.flag
        if raw is None and not (flag_sources and setting.name in PEER_SOURCES):
            raw = environ.get(setting.env)
            source = setting.env
        if raw is None:
            continue
        try:
            values[setting.name] = setting.parse(raw)
        except ValueError as error:
            raise ConfigError(
                f"{source}={raw!r} is invalid: {error}; fix: e.g. {source}"
                f"{' ' if source.startswith('--') else '='}{setting.example}"
            ) from None
    return ClusterConfig(**values)
