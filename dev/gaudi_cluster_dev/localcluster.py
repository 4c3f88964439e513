"""A simulated cluster on one Docker host: a master and N workers on a private network.

Used by `make demo`, the cluster tests and the benchmarks (one harness, so what the tests prove
is what the demo runs). It drives the docker CLI; every container and the network carry the label
gaudi-cluster.cluster=<name> so that `remove()` (also called on Ctrl-C) leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LABEL = "gaudi-cluster.cluster"
KEY_MOUNT = "/run/secrets/gaudi-cluster"
MAKE_KEYS = Path(__file__).resolve().parents[2] / "scripts" / "make-keys.sh"
# The network alias every worker answers to: the DNS name the master finds the workers by, and so the
# name each worker's certificate must carry (the master checks nodes found by DNS against it).
WORKER_ALIAS = "worker"
OUTPUT_MOUNT = "/workspace/output"
HEALTH_CHECK = "/opt/gaudi-cluster/entrypoint/healthcheck.sh"


def docker(
    *args: str, check: bool = True, timeout: float = 120, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], check=check, text=True, capture_output=capture, timeout=timeout)


def engine_answers() -> bool:
    try:
        return docker("info", check=False, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class LocalCluster:
    image: str
    key_dir: Path
    workers: int = 2
    slots: int = 1
    name: str = field(default_factory=lambda: "gc-" + uuid.uuid4().hex[:8])
    output_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Compose and production use --privileged; plain containers need no extra capability here.
    run_args: list[str] = field(default_factory=list)
    # docker run arguments of one worker only, by its index (1-based), e.g. a small tmpfs for a full disk
    worker_args: dict[int, list[str]] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    @property
    def network(self) -> str:
        return f"{self.name}-net"

    @property
    def master(self) -> str:
        return f"{self.name}-master"

    def worker(self, index: int) -> str:
        return f"{self.name}-worker-{index}"

    @property
    def worker_names(self) -> list[str]:
        return [self.worker(i) for i in range(1, self.workers + 1)]

    def create_network(self) -> None:
        # Internal: the training fabric is not published to the host or the outside.
        docker("network", "create", "--internal", "--label", f"{LABEL}={self.name}", self.network)

    def keys_for(self, role: str, name: str = "") -> Path:
        """What a node mounts of make keys' directory (never all of it: the host CA stays here): the
        master its master/ part, a worker its own nodes/<container name>/, made here when the directory
        holds the CA, certified for that name and for the alias the master finds it by (WORKER_ALIAS).
        No two nodes mount the same host key; a worker with none of its own is refused here."""
        if role == "master":
            return self.key_dir / "master" if (self.key_dir / "master").is_dir() else self.key_dir
        if (self.key_dir / "ca" / "host_ca").is_file():
            return node_keys(self.key_dir, name, WORKER_ALIAS)
        own = self.key_dir / "nodes" / name
        if own.is_dir():
            return own
        if any((self.key_dir / part).exists() for part in ("master", "nodes", "ssh_host_ed25519_key")):
            raise RuntimeError(
                f"no host key of its own for worker {name} in {self.key_dir}/nodes; fix: make keys "
                f"NAMES={name},{WORKER_ALIAS} with the host CA (or give key_dir the whole .keys)"
            )
        return self.key_dir  # a directory of this worker's own, with no host key: it makes one at start

    def _common_args(self, name: str, hostname: str, role: str = "master") -> list[str]:
        args = [
            "--name",
            name,
            "--hostname",
            hostname,
            "--network",
            self.network,
            "--label",
            f"{LABEL}={self.name}",
            "--shm-size",
            "1g",
            "-v",
            f"{self.keys_for(role, name).resolve()}:{KEY_MOUNT}:ro",
            "-e",
            f"GAUDI_CLUSTER_SLOTS={self.slots}",
            *self.run_args,
        ]
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        return args

    def start_workers(self, names: Sequence[str] | None = None) -> None:
        for index, name in enumerate(names or self.worker_names, start=1):
            args = [*self._common_args(name, f"worker-{index}", "worker"), *self.worker_args.get(index, [])]
            docker("run", "-d", *args, "--network-alias", WORKER_ALIAS, self.image, "worker")
            self.started.append(name)

    def wait_healthy(self, names: Sequence[str], timeout_s: float = 60) -> float:
        """Seconds until the image's health check passes in every container; raises with their logs otherwise.

        The check is run here on demand rather than read from Docker's status, which Docker only
        refreshes every HEALTHCHECK interval (15 s).
        """
        start = time.monotonic()
        waiting = list(names)
        while waiting and time.monotonic() - start < timeout_s:
            waiting = [n for n in waiting if not self.passes_health_check(n)]
            gone = [n for n in waiting if self.state(n) != "running"]
            if gone:
                raise RuntimeError(f"exited before turning healthy: {', '.join(gone)}\n{self.all_logs()}")
            if waiting:
                time.sleep(0.2)
        if waiting:
            raise RuntimeError(f"not healthy after {timeout_s:.0f}s: {', '.join(waiting)}\n{self.all_logs()}")
        return time.monotonic() - start

    def passes_health_check(self, name: str) -> bool:
        done = docker("exec", name, HEALTH_CHECK, check=False)
        return done.returncode == 0

    def state(self, name: str) -> str:
        done = docker("inspect", "-f", "{{.State.Status}}", name, check=False)
        return done.stdout.strip() if done.returncode == 0 else "missing"

    def health(self, name: str) -> str:
        done = docker(
            "inspect",
            "-f",
            "{{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.Status}}",
            name,
            check=False,
        )
        return done.stdout.split()[0] if done.returncode == 0 and done.stdout.split() else "missing"

    def master_args(self, extra_env: dict[str, str] | None = None) -> list[str]:
        args = self._common_args(self.master, "master")
        args += [
            "-e",
            f"GAUDI_CLUSTER_PEERS_DNS={WORKER_ALIAS}",
            "-e",
            f"GAUDI_CLUSTER_NODES={self.workers + 1}",
        ]
        for key, value in (extra_env or {}).items():
            args += ["-e", f"{key}={value}"]
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            args += ["-v", f"{self.output_dir.resolve()}:{OUTPUT_MOUNT}"]
        return args

    def start_master(
        self, job: Sequence[str] = (), extra_env: dict[str, str] | None = None, role: str = "master"
    ) -> None:
        """Start the master detached; follow it with wait_master()."""
        docker("run", "-d", *self.master_args(extra_env), self.image, role, *job)
        self.started.append(self.master)

    def run_master_attached(self, job: Sequence[str] = (), extra_env: dict[str, str] | None = None) -> int:
        """Run the master in the foreground (output streamed); Ctrl-C reaches it through docker."""
        self.started.append(self.master)
        return subprocess.run(
            ["docker", "run", *self.master_args(extra_env), self.image, "master", *job], check=False
        ).returncode

    def wait_master(self, timeout_s: float = 600) -> int:
        done = docker("wait", self.master, timeout=timeout_s)
        return int(done.stdout.strip())

    def logs(self, name: str) -> str:
        done = docker("logs", name, check=False, timeout=30)
        return done.stdout + done.stderr

    def all_logs(self) -> str:
        return "\n".join(f"===== {name} =====\n{self.logs(name)}" for name in self.started)

    def exec(self, name: str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return docker("exec", name, *command, check=False, timeout=timeout)

    def ip_of(self, name: str) -> str:
        return docker(
            "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}', name
        ).stdout.strip()

    def remove(self) -> None:
        ids = docker("ps", "-aq", "--filter", f"label={LABEL}={self.name}", check=False).stdout.split()
        if ids:
            docker("rm", "-f", *ids, check=False, timeout=120)
        docker("network", "rm", self.network, check=False)


def ensure_keys(key_dir: Path) -> None:
    if not (key_dir / "id_ed25519").exists():
        subprocess.run([str(MAKE_KEYS), str(key_dir)], check=True)


def node_keys(key_dir: Path, name: str, *also: str) -> Path:
    """nodes/NAME of make keys' directory (which holds the host CA): NAME's own host key (kept when there),
    certified for NAME and for `also` (the DNS name the master finds it by)."""
    subprocess.run([str(MAKE_KEYS), str(key_dir), ",".join((name, *also))], check=True, capture_output=True)
    return key_dir / "nodes" / name


def _summary(output: Path, nodes: int, ranks: int) -> str:
    def load(path: Path) -> dict:
        return json.loads(path.read_text()) if path.exists() else {}

    train, evaluation = load(output / "train_results.json"), load(output / "eval_results.json")
    states = sorted(
        output.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    history = load(states[-1]).get("log_history", []) if states else []
    losses = [entry["loss"] for entry in history if "loss" in entry]
    loss = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "?"
    return "\n".join(
        [
            "",
            "gaudi-cluster demo summary",
            f"  nodes {nodes}, ranks {ranks}",
            f"  train samples/s (cluster) {train.get('train_samples_per_second', '?')}, "
            f"runtime {train.get('train_runtime', '?')} s",
            f"  loss first -> last logged: {loss}",
            f"  eval loss {evaluation.get('eval_loss', '?')}, "
            f"perplexity {evaluation.get('perplexity', '?')} (one node)",
            f"  results, plot (training_curves.png) and checkpoints in {output}",
            f"  job report: {output / 'job_report.json'} and {output / 'job_report.png'} "
            "(phases, throughput, per-rank step times, stragglers)",
        ]
    )


def demo(image: str, workers: int, output: Path, key_dir: Path) -> int:
    """`make demo`: train across a master and workers, evaluate on one node, summarize, tear down."""
    if not engine_answers():
        print(
            "demo: error: no Docker engine answers; fix: start one (scripts/start-docker-engine.sh)",
            file=sys.stderr,
        )
        return 2
    ensure_keys(key_dir)
    if output.exists():
        subprocess.run(["rm", "-rf", str(output)], check=True)
    cluster = LocalCluster(image=image, key_dir=key_dir, workers=workers, output_dir=output)
    try:
        cluster.create_network()
        cluster.start_workers()
        cluster.wait_healthy(cluster.worker_names)
        code = cluster.run_master_attached()
        if code != 0:
            print(f"demo: training failed with exit code {code}", file=sys.stderr)
            return code
        # The seed evaluates on one node, after training, from the output directory.
        evaluation = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "-v",
                f"{output.resolve()}:{OUTPUT_MOUNT}",
                # its events into a file, like the cluster's (the console shows results, not machinery)
                "-e",
                f"GAUDI_CLUSTER_EVENTS_FILE={OUTPUT_MOUNT}/eval-events.jsonl",
                image,
                "python",
                "-u",
                "/opt/gaudi-cluster/app/train/run_clm.py",
                "--model_name_or_path",
                OUTPUT_MOUNT,
                "--do_eval",
                "--output_dir",
                OUTPUT_MOUNT,
                "--per_device_eval_batch_size",
                "8",
            ],
            check=False,
        ).returncode
        if evaluation != 0:
            print(f"demo: evaluation failed with exit code {evaluation}", file=sys.stderr)
            return evaluation
        print(_summary(output, workers + 1, workers + 1))
        return 0
    except KeyboardInterrupt:
        print("demo: interrupted; tearing the cluster down", file=sys.stderr)
        return 130
    finally:
        cluster.remove()


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster_dev.localcluster")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "demo", help="train across a local master and workers, evaluate, summarize, tear down"
    )
    run.add_argument("--image", default=os.environ.get("GAUDI_CLUSTER_IMAGE", "gaudi-cluster:cpu"))
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--output", type=Path, default=Path("build/demo-output"))
    run.add_argument("--keys", type=Path, default=Path(".keys"))
    args = parser.parse_args(argv)
    return demo(args.image, args.workers, args.output, args.keys)


if __name__ == "__main__":
    sys.exit(main())
