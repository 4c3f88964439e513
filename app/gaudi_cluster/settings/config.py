"""Cluster configuration: command-line flags, then GAUDI_CLUSTER_* variables, then defaults.

Every setting is declared once, as a field of ClusterConfig whose metadata carries its parser, help
and example (as HF's HfArgumentParser reads dataclass fields); the flags, the environment names and
the defaults all come from there. Pure: the environment is a parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_cluster.env.envfile import is_secret_value
from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.settings.setting_types import (
    SettingError,
    assignments,
    choice,
    host_name,
    node_count,
    node_filter,
    non_negative_int,
    parse_bool,
    peer_list,
    port,
    seconds,
    seconds_or_zero,
    size,
    slot_count,
    text,
    variable_names,
)
from gaudi_cluster.settings.usage import DEFAULT_JOB_ROOT
from gaudi_cluster.wire.kinds import AUTO, Accelerator, EnvPreset, LauncherName

ENV_PREFIX = "GAUDI_CLUSTER_"


def setting(
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    example: str,
    *,
    switch: bool = False,
    repeatable: bool = False,
    echo: bool = True,
    additive: bool = False,
) -> Any:
    """A ClusterConfig field: its default plus what the CLI and the environment layer need.

    repeatable: the flag may be given several times (its values are joined with ';');
    echo: whether a bad value may be repeated in the error (not for values that may hold secrets);
    additive: a list of names the flag adds to, rather than replaces, the variable's (--env-pass: a
    name the variable gives must not be dropped, unsaid, because the command line names another).
    """
    metadata = dict(parse=parse, help=help, example=example, switch=switch, repeatable=repeatable, echo=echo)
    metadata["additive"] = additive
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ClusterConfig:
    peers: str | None = setting(
        None, peer_list, "static list of the other nodes, entries host or host:slots", "worker-1,worker-2:8"
    )
    peers_dns: str | None = setting(
        None,
        host_name,
        "DNS name resolving to every other node (compose service, headless service)",
        "worker",
    )
    hostfile: str | None = setting(
        None, text, "existing hostfile listing every node, master first (host slots=N)", "/job/hostfile"
    )
    nodes: int | None = setting(
        None, node_count, "expected number of nodes, master included; wait until all are found", "3"
    )
    wait_timeout: float = setting(
        120.0, seconds, "one deadline (s) for discovery, sshd readiness and probes", "300"
    )
    ssh_port: int = setting(3022, port, "sshd port on every node", "2222")
    ssh_dir: str = setting(
        "/run/secrets/gaudi-cluster", text, "directory holding the cluster key id_ed25519", "/keys"
    )
    accelerator: str = setting(
        AUTO, choice(AUTO, *Accelerator), "device kind (auto: what the master has)", "hpu"
    )
    slots: int | None = setting(None, slot_count, "ranks per node (default: devices detected; 1 on cpu)", "2")
    launcher: str = setting(
        LauncherName.DIRECT,
        choice(*LauncherName),
        "how the ranks are started: direct (ours: the same rank environment as DeepSpeed's launcher, "
        "without its torch imports), deepspeed (DeepSpeed's runner over pdsh, the seed's path), "
        "mpirun, torchrun (one node)",
        "deepspeed",
    )
    master_addr: str | None = setting(
        None, text, "address the ranks rendezvous on (default: the master's interface)", "10.0.0.1"
    )
    master_port: int = setting(29500, port, "torch.distributed rendezvous port", "29600")
    control_port: int = setting(29400, port, "port of the master's job control channel", "29401")
    env_preset: str = setting(AUTO, choice(AUTO, *EnvPreset), ".deepspeed_env preset", "efa")
    env: tuple[tuple[str, str], ...] = setting(
        (),
        assignments,
        "extra variable(s) for every rank: K=V, or several as 'K=V;K=V'; repeatable",
        "HCCL_DEBUG=1;FOO=bar",
        repeatable=True,
        echo=False,
    )
    env_pass: tuple[str, ...] = setting(
        (),
        variable_names,
        "forward these variables of the master's environment (secrets included) to every rank through "
        "a 0600 file on each node, never a command line; comma list, repeatable; the flag's names and "
        "the variable's add up",
        "HF_TOKEN",
        repeatable=True,
        additive=True,
    )
    socket_ifname: str | None = setting(None, text, "network interface for HCCL/GLOO/NCCL sockets", "eth0")
    heartbeat_timeout: float = setting(
        10.0, seconds, "seconds without heartbeat before a node counts as lost", "20"
    )
    start_timeout: float = setting(120.0, seconds, "seconds for every rank to check in after launch", "300")
    stuck_timeout: float = setting(
        600.0, seconds, "seconds without training progress before a rank counts as stuck", "1800"
    )
    stop_grace: float = setting(
        8.0, seconds, "seconds ranks get to save and exit after a stop (fits docker stop's 10 s)", "20"
    )
    status_interval: float = setting(
        30.0,
        seconds,
        "seconds between status lines when the console is not a terminal (a terminal "
        "shows one line, redrawn in place)",
        "60",
    )
    tee: bool = setting(
        False,
        parse_bool,
        "print every rank's output lines on the console (default: rank 0's; every rank's lines are always "
        "in the job directory's ranks/rank-N.log on the master)",
        "1",
        switch=True,
    )
    metrics_port: int | None = setting(
        None,
        port,
        "serve the job's figures for Prometheus on this port of the master (/metrics; default off)",
        "9400",
    )
    metrics_addr: str = setting(
        "127.0.0.1",
        text,
        "address the metrics port listens on (0.0.0.0: every interface, for a scraper on another host)",
        "0.0.0.0",
    )
    min_free_disk: int = setting(
        64 << 20,  # the default job's checkpoint is 16 MB per node
        size,
        "warn when a node's output directory has less free space (two checkpoints of the default job "
        "and its final model); units K, M, G",
        "20G",
    )
    max_restarts: int = setting(
        0, non_negative_int, "re-run a failed job up to N times (resumes from checkpoints)", "1"
    )
    skip_doctor: bool = setting(
        False, parse_bool, "skip the preflight checks before launch", "1", switch=True
    )
    fabric_check: bool = setting(
        False,
        parse_bool,
        "before launch, all-reduce between the nodes with the job's backend; a slow or silent node stops it",
        "1",
        switch=True,
    )
    fabric_timeout: float = setting(
        30.0, seconds, "seconds each fabric test may take before its node counts as silent", "60"
    )
    spares: int = setting(
        0, non_negative_int, "find and probe N nodes beyond --nodes, idle; one takes a lost node's place", "1"
    )
    min_nodes: int | None = setting(
        None, node_count, "with no spare left, restart on the nodes that remain while at least M", "2"
    )
    take_back: bool = setting(
        False, parse_bool, "a lost node that answers again may rejoin a later attempt", "1", switch=True
    )
    include: str = setting(
        "",
        node_filter,
        "run only on these nodes or slots, DeepSpeed's NODE[:SLOT,SLOT][@NODE...], with every launcher",
        "worker-1@worker-2:0,1",
    )
    exclude: str = setting(
        "",
        node_filter,
        "leave these nodes or slots out of the launch, DeepSpeed's NODE[:SLOT,SLOT][@NODE...], with every "
        "launcher (the fabric check names them)",
        "worker-3",
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
    preimport: bool = setting(
        True,
        parse_bool,
        "start each node's ranks from one pre-imported parent (torch imported once, forked where safe; "
        "direct launcher); --no-preimport or 0: every rank imports from cold",
        "0",
        switch=True,
    )
    preimport_keep: float = setting(
        600.0,
        seconds_or_zero,
        "seconds each node's zygote stays warm once its ranks have ended, for a restart or the next job "
        "with the same import-time settings (0: it leaves with the attempt; inside a Slurm job always 0)",
        "0",
    )
    job_root: str = setting(DEFAULT_JOB_ROOT, text, "where per-job state lives on every node", "/tmp/jobs")

    def describe(self) -> str:
        """One line with every non-default setting, for the log."""
        changed = [
            f"{f.name}={_redacted(f.name, getattr(self, f.name))}"
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
    repeatable: bool
    echo: bool
    additive: bool = False

    @property
    def flag(self) -> str:
        # A switch that is on by default is turned off: --no-NAME.
        negated = "no-" if self.switch and self.default is True else ""
        return "--" + negated + self.name.replace("_", "-")

    @property
    def aliases(self) -> tuple[str, ...]:
        """torchrun's and DeepSpeed's spelling (--master_port) next to ours (--master-port)."""
        return ("--" + self.name,) if "_" in self.name else ()

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(
        f.name,
        f.default,
        **{
            key: f.metadata[key]
            for key in ("parse", "help", "example", "switch", "repeatable", "echo", "additive")
        },
    )
    for f in dataclasses.fields(ClusterConfig)
)
PEER_SOURCES = ("peers", "peers_dns", "hostfile")


def _redacted(name: str, value: Any) -> str:
    """Values of --env reach the log line only for names that cannot be secrets."""
    if name != "env":
        return repr(value)
    return repr(";".join(f"{key}={'***' if is_secret_value(key, shown) else shown}" for key, shown in value))


def resolve_config(flags: Mapping[str, Any], environ: Mapping[str, str]) -> ClusterConfig:
    """Merge flags > GAUDI_CLUSTER_* > defaults; a bad value is a ConfigError naming its source."""
    values: dict[str, Any] = {}
    named: dict[str, str] = {}  # setting -> what the user wrote to set it: its flag or its variable
    # The peer source is one choice: a source given as a flag replaces every source set in the env.
    flag_sources = [name for name in PEER_SOURCES if flags.get(name) is not None]
    for s in SETTINGS:
        raw = flags.get(s.name)
        source = s.flag
        if isinstance(raw, list):  # a repeatable flag given several times
            raw = ";".join(raw)
        if raw is None and not (flag_sources and s.name in PEER_SOURCES):
            # An empty variable means unset (compose files often write NAME= to clear one).
            raw = environ.get(s.env) or None
            source = s.env
        if raw is None:
            continue
        named[s.name] = source
        values[s.name] = parse_setting(s, raw, source)
        if s.additive and source == s.flag and environ.get(s.env):
            # The variable's names first, then the flag's, each once.
            values[s.name] = tuple(dict.fromkeys((*parse_setting(s, environ[s.env], s.env), *values[s.name])))
    config = ClusterConfig(**values)

    def name(setting: str) -> str:
        return named.get(setting) or "--" + setting.replace("_", "-")

    if config.master_port == config.control_port:
        raise ConfigError(
            f"the rendezvous port ({name('master_port')}) and the control port ({name('control_port')}) "
            f"are both {config.master_port}; fix: give them different ports (defaults 29500 and 29400)"
        )
    taken = (config.master_port, config.control_port)
    if config.metrics_port in taken:
        other = next(p for p in (9400, 9401, 9402) if p not in taken)
        raise ConfigError(
            f"{name('metrics_port')} {config.metrics_port} is also the rendezvous or the control port; "
            f"fix: {_assign(name('metrics_port'), other)} (any port other than {taken[0]} and {taken[1]})"
        )
    if config.include and config.exclude:
        raise ConfigError(
            f"{name('include')} and {name('exclude')} were both given; fix: keep one (DeepSpeed refuses both)"
        )
    _check_elastic(config, name)
    return config


def parse_setting(s: Setting, raw: str, source: str) -> Any:
    """One setting's value from what `source` (its flag or its variable) gave; ConfigError if bad."""
    try:
        return s.parse(raw)
    except ValueError as error:
        shown = f"={quoted(raw)}" if s.echo else ""
        fix = error.fix if isinstance(error, SettingError) else _example(source, s)
        raise ConfigError(f"{source}{shown} is invalid: {error}; fix: {fix}") from None


def _assign(source: str, value: object) -> str:
    """How to set a flag or a variable to `value`, in the form the user chose."""
    return f"{source} {value}" if source.startswith("--") else f"{source}={value}"


def _check_elastic(config: ClusterConfig, name: Callable[[str], str]) -> None:
    """--min-nodes and --spares against the node count they shrink or grow from."""
    if config.min_nodes is not None and config.nodes is not None and config.min_nodes > config.nodes:
        raise ConfigError(
            f"{_assign(name('min_nodes'), config.min_nodes)} is above the job's {config.nodes} nodes "
            f"({name('nodes')}); fix: {_assign(name('min_nodes'), config.nodes)} or less"
        )
    if (config.spares or config.min_nodes) and config.max_restarts == 0:
        given = " and ".join(name(n) for n in ("spares", "min_nodes") if getattr(config, n))
        raise ConfigError(
            f"{given} act{'s' if ' and ' not in given else ''} on a restart but "
            f"{name('max_restarts')} is 0; fix: {_assign(name('max_restarts'), 1)} or more"
        )


def _example(source: str, s: Setting) -> str:
    if source.startswith("--"):
        example = f"'{s.example}'" if any(c in s.example for c in ";, ") else s.example
        return f"e.g. {source} {example}"
    return f"e.g. {source}={s.example}"
