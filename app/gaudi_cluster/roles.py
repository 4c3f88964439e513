"""The master role: discover, wait, probe, check, write the hostfile and env file, launch, supervise.

Everything that decides is delegated to the pure modules; this module orders the steps and owns
their side effects (files in the job directory, ssh, the control server, restarts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from gaudi_cluster import discovery, doctor, envfile, plan, probe, ssh
from gaudi_cluster.config import ClusterConfig
from gaudi_cluster.control import ControlServer
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.hostfile import HostEntry, Hostfile, make_hostfile, render_hostfile
from gaudi_cluster.supervise import Supervisor, SupervisorSettings

log = logging.getLogger("gaudi_cluster.master")

APP_DIR = Path(__file__).resolve().parent.parent
DEFAULT_SCRIPT = APP_DIR / "train" / "run_clm.py"
STABLE_HOSTFILE = "hostfile"  # next to the job directories: what `gaudi_spawn.py --hostfile` is given


def default_program(python: str, accelerator: str) -> list[str]:
    """The bundled workload on its embedded default (a small GPT-2 on text shipped with Python)."""
    from train import DEFAULT_JOB_ARGS, DEFAULT_OUTPUT_DIR  # a constants-only module: cheap

    output_dir = os.environ.get("GAUDI_CLUSTER_OUTPUT_DIR", "/workspace/output")
    args = [output_dir if arg == DEFAULT_OUTPUT_DIR else arg for arg in DEFAULT_JOB_ARGS]
    if accelerator != "cpu":
        args = ["ds_zero1_bf16" if arg == "ds_cpu" else arg for arg in args]
    if accelerator == "hpu":
        args += ["--use_habana", "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2"]
    return [python, "-u", str(DEFAULT_SCRIPT), *args]


def program_from_args(job_argv: Sequence[str], python: str, accelerator: str) -> list[str]:
    """`script.py args…` runs under this Python; `-m module args…` too; anything else is a command."""
    argv = list(job_argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return default_program(python, accelerator)
    if argv[0].endswith(".py"):
        return [python, "-u", os.path.abspath(argv[0]), *argv[1:]]
    if argv[0] == "-m":
        return [python, "-u", *argv]
    return argv


def required_paths(program: Sequence[str]) -> list[str]:
    """What must exist on every node for the program to start: its script, and the working dir."""
    paths = [os.getcwd()]
    for word in program[1:]:
        if word.endswith(".py") and os.path.isabs(word):
            paths.append(word)
            break
    if program and os.path.isabs(program[0]):
        paths.append(program[0])
    return paths


@dataclass(frozen=True)
class PreparedJob:
    job_id: str
    job_dir: Path
    hostfile: Hostfile
    env: envfile.EnvFile
    plan: plan.LaunchPlan
    master_addr: str
    accelerator: str
    ssh_config: Path
    node_python: str


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _self_names(local_interfaces: Sequence[Mapping[str, Any]]) -> set[str]:
    names = {socket.gethostname(), "localhost", "127.0.0.1"}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    for interface in local_interfaces:
        names.update(interface.get("addresses", []))
    return names


def _discovery_spec(config: ClusterConfig, environ: Mapping[str, str]) -> discovery.DiscoverySpec | None:
    if config.peers or config.peers_dns or config.hostfile:
        return discovery.DiscoverySpec(
            peers=config.peers,
            dns=config.peers_dns,
            hostfile=config.hostfile,
            slurm=False,
            mpi_operator=False,
        )
    return discovery.detect_source(environ)


def _auto_preset(accelerator: str, master_report: Mapping[str, Any]) -> str:
    if accelerator == "cpu":
        return "cpu"
    if accelerator == "hpu":
        # EFA shows up as uverbs devices plus a working efa provider (AWS DL1); else Gaudi NICs.
        return (
            "efa" if master_report.get("uverbs_devices") and master_report.get("efa_provider") else "gaudinic"
        )
    return "none"


def _timeouts_for(accelerator: str) -> dict[str, str]:
    """Collective timeouts chosen per backend: gloo on CPU fails fast; HCCL graph compiles take longer."""
    minutes = "5" if accelerator == "cpu" else "30"
    return {"DEEPSPEED_TIMEOUT": minutes, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


@dataclass(frozen=True)
class NodeSurvey:
    """Who the nodes are and what each one reported over ssh."""

    job_id: str
    job_dir: Path
    ssh_config: Path
    master_addr: str
    local_addr: str  # where this process listens (the control channel)
    socket_ifname: str | None
    peers: tuple[discovery.Peer, ...]
    master_slots: int | None
    hosts: tuple[str, ...]
    paths: tuple[str, ...]
    reports: dict[str, dict[str, Any]]
    unreachable: dict[str, str]


def survey_nodes(
    config: ClusterConfig, program_argv: Sequence[str], environ: Mapping[str, str]
) -> NodeSurvey:
    """Discover the peers, wait for their sshd and probe every node, all under ONE deadline.

    A static list or DNS name gives the *other* nodes (this one leads); a hostfile, Slurm or the
    MPI Operator list *every* node, and the first one is the rendezvous address (as DeepSpeed does).
    """
    started = time.monotonic()
    deadline = started + config.wait_timeout
    python = sys.executable
    local_interfaces = probe.interfaces()
    self_names = _self_names(local_interfaces)
    socket_ifname = config.socket_ifname or envfile.default_socket_ifname(
        [i["name"] for i in local_interfaces]
    )
    local_addr = next(
        (i["addresses"][0] for i in local_interfaces if i["name"] == socket_ifname and i["addresses"]),
        socket.gethostname(),
    )
    self_names.add(local_addr)

    spec = _discovery_spec(config, environ)
    lists_every_node = spec is not None and bool(spec.hostfile or spec.slurm or spec.mpi_operator)
    master_slots: int | None = config.slots
    peers: list[discovery.Peer] = []
    if spec is not None:

        def discover() -> list[discovery.Peer]:
            found = discovery.discover_once(spec, environ)
            return found if lists_every_node else [p for p in found if p.host not in self_names]

        expected = config.nodes if lists_every_node else (config.nodes - 1 if config.nodes else None)
        peers = discovery.wait_for_peers(
            discover, expected, max(0.0, deadline - time.monotonic()), source=discovery.describe_source(spec)
        )
    elif config.nodes and config.nodes > 1:
        raise ConfigError(
            f"--nodes {config.nodes} but no peer source; fix: set --peers, --peers-dns or --hostfile "
            "(GAUDI_CLUSTER_PEERS / _PEERS_DNS / _HOSTFILE)"
        )
    if lists_every_node:
        hosts = [p.host for p in peers]
        master_addr = config.master_addr or hosts[0]
        master_slots = peers[0].slots or config.slots
        peers = peers[1:]
    else:
        master_addr = config.master_addr or local_addr
        hosts = [master_addr] + [p.host for p in peers]
    log.info("nodes: %s (found in %.1fs)", ", ".join(hosts), time.monotonic() - started)

    if config.dry_run:
        # Nothing is contacted: slots come from the peer list or the settings.
        job_dir = Path(tempfile.mkdtemp(prefix="gaudi-cluster-dry-run-"))
        kind = config.accelerator if config.accelerator != "auto" else environ.get("DS_ACCELERATOR", "cpu")
        reports = {host: {"accelerator": kind, "slots": 1, "interfaces": []} for host in hosts}
        return NodeSurvey(
            "dry-run",
            job_dir,
            job_dir / "ssh_config",
            master_addr,
            local_addr,
            socket_ifname,
            tuple(peers),
            master_slots,
            tuple(hosts),
            (),
            reports,
            {},
        )

    silent = ssh.wait_for_sshd(hosts, config.ssh_port, deadline)
    if silent:
        raise ClusterNotReady(
            f"sshd did not answer on port {config.ssh_port} within {config.wait_timeout:.0f}s on: "
            f"{', '.join(silent)}; fix: start those workers (or check --ssh-port / GAUDI_CLUSTER_SSH_PORT)"
        )

    job_id = new_job_id()
    job_dir = Path(config.job_root) / job_id
    job_dir.mkdir(parents=True, exist_ok=True)
    job_dir.chmod(0o700)
    identity = ssh.default_identity(Path(config.ssh_dir))
    if identity is not None:
        ssh.check_private_key(identity)
    ssh_config = ssh.write_ssh_config(job_dir, config.ssh_port, identity)

    paths = required_paths(program_argv)
    probe_cmd = [python, "-m", "gaudi_cluster", "probe", "--json", "--accelerator", config.accelerator]
    for path in paths:
        probe_cmd += ["--path", path]
    if environ.get("HCCL_OVER_OFI") == "1" or config.env_preset == "efa":
        probe_cmd.append("--check-efa")
    results = ssh.run_on_hosts(hosts, probe_cmd, ssh_config, max(10.0, deadline - time.monotonic()))
    reports: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for host, result in results.items():
        if result.ok:
            try:
                reports[host] = json.loads(result.stdout.strip().splitlines()[-1])
                continue
            except (ValueError, IndexError):
                unreachable[host] = (
                    f"probe printed no JSON: {result.stdout[-200:]!r} {result.stderr[-200:]!r}"
                )
                continue
        unreachable[host] = ssh.explain_ssh_failure(result, config.ssh_port)
    return NodeSurvey(
        job_id,
        job_dir,
        ssh_config,
        master_addr,
        local_addr,
        socket_ifname,
        tuple(peers),
        master_slots,
        tuple(hosts),
        tuple(paths),
        reports,
        unreachable,
    )


def env_for(
    config: ClusterConfig,
    accelerator: str,
    master_report: Mapping[str, Any],
    environ: Mapping[str, str],
    socket_ifname: str | None,
) -> envfile.EnvFile:
    preset = config.env_preset if config.env_preset != "auto" else _auto_preset(accelerator, master_report)
    extra = {
        **_timeouts_for(accelerator),
        **envfile.extra_env_from_spec(config.env),
        "GAUDI_CLUSTER_JOB_ROOT": config.job_root,
        "GAUDI_CLUSTER_HEARTBEAT_TIMEOUT": str(config.heartbeat_timeout),
    }
    return envfile.build_env_file(environ, preset, extra, socket_ifname)


def requested_slots(config: ClusterConfig, survey: NodeSurvey) -> dict[str, int | None]:
    return {
        survey.master_addr: survey.master_slots,
        **{p.host: p.slots or config.slots for p in survey.peers},
    }


def prepare(config: ClusterConfig, program_argv: Sequence[str], environ: Mapping[str, str]) -> PreparedJob:
    survey = survey_nodes(config, program_argv, environ)
    if survey.unreachable:
        details = "; ".join(f"{host}: {why}" for host, why in survey.unreachable.items())
        raise ClusterNotReady(
            f"{len(survey.unreachable)} of {len(survey.hosts)} nodes failed the ssh probe: {details}"
        )
    job_id, job_dir, ssh_config, master_addr = (
        survey.job_id,
        survey.job_dir,
        survey.ssh_config,
        survey.master_addr,
    )
    reports, hosts, paths, socket_ifname = survey.reports, survey.hosts, survey.paths, survey.socket_ifname
    python = sys.executable
    accelerator = config.accelerator
    if accelerator == "auto":
        accelerator = reports[master_addr]["accelerator"]
    requested = requested_slots(config, survey)
    env_file = env_for(config, accelerator, reports[master_addr], environ, socket_ifname)
    findings = doctor.check_nodes(reports, {}, requested, socket_ifname, env_file.as_dict(), paths)
    if not (config.skip_doctor or config.dry_run):
        problems = doctor.blocking(findings)
        if problems:
            print(doctor.render_table(findings), file=sys.stderr)
            first = problems[0]
            raise ClusterNotReady(
                f"preflight failed on {len(problems)} check(s); first: {first.host} {first.check}: "
                f"{first.detail}; fix: {first.fix}"
            )

    entries = []
    for host in hosts:
        report = reports[host]
        slots = (
            requested.get(host)
            or (config.slots if report["accelerator"] == "cpu" else None)
            or report["slots"]
        )
        entries.append(HostEntry(host, int(slots or 1)))
    hostfile = make_hostfile(entries, master=master_addr)
    hostfile_path = job_dir / "hostfile"
    hostfile_path.write_text(render_hostfile(hostfile))
    if not config.dry_run:
        stable = Path(config.job_root).parent / STABLE_HOSTFILE
        stable.parent.mkdir(parents=True, exist_ok=True)
        stable.write_text(render_hostfile(hostfile))
    env_path = job_dir / "deepspeed_env"
    env_path.write_text(envfile.render_env_file(env_file))
    env_path.chmod(0o600)

    control = f"{survey.local_addr}:{config.control_port}"
    launch = _plan_for(
        config,
        hostfile,
        hostfile_path,
        env_path,
        env_file,
        ssh_config,
        master_addr,
        program_argv,
        python,
        job_id,
        control,
        socket_ifname,
    )
    return PreparedJob(
        job_id, job_dir, hostfile, env_file, launch, master_addr, accelerator, ssh_config, python
    )


def _plan_for(
    config: ClusterConfig,
    hostfile: Hostfile,
    hostfile_path: Path,
    env_path: Path,
    env_file: envfile.EnvFile,
    ssh_config: Path,
    master_addr: str,
    program: Sequence[str],
    python: str,
    job_id: str,
    control: str,
    socket_ifname: str | None,
) -> plan.LaunchPlan:
    if config.launcher == "mpirun":
        mpi_root = os.environ.get("MPI_ROOT")
        return plan.mpirun_plan(
            hostfile=hostfile,
            master_addr=master_addr,
            master_port=config.master_port,
            ssh_port=config.ssh_port,
            ssh_config_path=str(ssh_config),
            env=env_file.as_dict(),
            program=program,
            python=python,
            job_id=job_id,
            control=control,
            mpi_root=mpi_root,
            openmpi_major=_openmpi_major(),
            socket_ifname=socket_ifname,
        )
    if config.launcher == "torchrun":
        if len(hostfile.entries) > 1:
            raise ConfigError(
                "--launcher torchrun runs one node only; fix: use --launcher deepspeed or mpirun"
            )
        base = plan.torchrun_plan(
            nproc_per_node=hostfile.world_size,
            master_port=config.master_port,
            program=program,
            python=python,
            job_id=job_id,
            control=control,
        )
        return replace(base, env={**env_file.as_dict(), **base.env})
    base = plan.deepspeed_plan(
        hostfile_path=str(hostfile_path),
        master_addr=master_addr,
        master_port=config.master_port,
        ssh_port=config.ssh_port,
        env_file_path=str(env_path),
        program=program,
        python=python,
        ssh_config_path=str(ssh_config),
        job_id=job_id,
        control=control,
    )
    # A one-node deepspeed run skips pdsh and the env file: give the launcher the variables directly.
    return replace(base, env={**env_file.as_dict(), **base.env})


def _openmpi_major() -> int:
    import subprocess

    try:
        done = subprocess.run(
            ["mpirun", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        out = done.stdout
    except (OSError, subprocess.SubprocessError):
        return 4
    for word in out.split():
        if word[:1].isdigit() and "." in word:
            return int(word.split(".")[0])
    return 4


def print_dry_run(job: PreparedJob, out: TextIO) -> None:
    out.write(f"# hostfile ({job.job_dir / 'hostfile'})\n{render_hostfile(job.hostfile)}")
    out.write(f"# env file ({job.job_dir / 'deepspeed_env'})\n{envfile.render_env_file(job.env)}")
    out.write(f"# command\n{plan.render_shell(job.plan)}\n")
    out.flush()


def run_prepared(job: PreparedJob, config: ClusterConfig, out: TextIO) -> int:
    server = ControlServer("0.0.0.0", config.control_port, job.job_id, config.heartbeat_timeout)
    server.start()
    settings = SupervisorSettings(
        start_timeout_s=config.start_timeout,
        stuck_timeout_s=config.stuck_timeout,
        stop_grace_s=config.stop_grace,
    )
    supervisor = Supervisor(
        job.job_id, job.plan, server, {e.host: e.slots for e in job.hostfile.entries}, settings, out
    )
    supervisor.install_signal_handlers()
    log.info(
        "job %s: %d ranks on %d nodes; launching: %s",
        job.job_id,
        job.hostfile.world_size,
        len(job.hostfile.entries),
        plan.render_shell(job.plan),
    )
    started = time.monotonic()
    try:
        outcome = supervisor.run()
    finally:
        server.close()
    if outcome.failure is not None or outcome.stopped_by_signal is not None:
        reap_everywhere(job, config)
    if outcome.exit_code == 0:
        out.write(
            f"gaudi-cluster: job {job.job_id} succeeded: {job.hostfile.world_size} ranks on "
            f"{len(job.hostfile.entries)} nodes in {time.monotonic() - started:.1f}s\n"
        )
        out.flush()
    return outcome.exit_code


def reap_everywhere(job: PreparedJob, config: ClusterConfig) -> None:
    """Kill whatever is left of this job (by its pid files) on every node still reachable."""
    cmd = [
        job.node_python,
        "-m",
        "gaudi_cluster",
        "reap",
        "--job-id",
        job.job_id,
        "--job-root",
        config.job_root,
    ]
    # A dead or cut-off node must not hold the master's exit: its own agents end its ranks anyway.
    results = ssh.run_on_hosts(job.hostfile.hosts, cmd, job.ssh_config, timeout_s=3, connect_timeout_s=1)
    for host, result in results.items():
        if not result.ok:
            log.warning(
                "could not clean up job %s on %s: %s",
                job.job_id,
                host,
                ssh.explain_ssh_failure(result, config.ssh_port),
            )


def run_master(
    config: ClusterConfig, job_argv: Sequence[str], environ: Mapping[str, str], out: TextIO
) -> int:
    """Prepare and run the job, re-running it up to --max-restarts times after a failure."""
    log.info("%s", config.describe())
    accelerator_hint = (
        config.accelerator if config.accelerator != "auto" else environ.get("DS_ACCELERATOR", "cpu")
    )
    program = program_from_args(job_argv, sys.executable, accelerator_hint)
    attempts = config.max_restarts + 1
    code = 1
    for attempt in range(1, attempts + 1):
        job = prepare(config, program, environ)
        if config.dry_run:
            print_dry_run(job, out)
            return 0
        code = run_prepared(job, config, out)
        if code == 0 or code in (128 + signal.SIGTERM, 128 + signal.SIGINT) or attempt == attempts:
            return code
        out.write(
            f"gaudi-cluster: restarting the job from its latest checkpoint "
            f"(restart {attempt} of {config.max_restarts})\n"
        )
        out.flush()
    return code


def hold(config: ClusterConfig, environ: Mapping[str, str], out: TextIO) -> int:
    """Prepare the cluster (hostfile, env file) and stay up so users can launch by hand."""
    job = prepare(config, program_from_args([], sys.executable, "cpu"), environ)
    stable = Path(config.job_root).parent / STABLE_HOSTFILE
    out.write(
        f"gaudi-cluster: cluster ready; hostfile at {stable}:\n{render_hostfile(job.hostfile)}"
        f"run e.g.: gaudi_spawn.py --hostfile {shlex.quote(str(stable))} --use_deepspeed SCRIPT ARGS\n"
    )
    out.flush()
    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop.append(s))
    while not stop:
        time.sleep(0.5)
    return 0
