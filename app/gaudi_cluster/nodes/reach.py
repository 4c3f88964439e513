"""Master: one way to run a command on many nodes at once, whatever carries it (the Reach).

The survey picks one Reach and every later phase (unstaging, reaping, the checkpoint handover, the
workers' release) runs through it: `LocalReach` (the only node is this one), `SshReach` (one shared
ssh connection per node, nodes/ssh) and `SrunReach` (one srun step for all nodes inside a Slurm
allocation, nodes/srun). The node process of the next issues (a daemon that dials the master and does
what ssh does after the launch) is one more implementation, nothing else changes. The shape is
SkyPilot's CommandRunner and Ray's command runner: argv in, a reply per node out, never a shell
branch per transport in the phases.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gaudi_cluster.nodes import parallel, srun, ssh
from gaudi_cluster.nodes.srun import SrunStep

log = logging.getLogger("gaudi_cluster.nodes.reach")

StdinOf = Callable[[str], str]  # a node's stdin, by host (a node's own key goes to that node only)


@dataclass(frozen=True)
class Reply:
    """What one node answered: whether the command succeeded there, its output lines, why not."""

    host: str
    ok: bool
    lines: tuple[str, ...] = ()  # under srun: the lines a task printed after naming its node
    why: str = ""  # the cause and the fix, in words ('' when ok)


class Reach(Protocol):
    """Runs one argv on many nodes at once and answers per node; `close` ends what it holds open."""

    how: str  # how the master reaches the nodes, for the log: "over ssh", "locally", "by srun (...)"
    # Whether every node gets the same stdin (an srun step's --input=all): per-node values then travel
    # as one bundle each node takes its own entry from (wire/private_payload PayloadBundle).
    shared_stdin: bool
    # Whether a run is refused once the job is ending on a stop signal (Slurm starts no new step of a
    # job being cancelled or past its time limit): nothing is tried then.
    refused_while_ending: bool

    def run(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        stdin_of: StdinOf | None = None,
        timeout_s: float = 30.0,
        label: str = "gc-run",
    ) -> dict[str, Reply]: ...

    def release(self) -> None:
        """The job's ranks are in: hold nothing open for them (a later run connects anew)."""
        ...

    def close(self) -> None: ...


def failures(replies: Mapping[str, Reply]) -> dict[str, str]:
    """Why the command failed, by host (empty when it succeeded everywhere)."""
    return {host: reply.why for host, reply in replies.items() if not reply.ok}


def _why_exit(code: int, stderr: str) -> str:
    if code == 124:
        return "timed out"
    tail = stderr.strip().splitlines()[-1:] or ["no output"]
    return f"exit code {code}: {tail[0][-200:]}"


class LocalReach:
    """The only node is this machine: its commands run here, as children (nodes/parallel)."""

    how = "locally"
    shared_stdin = False
    refused_while_ending = False

    def run(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        stdin_of: StdinOf | None = None,
        timeout_s: float = 30.0,
        label: str = "gc-run",
    ) -> dict[str, Reply]:
        finished = parallel.run_all({host: list(argv) for host in hosts}, timeout_s, stdin_of)
        return {
            host: Reply(host, done.returncode == 0, tuple(done.stdout.splitlines()), _why(done))
            for host, done in finished.items()
        }

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None


def _why(done: parallel.Finished) -> str:
    return "" if done.returncode == 0 else _why_exit(done.returncode, done.stderr)


@dataclass
class SshReach:
    """ssh to every node (BatchMode, the job's own client config): each session rides on the node's one
    shared connection once `open` made it; `close` ends those connections and removes their sockets."""

    config: Path  # the job's ssh client config (nodes/ssh.write_ssh_config)
    port: int  # for the failure's words
    control_dir: Path | None = None  # the shared connections' sockets
    opened: set[str] = field(default_factory=set)
    host_key_name: str | None = None  # the DNS name the nodes' certificates name (ssh HostKeyAlias)
    how = "over ssh"
    shared_stdin = False
    refused_while_ending = False

    def open(self, hosts: Sequence[str], timeout_s: float) -> None:
        """One shared connection per node, all at once (a node where it fails is reached on its own)."""
        ssh.open_connections(hosts, self.config, timeout_s)
        self.opened.update(hosts)

    def run(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        stdin_of: StdinOf | None = None,
        timeout_s: float = 30.0,
        label: str = "gc-run",
    ) -> dict[str, Reply]:
        # A short run (a reap, a release) must not wait on a dead node's connect for its whole limit.
        connect_timeout_s = max(1, int(timeout_s // 3)) if timeout_s < 15 else None
        results = ssh.run_on_hosts(hosts, argv, self.config, timeout_s, connect_timeout_s, stdin_of)
        return {
            host: Reply(
                host,
                result.ok,
                tuple(result.stdout.splitlines()),
                "" if result.ok else ssh.explain_ssh_failure(result, self.port),
            )
            for host, result in results.items()
        }

    def release(self) -> None:
        """Once the ranks are in, the shared connections stop taking sessions and end with their last
        one (the launch sessions end once their node's ranks are seated): at 1,000 nodes that is
        1,000 ssh processes the master does not keep for the job. A later run (a reap, the release,
        a checkpoint hand-over) connects on its own."""
        if self.opened:
            ssh.close_connections(sorted(self.opened), self.config, how="stop")
            self.opened.clear()

    def close(self) -> None:
        """Close the shared ssh connections and remove their sockets (idempotent)."""
        if self.control_dir is not None and self.control_dir.exists():
            ssh.close_connections(sorted(self.opened), self.config)
            shutil.rmtree(self.control_dir, ignore_errors=True)
        self.opened.clear()


@dataclass(frozen=True)
class SrunReach:
    """Inside a Slurm allocation: one srun step for all the nodes (never one per node), labelled, so each
    task's lines come back by the node it names (Slurm numbers tasks in its own node order)."""

    step: SrunStep
    shared_stdin = True
    refused_while_ending = True

    @property
    def how(self) -> str:
        return f"by srun (Slurm job {self.step.job_id})"

    def run(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        stdin_of: StdinOf | None = None,
        timeout_s: float = 30.0,
        label: str = "gc-run",
    ) -> dict[str, Reply]:
        if not hosts:
            return {}
        stdin = None
        if stdin_of is not None:
            texts = {stdin_of(host) for host in hosts}
            if len(texts) != 1:
                raise ValueError("an srun step gives every node the same stdin: send one bundle")
            stdin = texts.pop()
        command = [*self.step.argv(hosts, label, stdin=stdin is not None, label=True), *argv]
        done = parallel.run_all({label: command}, timeout_s, lambda _key: stdin)[label]
        outputs = srun.outputs_by_node(done.stdout)
        errors = srun.task_errors(done.stderr)
        replies = {}
        for host in hosts:
            # srun names each task that failed; a step that failed without naming any failed everywhere
            failed = host in errors or (done.returncode != 0 and not errors)
            why = _why_step(host, done, errors) if failed else ""
            replies[host] = Reply(host, not failed, tuple(outputs.get(host, ())), why)
        return replies

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None


def _why_step(host: str, done: parallel.Finished, errors: Mapping[str, str]) -> str:
    if host in errors:
        return f"srun: {errors[host]}"
    if done.returncode == 124:
        return f"the srun step timed out ({done.stderr.strip()[-200:]})"
    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
    return f"srun step exited with code {done.returncode}: {tail[0][-200:]}"
