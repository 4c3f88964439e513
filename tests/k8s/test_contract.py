"""The runtime contract of k8s/ (docs/kubernetes.md), exercised with Docker instead of a cluster.

Containers are named, given hostnames and DNS aliases exactly as Kubernetes names the pods (Docker's
DNS answers dotted aliases, and one alias shared by several containers returns all their addresses,
like a headless Service). They get the args, environment and mount paths of the rendered manifests,
plus what the controllers add: for the MPI Operator its hostfile, its variables and its ssh Secret (an
ECDSA P-521 key in PEM form named id_rsa, mode 0644, behind the `..data` symlinks of a Secret
volume, which no pod's sshd may admit); for the Indexed Job the completion index. Our Secrets are made
as docs/kubernetes.md makes them (the per-pod host keys by scripts/k8s-host-keys.sh), and
our key directories are built from the manifests' own volumes: the MPIJob launcher's projected volume,
each MPIJob worker's and each Indexed Job pod's `keys` init container run before it with its hostname.
Every container gets the manifest's securityContext as Docker options (no-new-privileges,
capabilities, sysctls; Docker's default seccomp profile). The workers start 15 s after the master, so
their names do not resolve yet when it starts. The job must train on every node; no worker may hold
the client key; every pod's sshd (an Indexed Job pod's, an MPIJob worker's) answers with its own host
key, and a worker at another worker's name with its own certified key is refused by host key.

What is not imitated: scheduling, readiness gates (WaitForWorkersReady would start the launcher only
after the workers; starting it first is the harder case), and Gaudi: slots are 1 per node on CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.kubelet import (
    OPERATOR_ITEMS,
    key_blob,
    operator_secret,
    projected_volume,
    secret_volume,
    security_flags,
    volume_mounts,
)
from tests.support.docker import LABEL, ROOT, docker
from tests.support.kubernetes import kustomize
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NAMESPACE = "default"
# The master's log line before its first look for peers (nodes/find) and before its first knock on
# their sshd (nodes/survey): the workers start only once it is there, so they are late for certain.
WAITING_FOR_PEERS = re.compile(r"waiting for (peers via|sshd on port)")
SCRIPT = "/opt/gaudi-cluster/app/train/run_clm.py"
# A short training run: the contract is about who runs where, not about convergence.
JOB = [SCRIPT, "--do_train", "--output_dir", "/workspace/output", "--deepspeed", "ds_cpu",
       "--max_steps", "4", "--save_steps", "4", "--logging_steps", "1"]  # fmt: skip
RANK_LINE = re.compile(r"^\[(?P<host>[\w.-]+) rank (?P<rank>\d+)\] ", re.MULTILINE)
# How long the master may wait for its peers here (the manifests' 900 s is for pulling images).
WAIT_TIMEOUT = "180"
HF_TOKEN_SECRET = "gaudi-cluster-hf-token"
TOKEN = "hf_dummyKubernetesToken0123456789"
# Run in a pod while the job runs: every process's argv, and rank 0's HF_TOKEN (None: no rank 0 yet).
SNAPSHOT = r"""
import json, os
found = {"argv": [], "rank0_token": None}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        raw = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError:
        continue
    env = dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)
    found["argv"].append(argv)
    if env.get("RANK") == "0" and "run_clm" in argv and "gaudi_cluster" not in argv:  # not its agent
        found["rank0_token"] = env.get("HF_TOKEN", "")
print(json.dumps(found))
"""


def rank_hosts(log: str) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for match in RANK_LINE.finditer(log):
        seen.setdefault(int(match["rank"]), set()).add(match["host"])
    return seen


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def container_env(container: dict[str, Any], settings: dict[str, str]) -> dict[str, str]:
    """What the container's environment holds: its envFrom ConfigMap, then its own env."""
    env = dict(settings)
    env.update({item["name"]: item["value"] for item in container.get("env", []) if "value" in item})
    return env


def secret_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's env taken from Secrets (valueFrom.secretKeyRef); an optional one that is
    missing is left out, as the kubelet does."""
    env = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            continue
        value = secrets.get(ref["name"], {}).get(ref["key"])
        assert value is not None or ref.get("optional"), ref
        if value is not None:
            env[item["name"]] = value
    return env


def volume_of(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod_spec["volumes"] if v["name"] == name]
    return found


def settings_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    config = only(docs, "ConfigMap")
    assert config["metadata"]["name"].startswith("gaudi-cluster-settings")
    # --tee: the tests read which pod each rank ran in from the console (rank 0's lines only by default).
    return {**config["data"], "GAUDI_CLUSTER_WAIT_TIMEOUT": WAIT_TIMEOUT, "GAUDI_CLUSTER_TEE": "1"}


class Pods:
    """Containers standing in for pods on one internal network; removed at the end."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.session = uuid.uuid4().hex[:8]
        self.network = f"gc-k8s-{self.session}"
        self.names: list[str] = []
        docker("network", "create", "--internal", "--label", LABEL, self.network)

    def run(
        self,
        hostname: str,
        aliases: list[str],
        env: dict[str, str],
        mounts: list[str],
        args: list[str],
        security: list[str],
        secrets: dict[str, str] | None = None,
    ) -> str:
        """`secrets` go into the container by name (docker run -e NAME), never on a command line."""
        name = f"gc-k8s-{self.session}-{hostname}"
        command = ["run", "-d", "--name", name, "--hostname", hostname, "--network", self.network]
        command += ["--label", LABEL, "--shm-size", "1g", "--no-healthcheck", *security]
        for alias in aliases:
            command += ["--network-alias", alias]
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        for mount in mounts:
            command += ["-v", mount]
        for key in secrets or {}:
            command += ["-e", key]
        docker(*command, self.image, *args, env={**os.environ, **(secrets or {})})
        self.names.append(name)
        return name

    def init(
        self, pod_spec: dict[str, Any], env: dict[str, str], volumes: dict[str, Path], hostname: str = ""
    ) -> None:
        """Run the pod's init containers to completion, in order, as the kubelet does before the pod
        (every container of a pod has the pod's hostname)."""
        for container in pod_spec.get("initContainers", []):
            options = ["--rm", "--network", "none", "--label", LABEL, *security_flags(pod_spec, container)]
            options += ["--hostname", hostname] if hostname else []
            options += [f"--volume={mount}" for mount in volume_mounts(container, volumes)]
            options += [f"--env={key}={value}" for key, value in env.items()]
            # A container's `command` replaces the image's entrypoint; its `args`, the image's CMD.
            entrypoint, *rest = container["command"]
            done = docker("run", *options, "--entrypoint", entrypoint, self.image, *rest, *container["args"])
            print(done.stdout + done.stderr)

    def files(self, name: str, *directories: str) -> set[str]:
        """The names in these directories of a running container (missing directories count as empty)."""
        listed = docker("exec", name, "sh", "-c", 'ls -A "$@" 2>/dev/null; true', "ls", *directories)
        return {line for line in listed.stdout.split() if not line.endswith(":")}

    def host_key_of(self, client: str, host: str) -> str:
        """The ed25519 host key the sshd at `host` answers with, as seen from the container `client`."""
        scanned = docker("exec", client, "ssh-keyscan", "-T", "10", "-t", "ed25519", "-p", "3022", host)
        lines = [line for line in scanned.stdout.splitlines() if line and not line.startswith("#")]
        assert len(lines) == 1, scanned.stdout + scanned.stderr
        return key_blob(lines[0])

    def wait(self, name: str, timeout_s: float) -> int:
        return int(docker("wait", name, timeout=timeout_s).stdout.strip())

    def logs(self, name: str) -> str:
        done = docker("logs", name, check=False)
        return done.stdout + done.stderr

    def wait_for_log(self, name: str, pattern: re.Pattern[str], timeout_s: float = 180) -> None:
        """Until the container's log matches (it waits on an event, never a fixed time); fails if it
        exits or the time is up first."""
        seen = wait_for(lambda: pattern.search(self.logs(name)) or not self.running(name), timeout_s)
        log = self.logs(name)
        assert seen and pattern.search(log), f"{name}: no {pattern.pattern!r} in its log:\n{log[-3000:]}"

    def running(self, name: str) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip() == "true"

    def remove(self, show_logs: bool) -> None:
        for name in self.names:
            if show_logs:
                print(f"\n----- {name} -----\n{self.logs(name)[-5000:]}")
        if self.names:
            docker("rm", "-f", "-v", *self.names, check=False, timeout=120)
        docker("network", "rm", self.network, check=False)


@pytest.fixture
def pods(request, image) -> Iterator[Pods]:
    made = Pods(image)
    yield made
    failed = getattr(request.node, "rep_call", None) is None or request.node.rep_call.failed
    made.remove(show_logs=failed)


class MpiJob:
    """The rendered MPIJob and what the operator and the kubelet would give its pods: the operator's
    Secret, hostfile and variables; our Secrets (gaudi-cluster-keys and <job>-host-keys, made as
    docs/kubernetes.md makes them, by scripts/k8s-host-keys.sh); the launcher's projected key directory
    and, per worker, the key directory its init container fills."""

    def __init__(self, tmp_path: Path, settings_extra: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.docs = kustomize(ROOT / "k8s" / "mpijob")
        doc = only(self.docs, "MPIJob")
        self.job = job = doc["metadata"]["name"]
        self.spec = spec = doc["spec"]
        self.settings = {**settings_of(self.docs), **settings_extra}
        self.mount = spec["sshAuthMountPath"]
        self.templates = {r: spec["mpiReplicaSpecs"][r]["template"]["spec"] for r in ("Launcher", "Worker")}
        self.worker_names = [
            f"{job}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])
        ]
        self.fqdn = {name: f"{name}.{job}.{NAMESPACE}.svc" for name in self.worker_names}
        operator = operator_secret(tmp_path / "keygen")
        # The operator's own mount of its Secret on every pod: no mode set away from /root/.ssh (0644).
        self.operator_mount = secret_volume(
            tmp_path / "ssh", {path: operator[key] for path, key in OPERATOR_ITEMS.items()}, 0o644
        )
        keys = tmp_path / "keys"
        made = docker_free_keys(keys, job, len(self.worker_names))
        client = {name: (keys / name).read_bytes() for name in ("id_ed25519", "id_ed25519.pub")}
        self.secrets = {f"{job}-ssh": operator, "gaudi-cluster-keys": client, f"{job}-host-keys": made}
        self.launcher_keys = projected_volume(
            tmp_path / "keys-Launcher",
            volume_of(self.templates["Launcher"], "ssh-dir")["projected"],
            self.secrets,
        )
        host_keys = volume_of(self.templates["Worker"], "host-keys")["secret"]
        self.host_keys_volume = secret_volume(
            tmp_path / "host-keys", self.secrets[host_keys["secretName"]], host_keys["defaultMode"]
        )
        # The operator's ConfigMap: one FQDN per worker, slotsPerWorker slots (1 here: CPU ranks).
        self.config_map = secret_volume(
            tmp_path / "mpi",
            {
                "hostfile": "".join(f"{self.fqdn[name]} slots=1\n" for name in self.worker_names).encode(),
                "discover_hosts.sh": b"#!/bin/sh\n"
                + b"".join(f"echo {self.fqdn[name]}\n".encode() for name in self.worker_names),
            },
            0o644,
        )
        self.launcher_container = self.templates["Launcher"]["containers"][0]
        self.worker_container = self.templates["Worker"]["containers"][0]

    def worker_keys(self, pods: Pods, hostname: str) -> Path:
        """The key directory the worker init container fills in a pod whose hostname is `hostname`."""
        ssh_dir = self.tmp_path / f"ssh-dir-{hostname}-{uuid.uuid4().hex[:4]}"
        ssh_dir.mkdir()
        pods.init(
            self.templates["Worker"], {}, {"host-keys": self.host_keys_volume, "ssh-dir": ssh_dir}, hostname
        )
        return ssh_dir

    def start_launcher(self, pods: Pods, job_args: list[str], secrets: dict[str, str]) -> str:
        job, container = self.job, self.launcher_container
        operator_env = {
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        }
        return pods.run(
            f"{job}-launcher",
            [f"{job}-launcher.{job}.{NAMESPACE}.svc"],
            {**container_env(container, self.settings), **operator_env, "K_MPI_JOB_ROLE": "launcher"},
            [
                f"{self.operator_mount}:{self.mount}:ro",
                f"{self.config_map}:/etc/mpi:ro",
                *volume_mounts(container, {"ssh-dir": self.launcher_keys}),
            ],
            [*container["args"], *job_args],
            security_flags(self.templates["Launcher"], container),
            secrets=secrets,
        )

    def start_worker(self, pods: Pods, hostname: str, alias: str, key_dir: Path) -> str:
        container = self.worker_container
        return pods.run(
            hostname,
            [alias],
            {**container_env(container, self.settings), "K_MPI_JOB_ROLE": "worker"},
            [f"{self.operator_mount}:{self.mount}:ro", *volume_mounts(container, {"ssh-dir": key_dir})],
            container["args"],
            security_flags(self.templates["Worker"], container),
        )


def docker_free_keys(keys: Path, job: str, workers: int, *flags: str) -> dict[str, bytes]:
    """The Secret <job>-host-keys's files, made as docs/kubernetes.md makes them (on this machine)."""
    subprocess.run(
        [str(ROOT / "scripts" / "k8s-host-keys.sh"), *flags, job, str(workers), NAMESPACE, str(keys)],
        check=True,
        capture_output=True,
    )
    return {f.name: f.read_bytes() for f in (keys / "k8s" / job).iterdir()}


def test_mpijob_launcher_trains_on_late_workers_with_per_pod_host_keys(pods, tmp_path):
    # docs/kubernetes.md's token: the Secret, and GAUDI_CLUSTER_ENV_PASS in the settings ConfigMap.
    # Plain rank starts (GAUDI_CLUSTER_PREIMPORT=0): the test reads rank 0's environment in /proc, and a
    # rank forked by the node's zygote shows the zygote's exec-time environment there, not its own.
    mpi = MpiJob(tmp_path, {"GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN", "GAUDI_CLUSTER_PREIMPORT": "0"})
    job, settings, worker_names, fqdn = mpi.job, mpi.settings, mpi.worker_names, mpi.fqdn
    token_secret = {HF_TOKEN_SECRET: {"HF_TOKEN": TOKEN}}
    workers = len(worker_names)
    launcher_container, worker_container = mpi.launcher_container, mpi.worker_container
    assert launcher_container["args"] == ["master"] and worker_container["args"] == ["worker"]
    launcher = mpi.start_launcher(pods, JOB, secret_env(launcher_container, token_secret))
    # The launcher (the master) alone holds the token; the workers' ranks get it from the master.
    assert secret_env(launcher_container, token_secret) == {"HF_TOKEN": TOKEN}
    assert secret_env(worker_container, token_secret) == {}
    pods.wait_for_log(launcher, WAITING_FOR_PEERS)
    assert pods.running(launcher), pods.logs(launcher)[-3000:]
    # Still waiting for its workers, whose names do not resolve yet; it installed our client key
    # owner-only, and never the operator's (mounted at sshAuthMountPath all the same).
    installed = docker("exec", launcher, "stat", "-c", "%a %n", "/root/.ssh/id_ed25519", check=False).stdout
    assert installed.split() == ["600", "/root/.ssh/id_ed25519"]
    assert "id_rsa" not in pods.files(launcher, "/root/.ssh")
    # It runs no ranks (not in the operator's hostfile), so no sshd: nothing listens on the ssh port and
    # no authorized_keys would admit the operator's id_rsa, which every worker holds.
    processes = docker("exec", launcher, "sh", "-c", "cat /proc/[0-9]*/comm", check=False).stdout.split()
    assert "sshd" not in processes, processes
    tables = docker("exec", launcher, "cat", "/proc/net/tcp", "/proc/net/tcp6", check=False).stdout
    ssh_port = int(container_env(launcher_container, settings).get("GAUDI_CLUSTER_SSH_PORT", "3022"))
    rows = [line.split() for line in tables.splitlines()]
    listening = {int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3:4] == ["0A"]}
    assert ssh_port not in listening, listening
    assert "no sshd" in pods.logs(launcher)
    gone = docker("exec", launcher, "test", "-e", "/root/.ssh/authorized_keys", check=False)
    assert gone.returncode != 0
    worker_pods = [
        mpi.start_worker(pods, name, fqdn[name], mpi.worker_keys(pods, name)) for name in worker_names
    ]
    # Rank 0 runs on the first worker: read its environment, and every pod's argv, while it runs.
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + 600
    while pods.running(launcher) and time.monotonic() < deadline:
        done = docker("exec", worker_pods[0], "python3", "-c", SNAPSHOT, check=False)
        if done.returncode == 0 and json.loads(done.stdout)["rank0_token"] is not None:
            seen = json.loads(done.stdout)
            for other in (launcher, *worker_pods[1:]):
                more = docker("exec", other, "python3", "-c", SNAPSHOT, check=False).stdout
                seen["argv"] += json.loads(more)["argv"] if more else []
            break
        time.sleep(0.5)
    code = pods.wait(launcher, timeout_s=max(1.0, deadline - time.monotonic()))
    log = pods.logs(launcher)
    assert code == 0, log[-4000:]
    assert seen.get("rank0_token") == TOKEN, "rank 0 never ran with the Secret's HF_TOKEN"
    assert not [argv for argv in seen["argv"] if TOKEN in argv]
    assert TOKEN not in log and not [name for name in worker_pods if TOKEN in pods.logs(name)]
    # The ranks ran on the workers only: the launcher is not in the operator's hostfile.
    assert rank_hosts(log) == {i: {name} for i, name in enumerate(worker_names)}, rank_hosts(log)
    assert re.search(rf"job \S+ succeeded: {workers} ranks on {workers} nodes", log), log[-3000:]
    assert f"nodes: {', '.join(fqdn[name] for name in worker_names)}" in log
    # Each worker's own certified key: the master pinned the CA, with no shared-key warning.
    assert "shared host key" not in log
    key_dir = container_env(worker_container, settings)["GAUDI_CLUSTER_SSH_DIR"]
    host_keys = mpi.secrets[f"{job}-host-keys"]
    served = set()
    for name, worker in zip(worker_names, worker_pods, strict=True):
        # Nothing in the key directory the image reads, nor in /root/.ssh, logs in anywhere.
        held = pods.files(worker, key_dir, "/root/.ssh")
        assert not {"id_rsa", "id_ed25519"} & held, (name, held)
        # Its sshd presents its own host key (asked from inside: the launcher has exited).
        served.add(pods.host_key_of(worker, fqdn[name]))
        assert served == {
            key_blob(host_keys[f"{n}.ssh_host_ed25519_key.pub"]) for n in worker_names[: len(served)]
        }
    # The operator's id_rsa, which every worker holds at sshAuthMountPath, opens no other worker.
    tried = docker(
        "exec",
        worker_pods[0],
        "sh",
        "-c",
        f"install -m 0600 {mpi.mount}/id_rsa /tmp/operator-key && ssh -p 3022 -i /tmp/operator-key "
        f"-o IdentitiesOnly=yes -o BatchMode=yes root@{fqdn[worker_names[1]]} true",
        check=False,
    )
    assert tried.returncode == 255 and "Permission denied" in tried.stderr, tried.stderr


def test_mpijob_master_refuses_a_worker_at_another_workers_name_with_its_own_certified_key(pods, tmp_path):
    mpi = MpiJob(tmp_path, {})
    first, second = mpi.worker_names[:2]
    launcher = mpi.start_launcher(pods, JOB, {})
    real = mpi.start_worker(pods, first, mpi.fqdn[first], mpi.worker_keys(pods, first))
    # A compromised first worker takes the second's name and address: it holds the first's key and
    # certificate (its own init container picked them), nothing of the second's.
    impostor = mpi.start_worker(pods, second, mpi.fqdn[second], mpi.worker_keys(pods, first))
    code = pods.wait(launcher, timeout_s=300)
    log = pods.logs(launcher)
    assert code == 3, log[-4000:]
    refused = [
        line for line in log.splitlines() if mpi.fqdn[second] in line and "its certificate does not" in line
    ]
    assert refused and "fix: " in refused[0], log[-4000:]
    assert "job " not in log or "succeeded" not in log
    # Refused before anything was sent: the impostor's sshd (logging to the pod's stderr) let no one in.
    assert "Accepted publickey" not in pods.logs(impostor)
    assert pods.running(real)


def test_indexed_job_trains_on_every_index_found_through_the_service(pods, tmp_path):
    docs = kustomize(ROOT / "k8s" / "indexed-job")
    job_doc, service = only(docs, "Job"), only(docs, "Service")
    job, subdomain = job_doc["metadata"]["name"], service["metadata"]["name"]
    pod_spec = job_doc["spec"]["template"]["spec"]
    assert pod_spec["subdomain"] == subdomain
    container = pod_spec["containers"][0]
    # docs/kubernetes.md's token: the Secret, and GAUDI_CLUSTER_ENV_PASS in the settings ConfigMap.
    env = container_env(container, {**settings_of(docs), "GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN"})
    assert secret_env(container, {HF_TOKEN_SECRET: {"HF_TOKEN": TOKEN}}) == {}  # no pod's variable
    completions = job_doc["spec"]["completions"]
    assert env["GAUDI_CLUSTER_NODES"] == str(completions) and env["GAUDI_CLUSTER_PEERS_DNS"] == subdomain
    keys = tmp_path / "keys"
    host_keys = docker_free_keys(keys, job, completions, "--indexed-job")
    client_pair = {name: (keys / name).read_bytes() for name in ("id_ed25519", "id_ed25519.pub")}
    secrets = {"gaudi-cluster-keys": client_pair, f"{job}-host-keys": host_keys}
    client = volume_of(pod_spec, "client-key")["secret"]
    # The pod's Secret volumes, once for every pod (the kubelet makes them per pod; they are read-only).
    node_keys = volume_of(pod_spec, "node-keys")["secret"]
    shared = {
        "node-keys": secret_volume(
            tmp_path / "node-keys", secrets[node_keys["secretName"]], node_keys["defaultMode"]
        ),
        "client-key": secret_volume(
            tmp_path / "client-key",
            {item["path"]: secrets[client["secretName"]][item["key"]] for item in client["items"]},
            client["defaultMode"],
        ),
        "hf-token": secret_volume(tmp_path / "hf-token", {"HF_TOKEN": TOKEN.encode()}, 0o400),
    }
    key_dir = env["GAUDI_CLUSTER_SSH_DIR"]

    def start(index: int) -> str:
        hostname = f"{job}-{index}"
        # The pod's own name in the Service's subdomain, its FQDN, and the Service's name (every pod).
        aliases = [
            f"{hostname}.{subdomain}",
            f"{hostname}.{subdomain}.{NAMESPACE}.svc.cluster.local",
            subdomain,
        ]
        # The pod's in-memory key directory, filled by its init container before the pod starts.
        ssh_dir, master_env = tmp_path / f"ssh-dir-{index}", tmp_path / f"master-env-{index}"
        ssh_dir.mkdir()
        master_env.mkdir()
        volumes = {**shared, "ssh-dir": ssh_dir, "master-env": master_env}
        pods.init(pod_spec, {"JOB_COMPLETION_INDEX": str(index)}, volumes, hostname)
        return pods.run(
            hostname,
            aliases,
            # Plain rank starts: the test reads rank 0's environment in /proc, and a rank forked by the
            # node's zygote shows the zygote's exec-time environment there, not its own.
            {**env, "JOB_COMPLETION_INDEX": str(index), "GAUDI_CLUSTER_PREIMPORT": "0"},
            volume_mounts(container, volumes),
            [*container["args"], *JOB],
            security_flags(pod_spec, container),
        )

    master = start(0)
    pods.wait_for_log(master, WAITING_FOR_PEERS)
    assert pods.running(master), pods.logs(master)[-3000:]
    workers = [start(index) for index in range(1, completions)]
    # Rank 0 runs on index 0: read its environment, and every pod's argv, while it runs.
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + 600
    while pods.running(master) and time.monotonic() < deadline:
        done = docker("exec", master, "python3", "-c", SNAPSHOT, check=False)
        if done.returncode == 0 and json.loads(done.stdout)["rank0_token"] is not None:
            seen = json.loads(done.stdout)
            for other in workers:
                more = docker("exec", other, "python3", "-c", SNAPSHOT, check=False).stdout
                seen["argv"] += json.loads(more)["argv"] if more else []
            break
        time.sleep(0.5)
    # A worker's container was given no token (its ranks get it from the master, as every rank does).
    for worker in workers:
        given = docker("exec", worker, "cat", "/proc/1/environ", check=False)
        assert given.returncode == 0 and "GAUDI_CLUSTER_MASTER_ENV_DIR" in given.stdout, worker
        assert TOKEN not in given.stdout, worker
    code = pods.wait(master, timeout_s=max(1.0, deadline - time.monotonic()))
    log = pods.logs(master)
    assert code == 0, log[-4000:]
    assert seen.get("rank0_token") == TOKEN, "rank 0 never ran with the Secret's HF_TOKEN"
    assert not [argv for argv in seen["argv"] if TOKEN in argv]
    assert TOKEN not in log and not [name for name in workers if TOKEN in pods.logs(name)]
    assert "role auto: master (JOB_COMPLETION_INDEX=0)" in log
    assert rank_hosts(log) == {i: {f"{job}-{i}"} for i in range(completions)}, rank_hosts(log)
    for worker in workers:
        worker_log = pods.logs(worker)
        assert "role auto: worker (JOB_COMPLETION_INDEX=" in worker_log
        assert "the job arguments are the master's" in worker_log
        # Kubernetes, not the worker, ends it (the Job's successPolicy): it still serves sshd.
        assert pods.running(worker)
        assert "id_ed25519" not in pods.files(worker, key_dir, "/root/.ssh"), worker
    # The in-memory key directories the init containers filled: the client key on index 0 alone.
    held = {i: {f.name for f in (tmp_path / f"ssh-dir-{i}").iterdir()} for i in range(completions)}
    assert {i for i, names in held.items() if "id_ed25519" in names} == {0}, held
    tokens = {i for i in range(completions) if any((tmp_path / f"master-env-{i}").iterdir())}
    assert tokens == {0}, tokens
    # Every worker's sshd presents its own host key (the master has exited: asked from a worker).
    served = [pods.host_key_of(workers[0], f"{job}-{index}.{subdomain}") for index in range(1, completions)]
    for index, key in enumerate(served, start=1):
        assert key == key_blob(host_keys[f"{job}-{index}.ssh_host_ed25519_key.pub"]), index
    assert len(set(served)) == len(served)
