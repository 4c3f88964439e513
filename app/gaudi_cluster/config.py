"""Cluster configuration: command-line flags, then GAUDI_CLUSTER_* variables, then defaults.

Every setting is declared once, as a field of ClusterConfig whose metadata carries its parser, help
and example (as HF's HfArgumentParser reads dataclass fields); the flags, the environment names and
the defaults all come from there. Pure: the environment is a parameter.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.envfile import is_secret
from gaudi_cluster.errors import ConfigError

ENV_PREFIX = "GAUDI_CLUSTER_"
DEFAULT_JOB_ROOT = "/run/gaudi-cluster/jobs"

# The one set of words that mean yes/no, for every switch read from the environment.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _integer(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError("must be an integer") from None


def _positive_int(value: str) -> int:
    number = _integer(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def _non_negative_int(value: str) -> int:
    number = _integer(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def _port(value: str) -> int:
    number = _integer(value)
    if not 1 <= number <= 65535:
        raise ValueError("must be a port number between 1 and 65535")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError("must be a positive, finite number of seconds")
    return number


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    parse.choices = choices  # type: ignore[attr-defined]
    return parse


def setting(
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    example: str,
    *,
    switch: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A ClusterConfig field: its default plus what the CLI and the environment layer need."""
    metadata = {"parse": parse, "help": help, "example": example, "switch": switch, "aliases": aliases}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ClusterConfig:
    peers: str | None = setting(
        None, _text, "static list of the other nodes, entries host or host:slots", "worker-1,worker-2:8"
    )
    peers_dns: str | None = setting(
        None, _text, "DNS name resolving to every other node (compose service, headless service)", "worker"
    )
    hostfile: str | None = setting(
        None, _text, "existing hostfile listing every node, master first (host slots=N)", "/job/hostfile"
    )
    nodes: int | None = setting(
        None, _positive_int, "expected number of nodes, master included; wait until all are found", "3"
    )
    wait_timeout: float = setting(
        120.0, _seconds, "one deadline (s) for discovery, sshd readiness and probes", "300"
    )
    ssh_port: int = setting(3022, _port, "sshd port on every node", "2222")
    ssh_dir: str = setting(
        "/run/secrets/gaudi-cluster", _text, "directory holding the cluster key id_ed25519", "/keys"
    )
    accelerator: str = setting(
        "auto", _choice("auto", "hpu", "cuda", "cpu"), "device kind (auto: what the master has)", "hpu"
    )
    slots: int | None = setting(
        None, _positive_int, "ranks per node (default: devices detected; 1 on cpu)", "2"
    )
    launcher: str = setting(
        "deepspeed", _choice("deepspeed", "mpirun", "torchrun"), "how the ranks are started", "mpirun"
    )
    master_addr: str | None = setting(
        None, _text, "address the ranks rendezvous on (default: the master's interface)", "10.0.0.1"
    )
    master_port: int = setting(29500, _port, "torch.distributed rendezvous port", "29600")
    control_port: int = setting(29400, _port, "port of the master's job control channel", "29401")
    env_preset: str = setting(
        "auto", _choice("auto", "efa", "gaudinic", "cpu", "none"), ".deepspeed_env preset", "efa"
    )
    env: str = setting(
        "", str, "extra variables for every rank, K=V separated by ';'", "HCCL_DEBUG=1;FOO=bar"
    )
    socket_ifname: str | None = setting(None, _text, "network interface for HCCL/GLOO/NCCL sockets", "eth0")
    heartbeat_timeout: float = setting(
        10.0, _seconds, "seconds without heartbeat before a node counts as lost", "20"
    )
    start_timeout: float = setting(120.0, _seconds, "seconds for every rank to check in after launch", "300")
    stuck_timeout: float = setting(
        600.0, _seconds, "seconds without training progress before a rank counts as stuck", "1800"
    )
    stop_grace: float = setting(
        8.0, _seconds, "seconds ranks get to save and exit after a stop (fits docker stop's 10 s)", "20"
    )
    max_restarts: int = setting(
        0, _non_negative_int, "re-run a failed job up to N times (resumes from checkpoints)", "1"
    )
    skip_doctor: bool = setting(
        False, parse_bool, "skip the preflight checks before launch", "1", switch=True
    )
    dry_run: bool = setting(
        False, parse_bool, "print hostfile, env file and command; launch nothing", "1", switch=True
    )
    hold: bool = setting(
        False,
        parse_bool,
        "prepare the cluster and stay up instead of launching (launch by hand)",
        "1",
        switch=True,
    )
    job_root: str = setting(DEFAULT_JOB_ROOT, _text, "where per-job state lives on every node", "/tmp/jobs")

    def describe(self) -> str:
        """One line with every non-default setting, for the log."""
        changed = [
            f"{f.name}={_redacted(f.name, getattr(self, f.name))!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
        return "effective configuration: " + (", ".join(changed) if changed else "all defaults")


@dataclass(frozen=True)
class Setting:
    """One ClusterConfig field as the CLI and the environment layer see it."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    example: str
    switch: bool
    aliases: tuple[str, ...]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(
        f.name,
        f.default,
        aliases=f.metadata["aliases"],
        **{key: f.metadata[key] for key in ("parse", "help", "example", "switch")},
    )
    for f in dataclasses.fields(ClusterConfig)
)
PEER_SOURCES = ("peers", "peers_dns", "hostfile")


def _redacted(name: str, value: Any) -> Any:
    """Values of secret-looking variables in --env never reach a log line."""
    if name != "env" or not value:
        return value
    entries = []
    for entry in str(value).split(";"):
        key, sep, _ = entry.partition("=")
        entries.append(f"{key}=***" if sep and is_secret(key.strip()) else entry)
    return ";".join(entries)


def add_config_flags(parser: argparse.ArgumentParser, names: Iterable[str] | None = None) -> None:
    """One flag per setting; flags default to None so that the env layer can tell 'not given'."""
    wanted = None if names is None else set(names)
    for s in SETTINGS:
        if wanted is not None and s.name not in wanted:
            continue
        choices = getattr(s.parse, "choices", None)
        shown = f"; one of {', '.join(choices)}" if choices else ""
        help_text = f"{s.help}{shown} (env {s.env}; default {s.default})"
        if s.switch:
            parser.add_argument(
                s.flag, *s.aliases, dest=s.name, action="store_const", const="1", help=help_text
            )
        else:
            metavar = s.name.upper() if not choices else "{" + ",".join(choices) + "}"
            parser.add_argument(s.flag, *s.aliases, dest=s.name, metavar=metavar, help=help_text)


def resolve_config(flags: Mapping[str, Any], environ: Mapping[str, str]) -> ClusterConfig:
    """Merge flags > GAUDI_CLUSTER_* > defaults; a bad value is a ConfigError naming its source."""
    values: dict[str, Any] = {}
    # The peer source is one choice: a source given as a flag replaces every source set in the env.
    flag_sources = [name for name in PEER_SOURCES if flags.get(name) is not None]
    for s in SETTINGS:
        raw = flags.get(s.name)
        source = s.flag
        if raw is None and not (flag_sources and s.name in PEER_SOURCES):
            # An empty variable means unset (compose files often write NAME= to clear one).
            raw = environ.get(s.env) or None
            source = s.env
        if raw is None:
            continue
        try:
            values[s.name] = s.parse(raw)
        except ValueError as error:
            separator = " " if source.startswith("--") else "="
            raise ConfigError(
                f"{source}={raw!r} is invalid: {error}; fix: e.g. {source}{separator}{s.example}"
            ) from None
    return ClusterConfig(**values)
