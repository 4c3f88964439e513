"""The master role, top to bottom: survey -> prepare -> run -> restart policy (or hold).

Each phase lives in its own module (survey, prepare, supervise, outcome); this one only sequences
them and owns the job's lifetime: the control server, the final line, the clean-up on every node.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from gaudi_cluster import engine, plan, slurm, ssh
from gaudi_cluster.config import ClusterConfig
from gaudi_cluster.control import ControlServer
from gaudi_cluster.errors import GaudiClusterError
from gaudi_cluster.hostfile import render_hostfile
from gaudi_cluster.outcome import JobOutcome, should_restart
from gaudi_cluster.prepare import PreparedJob, prepare, print_dry_run, stable_hostfile_path
from gaudi_cluster.program import program_from_args, resolve_accelerator
from gaudi_cluster.supervise import Supervisor, SupervisorSettings

log = logging.getLogger("gaudi_cluster.master")


def run_master(
    config: ClusterConfig, job_argv: Sequence[str], environ: Mapping[str, str], out: TextIO
) -> int:
    """Prepare and run the job, re-running it up to --max-restarts times after a failure."""
    config = engine.engine_defaults(config, environ)
    log.info("%s", config.describe())
    program = program_from_args(
        job_argv, sys.executable, resolve_accelerator(config.accelerator, environ), environ
    )
    attempt = 1
    job: PreparedJob | None = None
    exit_code: int | None = None
    lost: set[str] = set()
    try:
        while True:
            job = prepare(config, program, environ)
            if config.dry_run:
                print_dry_run(job, out)
                exit_code = 0
                return exit_code
            outcome = run_prepared(job, config, out)
            if outcome.failure is not None and outcome.failure.what.startswith("lost contact"):
                lost.add(outcome.failure.host)
            if not should_restart(outcome, attempt, config.max_restarts):
                exit_code = outcome.exit_code
                return exit_code
            out.write(
                f"gaudi-cluster: restarting the job from its latest checkpoint "
                f"(restart {attempt} of {config.max_restarts})\n"
            )
            out.flush()
            attempt += 1
    finally:
        release_workers(config, environ, job, exit_code, skip=lost)


def release_workers(
    config: ClusterConfig,
    environ: Mapping[str, str],
    job: PreparedJob | None,
    exit_code: int | None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> None:
    """In a Slurm step, tell the other nodes the job is over so their tasks end (engine.MasterWatch).

    Whatever the outcome, even before any node was probed. Nodes in `skip` (the master lost contact
    with them: dead, or cut off) are not tried: their task ends with their node or once they find the
    master gone, and waiting on their ssh (a name that no longer resolves can take the whole timeout)
    would only hold the master's exit. Elsewhere (docker run, Kubernetes) nothing happens.
    """
    key = slurm.run_key(environ)
    if key is None or not slurm.in_slurm_step(environ):
        return
    try:
        hosts = slurm.step_hosts(environ)
        if slurm.node_id(environ) == 0:
            hosts = hosts[1:]
        hosts = [host for host in hosts if host not in skip]
        if not hosts:
            return
        ssh_config = job.ssh_config if job is not None else None
        if ssh_config is None:
            directory = Path(config.job_root) / f"release-{key}"
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            ssh_config = ssh.write_ssh_config(
                directory, config.ssh_port, ssh.default_identity(Path(config.ssh_dir))
            )
        command = [sys.executable, "-m", "gaudi_cluster.nodewatch", "release", "--key", key]
        if exit_code is not None:
            command += ["--exit-code", str(exit_code)]
        results = ssh.run_on_hosts(hosts, command, ssh_config, timeout_s=8, connect_timeout_s=2)
    except (GaudiClusterError, OSError) as error:
        log.warning("could not release the Slurm step's workers: %s", error)
        return
    # Stopped by a signal, the whole step is ending and a worker whose sshd got it too has gone
    # without needing the release: that is no news.
    report = log.info if exit_code is not None and exit_code >= 128 else log.warning
    for host, result in results.items():
        if not result.ok:
            report("could not release %s: %s", host, ssh.explain_ssh_failure(result, config.ssh_port))


def run_prepared(job: PreparedJob, config: ClusterConfig, out: TextIO) -> JobOutcome:
    """Run one attempt under supervision; whatever it leaves behind is reaped on every node."""
    server = ControlServer("0.0.0.0", config.control_port, job.job_id, config.heartbeat_timeout)
    server.start()
    settings = SupervisorSettings(
        start_timeout_s=config.start_timeout,
        stuck_timeout_s=config.stuck_timeout,
        stop_grace_s=config.stop_grace,
    )
    slots = {e.host: e.slots for e in job.hostfile.entries}
    supervisor = Supervisor(job.job_id, job.plan, server, slots, settings, out)
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
    if outcome.leaves_processes:
        reap_everywhere(job, config)
    else:
        out.write(
            f"gaudi-cluster: job {job.job_id} succeeded: {job.hostfile.world_size} ranks on "
            f"{len(job.hostfile.entries)} nodes in {time.monotonic() - started:.1f}s\n"
        )
        out.flush()
    return outcome


def reap_everywhere(job: PreparedJob, config: ClusterConfig) -> None:
    """Kill whatever is left of this job (by its pid files) on every node still reachable."""
    if job.ssh_config is None:
        return
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
            why = ssh.explain_ssh_failure(result, config.ssh_port)
            log.warning("could not clean up job %s on %s: %s", job.job_id, host, why)


def hold(config: ClusterConfig, environ: Mapping[str, str], out: TextIO) -> int:
    """Prepare the cluster (hostfile, env file) and stay up so users can launch by hand."""
    program = program_from_args([], sys.executable, resolve_accelerator(config.accelerator, environ), environ)
    job = prepare(config, program, environ)
    stable = stable_hostfile_path(config)
    out.write(
        f"gaudi-cluster: cluster ready; hostfile at {stable}:\n{render_hostfile(job.hostfile)}"
        f"run e.g.: gaudi_spawn.py --hostfile {shlex.quote(str(stable))} --use_deepspeed SCRIPT ARGS\n"
    )
    out.flush()
    stop: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop.append(s))
    while not stop:
        time.sleep(0.5)
    return 0
