"""A real Slurm 22.05 cluster in containers for tests/slurm: one controller and three nodes.

The nodes are containers of the image under test plus Debian 12's Slurm and munge (the test-only layer
in tests/slurm/Dockerfile, never shipped), on an internal network, named node1-node3 as in
tests/slurm/slurm.conf. The munge key is made per cluster and mounted read-only; so is the cluster key
pair (as on real nodes). Jobs are the shipped slurm/gaudi-cluster.sbatch, submitted on the controller
in `direct` mode: the nodes are node containers already, so each task runs the image's entrypoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import node_keys

from tests.support.docker import LABEL, ROOT, SSH_DIR, docker, wait_until

SLURM_TEST_DIR = ROOT / "tests" / "slurm"
NODES = ("node1", "node2", "node3")
CONTROLLER = "slurmctl"
SBATCH = "/opt/gaudi-cluster-slurm/gaudi-cluster.sbatch"
OUTPUT_MOUNT = "/workspace/output"
# Where the batch script writes its output (--chdir on the first node, where the batch step runs).
JOB_DIR = "/tmp"


def slurm_image_tag(image: str) -> str:
    return "gaudi-cluster-slurm-test:" + re.sub(r"[^A-Za-z0-9_.-]", "-", image)[-100:]


@dataclass
class SlurmCluster:
    image: str
    keys: Path
    workdir: Path
    nodes: tuple[str, ...] = NODES  # more than three: a slurm.conf for them is mounted (bench/slurm_launch)
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started: list[str] = field(default_factory=list)
    start_seconds: float = 0.0

    @property
    def network(self) -> str:
        return f"gc-slurm-{self.session}"

    def container(self, host: str) -> str:
        return f"gc-slurm-{self.session}-{host}"

    def output_dir(self, node: str) -> Path:
        return self.workdir / "output" / node

    def start(self) -> None:
        began = time.monotonic()
        munge = self.workdir / "munge"
        munge.mkdir()
        (munge / "munge.key").write_bytes(os.urandom(1024))
        docker("network", "create", "--internal", "--label", LABEL, self.network)
        # No HEALTHCHECK: it is a docker exec every 15 s per node, and nothing here reads it.
        common = [
            "--network", self.network, "--label", LABEL, "--no-healthcheck",
            "-v", f"{munge}:/run/slurm-test:ro",
        ]  # fmt: skip
        if self.nodes != NODES:
            conf = self.workdir / "slurm.conf"
            shipped = (SLURM_TEST_DIR / "slurm.conf").read_text()
            conf.write_text(shipped.replace("NodeName=node[1-3]", f"NodeName=node[1-{len(self.nodes)}]"))
            common += ["-v", f"{conf}:/etc/slurm/slurm.conf:ro"]
        self._run(
            CONTROLLER,
            [*common, "-v", f"{ROOT / 'slurm'}:/opt/gaudi-cluster-slurm:ro"],
            "controller",
        )
        for index, node in enumerate(self.nodes):
            output = self.output_dir(node)
            output.mkdir(parents=True)
            output.chmod(0o777)
            # Each node mounts its part of make keys' directory, never the host CA: the first node (Slurm
            # node 0, the master) master/, each other its own nodes/<host name>/ (made here).
            if index == 0:
                keys = self.keys / "master" if (self.keys / "master").is_dir() else self.keys
            else:
                keys = node_keys(self.keys, node)
            mounts = ["-v", f"{keys}:{SSH_DIR}:ro", "-v", f"{output}:{OUTPUT_MOUNT}"]
            self._run(node, [*common, "--shm-size", "1g", *mounts], "node")
        if not wait_until(self.all_idle, timeout=90, interval=0.3):
            pytest.fail(f"the Slurm cluster did not come up:\n{self.sinfo()}\n{self.all_logs()}")
        self.start_seconds = time.monotonic() - began
        print(f"\nSlurm cluster (controller + {len(self.nodes)} nodes) up in {self.start_seconds:.1f}s")

    def _run(self, host: str, args: list[str], part: str) -> None:
        name = self.container(host)
        docker(
            "run", "-d", "--name", name, "--hostname", host, "--network-alias", host, *args,
            self.image, "/opt/slurm-test/start-slurm.sh", part,
        )  # fmt: skip
        self.started.append(name)

    def exec(
        self, host: str, *command: str, timeout: float = 60, check: bool = False, stdin: str | None = None
    ):
        interactive = ["-i"] if stdin is not None else []
        return docker(
            "exec", *interactive, self.container(host), *command, timeout=timeout, check=check, input=stdin
        )

    def sinfo(self) -> str:
        return self.exec(CONTROLLER, "sinfo", "-h", "-o", "%T %D").stdout

    def all_idle(self) -> bool:
        return self.sinfo().split() == ["idle", str(len(self.nodes))]

    def submit(
        self, *job: str, env: dict[str, str] | None = None, secrets: dict[str, str] | None = None
    ) -> int:
        """sbatch -N3 the shipped script in direct mode; the job id. `secrets` reach sbatch's environment
        by name (docker exec -e NAME), as a user's exported HF_TOKEN would: never on a command line."""
        # --tee: the tests read which node each rank ran on from the console (rank 0's lines only by default).
        settings = {"GAUDI_CLUSTER_SLURM_MODE": "direct", "GAUDI_CLUSTER_TEE": "1", **(env or {})}
        exports = ",".join(["ALL", *(f"{key}={value}" for key, value in settings.items())])
        by_name = [word for name in (secrets or {}) for word in ("-e", name)]
        done = docker(
            "exec", *by_name, self.container(CONTROLLER),
            "sbatch", "--parsable", f"-N{len(self.nodes)}", f"--chdir={JOB_DIR}", f"--export={exports}",
            SBATCH, *job,
            check=True, env={**os.environ, **(secrets or {})},
        )  # fmt: skip
        return int(done.stdout.strip().split(";")[0])

    def cancel_leftovers(self) -> None:
        """scancel what a failed test left queued or running, so the next test gets the nodes."""
        queued = self.exec(CONTROLLER, "squeue", "--noheader", "--format=%i").stdout.split()
        if queued:
            self.exec(CONTROLLER, "scancel", *queued)
            wait_until(lambda: not self.exec(CONTROLLER, "squeue", "--noheader").stdout.strip(), 60)

    def job_field(self, job: int, name: str) -> str:
        out = self.exec(CONTROLLER, "scontrol", "show", "job", str(job)).stdout
        match = re.search(rf"\b{name}=(\S+)", out)
        return match.group(1) if match else ""

    def wait_for_end(self, job: int, timeout: float) -> str:
        """The job's final state (anything but PENDING/RUNNING/COMPLETING), or '' on timeout."""
        ended = wait_until(
            lambda: self.job_field(job, "JobState") not in ("", "PENDING", "RUNNING", "COMPLETING"),
            timeout=timeout,
            interval=1.0,
        )
        return self.job_field(job, "JobState") if ended else ""

    def output(self, job: int) -> str:
        """The batch output (every task's stdout and stderr), on the first node."""
        return self.exec(self.nodes[0], "cat", f"{JOB_DIR}/gaudi-cluster-{job}.out").stdout

    def wait_for_output(self, job: int, pattern: str, timeout: float) -> bool:
        return wait_until(lambda: re.search(pattern, self.output(job)) is not None, timeout, interval=1.0)

    def job_processes(self, node: str) -> list[str]:
        """Our processes of a job on a node: ranks, agents, launchers, the node task and its sshd.

        Not Slurm's own (srun, which waits for a dead node until slurmctld declares it down) nor the
        container's daemons.
        """
        # The parent, state and age say what a leftover is (a zygote's forked rank shows its command line).
        done = self.exec(node, "ps", "-eo", "pid,ppid,stat,etimes,comm,args", "--no-headers")
        markers = ("gaudi_cluster", "gaudi-cluster", "run_clm", "deepspeed", "sshd", "entrypoint.sh auto")
        ours = []
        for line in done.stdout.splitlines():
            command, args = [*line.split(None, 5), "", "", "", "", "", ""][4:6]
            if command in ("srun", "slurmstepd") or "start-slurm.sh" in args:
                continue
            if any(marker in args for marker in markers):
                ours.append(line)
        return ours

    def rank_logs(self, lines: int = 15) -> str:
        """The last lines of every rank log of the newest job on each node (for failure messages)."""
        script = (
            "d=$(ls -td /run/gaudi-cluster/jobs/*/ 2>/dev/null | head -1); "
            'for f in "$d"rank*.log; do [ -e "$f" ] && echo "== $f" && tail -n ' + str(lines) + ' "$f"; done'
        )
        return "\n".join(f"--- {node}\n{self.exec(node, 'bash', '-c', script).stdout}" for node in self.nodes)

    def kill(self, node: str) -> None:
        docker("kill", self.container(node))

    def logs(self, name: str) -> str:
        done = docker("logs", name, check=False)
        return done.stdout + done.stderr

    def all_logs(self) -> str:
        return "\n".join(f"===== {name} =====\n{self.logs(name)[-4000:]}" for name in self.started)

    def remove(self) -> None:
        if self.started:
            docker("rm", "-f", "-v", *self.started, check=False, timeout=120)
        docker("network", "rm", self.network, check=False)


# ssh clients and servers by their command name (ps's comm: `sshd: root@notty` sessions included).
SSH_COMMANDS = ("ssh", "sshd", "sshd-session")
NODEWATCH_MODULE = "gaudi_cluster.engines.nodewatch"
NODE_TASK_COMMANDS = ("auto", "role", "follow")
RELAY_MODULE = "gaudi_cluster.rank.relay"
AGENT_MODULE = "gaudi_cluster.rank.agent"


@dataclass
class SshWatch:
    """Samples `ps` in every node container, one node after another, until stopped: every ssh or
    sshd process seen, the `nodewatch` commands each node's task under the main step ran, the nodes
    where a node relay or a rank agent ran as a process of its own, and how many samples each node
    answered (a watch that saw nothing proves nothing)."""

    cluster: SlurmCluster
    interval_s: float = 0.5
    seen: list[str] = field(default_factory=list)
    nodewatch: dict[str, set[str]] = field(default_factory=dict)
    relay_processes: set[str] = field(default_factory=set)  # nodes where a relay ran as a process
    agent_processes: set[str] = field(default_factory=set)  # nodes where a rank agent ran as one
    samples: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SshWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in self.cluster.nodes:
                try:
                    done = self.cluster.exec(node, "ps", "-eo", "pid=,comm=,args=")
                except subprocess.TimeoutExpired:
                    continue
                if done.returncode != 0:
                    continue
                self.samples[node] = self.samples.get(node, 0) + 1
                for line in done.stdout.splitlines():
                    parts = line.split(None, 2)
                    if len(parts) >= 2 and parts[1] in SSH_COMMANDS:
                        self.seen.append(f"{node}: {line.strip()}")
                    words = parts[2].split() if len(parts) == 3 else []
                    if RELAY_MODULE in words:
                        self.relay_processes.add(node)
                    if AGENT_MODULE in words:
                        self.agent_processes.add(node)
                    if NODEWATCH_MODULE in words and words.index(NODEWATCH_MODULE) + 1 < len(words):
                        command = words[words.index(NODEWATCH_MODULE) + 1]
                        if command in NODE_TASK_COMMANDS:  # not `release`: the master's step at the end
                            self.nodewatch.setdefault(node, set()).add(command)
            self._stop.wait(self.interval_s)
