"""Node (a worker under Slurm; `release_workers` runs on the master): its sshd as a child, until the
master releases the node (thin).

    python -m gaudi_cluster.engines.nodewatch auto --entrypoint PATH [-- JOB...]
        the entrypoint's role `auto`: resolves the role here (engine.auto_role, and how the master
        reaches the nodes: nodes/srun.launch_mode, decided alike on every node), says it on stderr,
        and then either follows the master itself (a Slurm worker the master reaches by srun steps:
        the node's one process under Slurm, no second interpreter) or goes back to the entrypoint
        with the answer in GAUDI_CLUSTER_AUTO_ROLE (`ROLE ENGINE MASTER_HOST|- srun|ssh`).
    python -m gaudi_cluster.engines.nodewatch role
        the same answer printed on stdout instead.
    python -m gaudi_cluster.engines.nodewatch follow --master HOST [--srun] [-- SSHD_ARGV...]
        runs sshd (not with --srun: the master reaches this node by srun steps) and exits when
        engine.MasterWatch says so: 0 once released, 1 once the master is gone (ssh only).
        SIGTERM (scancel, srun --kill-on-bad-exit) does not end it at once: the ranks on this
        node got the same stop and are saving a checkpoint, and leaving now would make slurmstepd
        kill them; it exits 0 once no rank agent runs here any more.
    python -m gaudi_cluster.engines.nodewatch release --key JOB.STEP [--exit-code N]
        what the master runs on each worker over ssh at its very end (`release_workers`).

Settings (ports, timeouts, where job state lives) are the GAUDI_CLUSTER_* ones every node reads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gaudi_cluster.engines import auto as engine
from gaudi_cluster.errors import GaudiClusterError, error_line, exit_code_for
from gaudi_cluster.nodes import slurm, srun
from gaudi_cluster.rank import procgroup
from gaudi_cluster.settings.config import ClusterConfig, resolve_config

if TYPE_CHECKING:
    import subprocess

    from gaudi_cluster.nodes.reach import Reach

# A worker's processes (role, follow, release) import only what they use: the master's side
# (release_workers: logging, ssh, the reaches) and follow's (subprocess, the agent's module name) are
# imported where they are used.

AUTO_ROLE_VARIABLE = "GAUDI_CLUSTER_AUTO_ROLE"  # `auto`'s answer, for the entrypoint it goes back to
TICK_S = 0.5
KNOCK_INTERVAL_S = 2.0
# A master that starts later than its workers (an image still being pulled on its node) still has
# its whole --wait-timeout ahead of it; give it that much and this margin.
STARTUP_MARGIN_S = 120.0


def say(text: str) -> None:
    print(f"gaudi-cluster[worker]: {text}", file=sys.stderr, flush=True)


def state_dir(config: ClusterConfig) -> Path:
    """Next to the job directories (/run/gaudi-cluster by default), as the stable hostfile is."""
    return Path(config.job_root).parent


def agents_running(proc: Path = Path("/proc")) -> bool:
    """Whether a rank agent of any job runs on this node (it watches the master's heartbeat): a
    process of its own, or a thread of the node process that hosts the node's agents (launch/node)."""
    from gaudi_cluster.wire.node_spec import AGENT_MODULE, NODE_MODULE

    hosts = (AGENT_MODULE.encode(), NODE_MODULE.encode())  # /proc/PID/cmdline is bytes
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if any(module in cmdline for module in hosts):
                return True
    return False


def knock(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when something accepts a TCP connection at host:port (a name that does not resolve: False)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    # sshd runs in this watcher's own process group, so only its pid is signalled, never the group.
    procgroup.terminate(process.pid, grace_s, done=lambda: process.poll() is not None, group=False)
    process.wait()


def follow(master: str, sshd_argv: Sequence[str], config: ClusterConfig, key: str) -> int:
    """Follow the master; without `sshd_argv` (srun mode) run no sshd and never knock."""
    import subprocess

    marker = state_dir(config) / engine.release_marker_name(key)
    watch = engine.MasterWatch(
        master,
        started_at=time.monotonic(),
        startup_timeout_s=config.wait_timeout + STARTUP_MARGIN_S,
        gone_after_s=config.heartbeat_timeout,
        knocks=bool(sshd_argv),
    )
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not stop_requested:
            say(f"{signal.Signals(signum).name}: the step is ending; waiting for the ranks here to exit")
        stop_requested.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    sshd = subprocess.Popen(list(sshd_argv), stdin=subprocess.DEVNULL) if sshd_argv else None
    how = f"sshd on port {config.ssh_port}" if sshd else "no sshd (the master starts everything by srun)"
    say(f"{how}; following the master on {master} (Slurm step {key})")
    next_knock = 0.0
    try:
        while True:
            code = sshd.poll() if sshd else None
            if code is not None and not stop_requested:
                say(f"sshd exited with code {code}; this node can take no ranks")
                return code or 1
            now = time.monotonic()
            released = marker.exists()
            running = agents_running()
            answers = None
            if not released and watch.should_knock(running) and now >= next_knock:
                answers = knock(master, config.ssh_port)
                next_knock = now + KNOCK_INTERVAL_S
            verdict = watch.observe(
                now,
                released=released,
                agents_running=running,
                master_answers=answers,
                stop_requested=bool(stop_requested),
            )
            if verdict is not None:
                say(verdict.message)
                return verdict.exit_code
            time.sleep(TICK_S)
    finally:
        if sshd is not None:
            _stop(sshd)
        with contextlib.suppress(OSError):
            marker.unlink()


def release(config: ClusterConfig, key: str, exit_code: int | None) -> int:
    directory = state_dir(config)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / engine.release_marker_name(key)
    partial = marker.with_name(marker.name + ".tmp")
    partial.write_text(f"{'' if exit_code is None else exit_code}\n")
    partial.replace(marker)
    return 0


@dataclass(frozen=True)
class ReleaseSettings:
    """What releasing the workers at the job's end reads of the settings."""

    job_root: str
    ssh_port: int
    ssh_dir: str


def release_workers(
    config: ReleaseSettings,
    environ: Mapping[str, str],
    reach: Reach | None,
    exit_code: int | None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Master side, in a Slurm step: tell the other nodes the job is over, so their tasks end.

    Whatever the outcome, even before any node was probed (`reach` None: the master makes its own).
    Nodes in `skip` (the master lost contact with them: dead, or cut off) are not tried: their task
    ends with their node or once they find the master gone, and waiting on their ssh (a name that no
    longer resolves can take the whole timeout) would only hold the master's exit. Elsewhere (docker
    run, Kubernetes) nothing happens.
    """
    import logging

    from gaudi_cluster.nodes.reach import failures

    log = logging.getLogger("gaudi_cluster.master")
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
        command = [sys.executable, "-m", "gaudi_cluster.engines.nodewatch", "release", "--key", key]
        if exit_code is not None:
            command += ["--exit-code", str(exit_code)]
        reach = reach or workers_reach(config, environ, key)
        signalled = exit_code is not None and exit_code >= 128
        if signalled and reach.refused_while_ending:
            # Stopped by a signal (scancel, the time limit) the job is ending: Slurm refuses new steps
            # then, and the workers end on the same SIGTERM, so none is tried.
            return
        failed = failures(reach.run(hosts, command, timeout_s=8, label="gc-release"))
    except (GaudiClusterError, OSError) as error:
        log.warning("could not release the Slurm step's workers: %s", error)
        return
    # Stopped by a signal, the whole step is ending and a worker whose sshd got it too has gone
    # without needing the release: that is no news.
    report = log.info if signalled else log.warning
    for host, why in failed.items():
        report("could not release %s: %s", host, why)


def workers_reach(config: ReleaseSettings, environ: Mapping[str, str], key: str) -> Reach:
    """How to reach the workers when no survey made a Reach (the master stopped before it)."""
    from gaudi_cluster.nodes import ssh
    from gaudi_cluster.nodes.reach import SrunReach, SshReach

    step = srun.step_for(environ, shutil.which("srun"))
    if step is not None:
        return SrunReach(step)
    directory = Path(config.job_root) / f"release-{key}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    identity = ssh.default_identity(Path(config.ssh_dir))
    return SshReach(ssh.write_ssh_config(directory, config.ssh_port, identity), config.ssh_port)


def resolve_role(environ: Mapping[str, str]) -> tuple[engine.AutoRole, str]:
    """This node's role and how the master reaches the nodes (srun | ssh); the reasons go to stderr."""
    found = engine.auto_role(environ, {socket.gethostname(), socket.getfqdn()})
    launch = srun.launch_mode(environ, shutil.which("srun"))
    via = f"; nodes reached by {launch}" if found.engine == engine.SLURM else ""
    print(f"gaudi-cluster[entrypoint]: role auto: {found.role} ({found.reason}){via}", file=sys.stderr)
    return found, launch


def role_answer(found: engine.AutoRole, launch: str) -> str:
    """`ROLE ENGINE MASTER_HOST|- srun|ssh`: what the entrypoint reads."""
    return f"{found.role} {found.engine} {found.master_host or '-'} {launch}"


def auto(entrypoint: str, job: Sequence[str], config: ClusterConfig) -> NoReturn:
    """The entrypoint's role `auto`: a Slurm worker reached by srun steps follows its master in this
    very process (one interpreter a node, not one to decide and one to wait); any other answer goes
    back to the entrypoint, which runs that role."""
    found, launch = resolve_role(os.environ)
    key = slurm.run_key(os.environ)
    if found.role == engine.WORKER and found.engine == engine.SLURM and launch == srun.SRUN and key:
        if job:
            print(f"gaudi-cluster[entrypoint]: auto: this node is a worker; the job arguments are the "
                  f"master's: {' '.join(job)}", file=sys.stderr)  # fmt: skip
        assert found.master_host is not None  # a Slurm worker's master is the step's first host
        Path(config.job_root).mkdir(parents=True, exist_ok=True)
        _exit_quietly(follow(found.master_host, [], config, key))
    os.environ[AUTO_ROLE_VARIABLE] = role_answer(found, launch)
    os.execv(entrypoint, [entrypoint, "auto", *job])


def _exit_quietly(code: int) -> NoReturn:
    # Exit without interpreter shutdown: it restores SIGTERM's default action, and srun's
    # --kill-on-bad-exit (after the master's non-zero exit) may SIGTERM this task just then; a
    # task killed by a signal would replace the master's exit code as the job's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster.engines.nodewatch")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("role", help="print the role `auto` resolves to: ROLE ENGINE MASTER_HOST|-")
    auto_parser = sub.add_parser("auto", help="the entrypoint's role auto (follows here as a Slurm worker)")
    auto_parser.add_argument("--entrypoint", required=True, help="where to go back for any other role")
    auto_parser.add_argument("job", nargs=argparse.REMAINDER)
    follow_parser = sub.add_parser("follow", help="run sshd until the master releases this node")
    follow_parser.add_argument("--master", required=True)
    follow_parser.add_argument("--srun", action="store_true", help="no sshd: the master uses srun steps")
    follow_parser.add_argument("sshd", nargs=argparse.REMAINDER)
    release_parser = sub.add_parser("release", help="release this node (run by the master over ssh)")
    release_parser.add_argument("--key", required=True)
    release_parser.add_argument("--exit-code", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        config = resolve_config({}, os.environ)
        if args.command == "role":
            print(role_answer(*resolve_role(os.environ)))
            return 0
        if args.command == "auto":
            auto(args.entrypoint, args.job[1:] if args.job[:1] == ["--"] else args.job, config)
        if args.command == "release":
            return release(config, args.key, args.exit_code)
        sshd_argv = args.sshd[1:] if args.sshd[:1] == ["--"] else args.sshd
        key = slurm.run_key(os.environ)
        if bool(sshd_argv) == args.srun or key is None:
            parser.error(
                "follow needs SSHD_ARGV after -- (or --srun, not both) and a Slurm step (SLURM_JOB_ID)"
            )
        _exit_quietly(follow(args.master, sshd_argv, config, key))
    except GaudiClusterError as error:
        print(error_line(error), file=sys.stderr)
        return exit_code_for(error)


if __name__ == "__main__":
    sys.exit(main())
