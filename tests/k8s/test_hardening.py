"""What k8s/ does against a hostile pod on the cluster network (issue 23), checked offline on the rendered
variants: no service-account token, the runtime's default seccomp profile, no privilege escalation, a
NetworkPolicy that admits only the job's own pods to the ports the job listens on, and key directories
that give the client key to the master alone (workers: the public key and their own host key), and no
two pods the same host key. The init containers that assemble the key directories are run here for
real, with /bin/sh, on files laid out as the kubelet lays out a Secret volume.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from gaudi_cluster.settings.config import resolve_config

from tests.k8s.kubelet import secret_volume
from tests.k8s.rendered import (
    INDEXED_JOB,
    K8S,
    MPIJOB,
    ROOT,
    VARIANTS,
    Rendered,
    all_pod_templates,
    env_of,
    indexed,
    mounts_of,
    mpijob,
    node_container,
    only,
    replica,
    volume,
)
from tests.support.keys import pem_label, principals
from tests.support.kubernetes import kustomize

CLIENT_KEY_SECRET = "gaudi-cluster-keys"
KEY_DIR = "/run/secrets/gaudi-cluster"
# The label each controller puts on every pod of a job: the Job controller's, the MPI Operator's.
JOB_LABEL = {INDEXED_JOB: "batch.kubernetes.io/job-name", MPIJOB: "training.kubeflow.org/job-name"}
PORT_RANGE_SYSCTL = "net.ipv4.ip_local_port_range"


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return {variant: kustomize(K8S / variant) for variant in VARIANTS}


def containers_of(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def job_name(rendered: Rendered, variant: str) -> str:
    kind = "MPIJob" if variant == MPIJOB else "Job"
    return str(only(rendered[variant], kind)["metadata"]["name"])


def is_owner_only(mode: int) -> bool:
    return mode & 0o077 == 0


# --- the pods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_pod_gets_a_service_account_token(rendered, variant):
    for where, template in all_pod_templates(rendered, variant):
        assert template["spec"]["automountServiceAccountToken"] is False, where


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_runs_under_the_runtimes_default_seccomp_profile(rendered, variant):
    for where, template in all_pod_templates(rendered, variant):
        assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in containers_of(template["spec"]):
            # A container's own profile would replace the pod's.
            assert "seccompProfile" not in container.get("securityContext", {}), (where, container["name"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_container_can_gain_privileges(rendered, variant):
    for where, template in all_pod_templates(rendered, variant):
        for container in containers_of(template["spec"]):
            context = container.get("securityContext", {})
            what = (where, container["name"])
            assert context.get("allowPrivilegeEscalation") is False, what
            assert not context.get("privileged", False), what
            # Habana's one capability for its containers; the API server refuses no_new_privs with SYS_ADMIN.
            assert set(context.get("capabilities", {}).get("add", [])) <= {"SYS_NICE"}, what


# --- the network policy ----------------------------------------------------------------------------


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == "NetworkPolicy"]


def main_policy(rendered, variant: str) -> dict[str, Any]:
    """The policy named after the job (every pod of it); the MPIJob's `-ssh` one is the workers' sshd."""
    (policy,) = [
        p for p in policies(rendered[variant]) if p["metadata"]["name"] == job_name(rendered, variant)
    ]
    return policy


MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_the_jobs_own_pods_reach_its_ports(rendered, variant):
    policy = main_policy(rendered, variant)
    own = {JOB_LABEL[variant]: job_name(rendered, variant)}
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": own}
    assert spec["policyTypes"] == ["Ingress"]
    config = resolve_config({}, only(rendered[variant], "ConfigMap")["data"])
    # The job's own pods (this namespace, this label: no namespaceSelector, no ipBlock) reach its ports;
    # the monitoring namespace, and no other, at most the metrics port when the settings turn it on.
    own_rules = [r for r in spec["ingress"] if r["from"] == [{"podSelector": {"matchLabels": own}}]]
    others = [r for r in spec["ingress"] if r not in own_rules]
    assert len(own_rules) == 1, spec["ingress"]
    rule = own_rules[0]
    if config.metrics_port is None:
        assert others == []
    else:
        assert others == [{"from": [MONITORING], "ports": [{"protocol": "TCP", "port": config.metrics_port}]}]
    assert {"namespaceSelector": {}} not in [peer for r in spec["ingress"] for peer in r["from"]]
    singles = {p["port"] for p in rule["ports"] if "endPort" not in p}
    # The MPIJob's launcher runs no sshd: 3022 is in the workers' own policy, not in this one.
    ssh = {config.ssh_port} if variant == INDEXED_JOB else set()
    assert singles == {*ssh, config.control_port, config.master_port}
    (span,) = [(p["port"], p["endPort"]) for p in rule["ports"] if "endPort" in p]
    assert all(p["protocol"] == "TCP" for p in rule["ports"])
    # The collectives listen on ephemeral ports: the policy's range is the one every pod pins.
    for where, template in all_pod_templates(rendered, variant):
        sysctls = {s["name"]: s["value"] for s in template["spec"]["securityContext"]["sysctls"]}
        assert tuple(map(int, sysctls[PORT_RANGE_SYSCTL].split())) == span, where
    assert not singles & set(range(span[0], span[1] + 1)), "a fixed port inside the ephemeral range"


def test_no_policy_admits_ssh_to_the_mpijob_launcher(rendered):
    """Every worker holds the operator's id_rsa: 3022 reaches the workers (job-role worker) only."""
    config = resolve_config({}, only(rendered[MPIJOB], "ConfigMap")["data"])
    name = job_name(rendered, MPIJOB)
    launcher_labels = {JOB_LABEL[MPIJOB]: name, "training.kubeflow.org/job-role": "launcher"}
    worker_labels = {**launcher_labels, "training.kubeflow.org/job-role": "worker"}

    def admitted(labels: dict[str, str]) -> set[int]:
        ports: set[int] = set()
        for policy in policies(rendered[MPIJOB]):
            selector = policy["spec"]["podSelector"]["matchLabels"]
            if all(labels.get(k) == v for k, v in selector.items()):
                ports |= {
                    p["port"] for r in policy["spec"]["ingress"] for p in r["ports"] if "endPort" not in p
                }
        return ports

    assert config.ssh_port not in admitted(launcher_labels)
    assert config.ssh_port in admitted(worker_labels)
    assert config.control_port in admitted(launcher_labels)


def test_the_policy_selects_pods_the_controllers_label(rendered):
    # The Indexed Job's Service selects by the same label the policy does.
    job, service = indexed(rendered)
    assert service["spec"]["selector"] == {JOB_LABEL[INDEXED_JOB]: job["metadata"]["name"]}
    assert only(rendered[INDEXED_JOB], "NetworkPolicy")["metadata"]["name"] == job["metadata"]["name"]
    names = {p["metadata"]["name"] for p in policies(rendered[MPIJOB])}
    assert names == {mpijob(rendered)["metadata"]["name"], mpijob(rendered)["metadata"]["name"] + "-ssh"}


# --- keys: Indexed Job -----------------------------------------------------------------------------


def keys_init_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["initContainers"] if c["name"] == "keys"]
    return found


def test_indexed_job_nodes_read_a_key_directory_the_init_container_filled(rendered):
    job, _ = indexed(rendered)
    pod = job["spec"]["template"]["spec"]
    container = node_container(pod)
    assert env_of(container)["GAUDI_CLUSTER_SSH_DIR"] == KEY_DIR
    mounts = mounts_of(container)
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v or "projected" in v}
    # The node container sees no Secret at all: only the in-memory directory, read-only.
    assert not secret_volumes & mounts.keys()
    assert mounts["ssh-dir"]["mountPath"] == KEY_DIR and mounts["ssh-dir"]["readOnly"] is True
    assert volume(pod, "ssh-dir")["emptyDir"]["medium"] == "Memory"
    init = keys_init_container(pod)
    assert mounts_of(init)["ssh-dir"]["mountPath"] == KEY_DIR
    assert not mounts_of(init)["ssh-dir"].get("readOnly", False)


def test_indexed_job_client_key_reaches_only_the_init_container(rendered):
    job, _ = indexed(rendered)
    pod = job["spec"]["template"]["spec"]
    client = volume(pod, "client-key")["secret"]
    assert client["secretName"] == CLIENT_KEY_SECRET
    assert client["items"] == [{"key": "id_ed25519", "path": "id_ed25519"}]
    assert is_owner_only(client["defaultMode"])
    users = [c["name"] for c in containers_of(pod) if "client-key" in mounts_of(c)]
    assert users == ["keys"]
    # Every pod's host key: the one Secret of a pod template, in the init container alone, which copies
    # its own pod's; no Secret holds one host key for every pod.
    node_keys = volume(pod, "node-keys")["secret"]
    assert node_keys["secretName"] == f"{job['metadata']['name']}-host-keys"
    assert is_owner_only(node_keys["defaultMode"]) and "items" not in node_keys
    assert [c["name"] for c in containers_of(pod) if "node-keys" in mounts_of(c)] == ["keys"]
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert "gaudi-cluster-host-key" not in secrets and not [v for v in pod["volumes"] if "projected" in v]


INIT_VOLUMES = ("node-keys", "client-key", "ssh-dir", "hf-token", "master-env")


def test_indexed_job_hf_token_reaches_only_the_init_container(rendered):
    job, _ = indexed(rendered)
    pod = job["spec"]["template"]["spec"]
    token = volume(pod, "hf-token")["secret"]
    assert token["secretName"] == "gaudi-cluster-hf-token" and token["optional"] is True
    assert is_owner_only(token["defaultMode"])
    assert [c["name"] for c in containers_of(pod) if "hf-token" in mounts_of(c)] == ["keys"]
    # One template for every index: no container may take the Secret as a variable (every pod would).
    from_secrets = [
        (c["name"], item["name"])
        for c in containers_of(pod)
        for item in c.get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    ]
    assert from_secrets == []
    (node,) = pod["containers"]
    master_env = {item["name"]: item.get("value") for item in node["env"]}["GAUDI_CLUSTER_MASTER_ENV_DIR"]
    assert mounts_of(node)["master-env"] == {"name": "master-env", "mountPath": master_env, "readOnly": True}
    assert volume(pod, "master-env")["emptyDir"]["medium"] == "Memory"


@pytest.fixture(scope="module")
def indexed_host_keys(rendered, tmp_path_factory) -> dict[str, bytes]:
    """The Secret <Job name>-host-keys of the shipped Indexed Job, for 11 indexes (index 10 below)."""
    job, _ = indexed(rendered)
    return host_keys_secret(tmp_path_factory.mktemp("indexed"), job["metadata"]["name"], 11, indexed=True)


def run_indexed_keys_init(rendered, tmp_path, host_keys, hostname: str, index: str | None, token: bool):
    job, _ = indexed(rendered)
    pod = job["spec"]["template"]["spec"]
    init = keys_init_container(pod)
    assert init["command"] == ["/bin/sh", "-ec"]
    script, zero, *paths = init["args"]
    mounts = mounts_of(init)
    assert paths == [mounts[name]["mountPath"] for name in INIT_VOLUMES]
    node_keys = secret_volume(
        tmp_path / "node-keys", {k: v for k, v in host_keys.items() if k != "..ca"}, 0o400
    )
    client = secret_volume(tmp_path / "client-key", {"id_ed25519": b"client secret\n"}, 0o400)
    # An optional Secret that does not exist is an empty volume.
    hf_token = secret_volume(tmp_path / "hf-token", {"HF_TOKEN": b"hf_secret"} if token else {}, 0o400)
    out, master_env = tmp_path / "ssh-dir", tmp_path / "master-env"
    out.mkdir()
    master_env.mkdir()
    # The pod's hostname, as uname -n reports it in the pod's UTS namespace.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text(f"#!/bin/sh\necho {hostname}\n")
    (fake / "uname").chmod(0o755)
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        **({"JOB_COMPLETION_INDEX": index} if index is not None else {}),
    }
    volumes = [str(path) for path in (node_keys, client, out, hf_token, master_env)]
    done = subprocess.run(
        ["/bin/sh", "-ec", script, zero, *volumes], env=env, capture_output=True, text=True, check=False
    )
    return done, out, master_env


@pytest.mark.parametrize("token", [True, False], ids=["token", "no-token-secret"])
@pytest.mark.parametrize(("index", "is_master"), [("0", True), ("1", False), ("10", False), (None, False)])
def test_the_key_init_container_gives_the_client_key_and_token_to_index_0_only(
    rendered, tmp_path, indexed_host_keys, index, is_master, token
):
    job = indexed(rendered)[0]["metadata"]["name"]
    hostname = f"{job}-{index or 1}"
    done, out, master_env = run_indexed_keys_init(
        rendered, tmp_path, indexed_host_keys, hostname, index, token
    )
    assert done.returncode == 0, done.stderr
    expected = {"id_ed25519.pub", "host_ca.pub", *WORKER_FILES} | ({"id_ed25519"} if is_master else set())
    assert {p.name for p in out.iterdir()} == expected
    for made in out.iterdir():
        assert made.is_file() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o400, made
    # Its own host key, no other pod's.
    for file in WORKER_FILES:
        assert (out / file).read_bytes() == indexed_host_keys[f"{hostname}.{file}"]
    # The token: a plain file on the master's pod alone, for the entrypoint (GAUDI_CLUSTER_MASTER_ENV_DIR).
    assert {p.name for p in master_env.iterdir()} == ({"HF_TOKEN"} if is_master and token else set())
    if is_master and token:
        made = master_env / "HF_TOKEN"
        assert (
            not made.is_symlink() and made.read_bytes() == b"hf_secret" and made.stat().st_mode & 0o077 == 0
        )
    # The log names files, never their content.
    assert "secret" not in done.stdout + done.stderr and "PRIVATE KEY" not in done.stdout + done.stderr
    assert re.search(rf"index {index if index is not None else '[?]'}:", done.stdout), done.stdout


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_indexed_job_pod_gets_its_own_key_certified_for_its_names_and_the_service(
    rendered, tmp_path, indexed_host_keys, index
):
    """The master finds the pods at the Service's addresses and checks each against the Service's name
    (HostKeyAlias): every pod's own certificate names its pod names and the Service, none another's."""
    job_doc, service = indexed(rendered)
    job, subdomain = job_doc["metadata"]["name"], service["metadata"]["name"]
    assert env_of(node_container(job_doc["spec"]["template"]["spec"]))["GAUDI_CLUSTER_PEERS_DNS"] == subdomain
    pod = f"{job}-{index}"
    done, out, _ = run_indexed_keys_init(rendered, tmp_path, indexed_host_keys, pod, str(index), False)
    assert done.returncode == 0, done.stderr
    others = {indexed_host_keys[f"{job}-{i}.ssh_host_ed25519_key"] for i in range(11) if i != index}
    assert (out / "ssh_host_ed25519_key").read_bytes() not in others
    assert len(others) == 10
    fqdn = f"{pod}.{subdomain}.default.svc"
    names = principals((out / "ssh_host_ed25519_key-cert.pub").read_bytes())
    assert names == [pod, f"{pod}.{subdomain}", fqdn, f"{fqdn}.cluster.local", subdomain]


def test_an_indexed_job_pod_without_a_key_for_its_name_does_not_start(rendered, tmp_path, indexed_host_keys):
    job = indexed(rendered)[0]["metadata"]["name"]
    # An index beyond the Secret's (completions raised without making the Secret again).
    done, out, _ = run_indexed_keys_init(rendered, tmp_path, indexed_host_keys, f"{job}-11", "11", False)
    assert done.returncode == 2
    assert (
        f"no host key for {job}-11" in done.stderr
        and "fix: scripts/k8s-host-keys.sh --indexed-job" in done.stderr
    )
    assert list(out.iterdir()) == []


# --- keys: MPIJob ----------------------------------------------------------------------------------


def projected_items(pod_spec: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    sources = volume(pod_spec, "ssh-dir")["projected"]["sources"]
    return {s["secret"]["name"]: {(i["key"], i["path"]) for i in s["secret"]["items"]} for s in sources}


WORKER_FILES = {"ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "ssh_host_ed25519_key-cert.pub"}


def host_keys_secret(
    tmp_path, job: str, workers: int, namespace: str = "default", indexed: bool = False
) -> dict[str, bytes]:
    """The Secret <job>-host-keys as docs/kubernetes.md makes it: every file scripts/k8s-host-keys.sh
    lays out (real keys and certificates of a fresh host CA), by file name."""
    keys = tmp_path / "keys"
    flags = ["--indexed-job"] if indexed else []
    subprocess.run(
        [str(ROOT / "scripts" / "k8s-host-keys.sh"), *flags, job, str(workers), namespace, str(keys)],
        check=True,
        capture_output=True,
    )
    made = keys / "k8s" / job
    assert not [f for f in made.iterdir() if not f.is_file()]
    return {f.name: f.read_bytes() for f in made.iterdir()} | {"..ca": (keys / "ca" / "host_ca").read_bytes()}


def test_mpijob_launcher_key_directory_holds_the_client_key_and_the_host_ca_only(rendered):
    name = mpijob(rendered)["metadata"]["name"]
    operator_mount = PurePosixPath(mpijob(rendered)["spec"]["sshAuthMountPath"])
    pod = replica(rendered, "Launcher")["template"]["spec"]
    container = node_container(pod)
    # Our client key pair (what the workers let in) and the CA it pins; no host key (it runs no sshd),
    # no worker's key, nothing of the operator's Secret (its id_rsa is on every worker).
    assert projected_items(pod) == {
        CLIENT_KEY_SECRET: {("id_ed25519", "id_ed25519"), ("id_ed25519.pub", "id_ed25519.pub")},
        f"{name}-host-keys": {("host_ca.pub", "host_ca.pub")},
    }
    assert is_owner_only(volume(pod, "ssh-dir")["projected"]["defaultMode"])
    mount = mounts_of(container)["ssh-dir"]
    assert mount["mountPath"] == env_of(container)["GAUDI_CLUSTER_SSH_DIR"] == KEY_DIR
    assert mount["readOnly"] is True
    # The operator's own mount (its whole Secret) is elsewhere, and not the directory the image reads.
    assert PurePosixPath(KEY_DIR) not in (operator_mount, *operator_mount.parents)
    assert operator_mount not in PurePosixPath(KEY_DIR).parents


def test_mpijob_workers_read_only_what_their_init_container_picked(rendered):
    name = mpijob(rendered)["metadata"]["name"]
    pod = replica(rendered, "Worker")["template"]["spec"]
    container = node_container(pod)
    mounts = mounts_of(container)
    # The node container sees no Secret: the in-memory directory its init container filled, read-only.
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v or "projected" in v}
    assert secret_volumes == {"host-keys"}
    assert not secret_volumes & mounts.keys()
    assert mounts["ssh-dir"]["mountPath"] == env_of(container)["GAUDI_CLUSTER_SSH_DIR"] == KEY_DIR
    assert mounts["ssh-dir"]["readOnly"] is True
    assert volume(pod, "ssh-dir")["emptyDir"]["medium"] == "Memory"
    # Every worker's host keys: the one Secret of a pod template, in the init container alone. The
    # client key's Secret is not in a worker's pod at all (the kubelet of a worker never fetches it).
    secret = volume(pod, "host-keys")["secret"]
    assert secret["secretName"] == f"{name}-host-keys" and is_owner_only(secret["defaultMode"])
    assert [c["name"] for c in containers_of(pod) if "host-keys" in mounts_of(c)] == ["keys"]
    init = keys_init_container(pod)
    assert mounts_of(init)["ssh-dir"]["mountPath"] == KEY_DIR
    assert mounts_of(init)["host-keys"]["readOnly"] is True


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_pod_mounts_the_host_cas_private_key(rendered, tmp_path, variant):
    name = mpijob(rendered)["metadata"]["name"]
    host_keys = host_keys_secret(tmp_path, name, 3)
    ca = host_keys.pop("..ca")
    assert pem_label(ca) == "OPENSSH PRIVATE KEY"
    # The Secret the script lays out holds no copy of the CA's key, under any name.
    assert ca not in host_keys.values() and not {"host_ca", "ca"} & host_keys.keys()
    for where, template in all_pod_templates(rendered, variant):
        for spec in template["spec"].get("volumes", []):
            assert not {"hostPath", "configMap"} & spec.keys(), (where, spec["name"])
            sources = [s["secret"] for s in spec.get("projected", {}).get("sources", [])]
            sources += [spec["secret"]] if "secret" in spec else []
            for source in sources:
                keys = {item["key"] for item in source.get("items", [])} or set(host_keys)
                assert not {"host_ca", "ca"} & keys, (where, source)


def run_worker_keys_init(rendered, tmp_path, host_keys: dict[str, bytes], hostname: str):
    pod = replica(rendered, "Worker")["template"]["spec"]
    init = keys_init_container(pod)
    assert init["command"] == ["/bin/sh", "-ec"]
    script, zero, *paths = init["args"]
    mounts = mounts_of(init)
    assert paths == [mounts[name]["mountPath"] for name in ("host-keys", "ssh-dir")]
    secret = secret_volume(tmp_path / "host-keys", host_keys, 0o400)
    out = tmp_path / "ssh-dir"
    out.mkdir()
    # The pod's hostname, as uname -n reports it in the pod's UTS namespace.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text(f"#!/bin/sh\necho {hostname}\n")
    (fake / "uname").chmod(0o755)
    done = subprocess.run(
        ["/bin/sh", "-ec", script, zero, str(secret), str(out)],
        env={"PATH": f"{fake}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    return done, out


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_mpijob_worker_gets_its_own_key_certified_for_its_own_names(rendered, tmp_path, index):
    job = mpijob(rendered)["metadata"]["name"]
    host_keys = host_keys_secret(tmp_path, job, 3)
    del host_keys["..ca"]
    pod = f"{job}-worker-{index}"
    done, out = run_worker_keys_init(rendered, tmp_path, host_keys, pod)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} == {*WORKER_FILES, "host_ca.pub", "id_ed25519.pub"}
    for made in out.iterdir():
        assert made.is_file() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o400, made
    for public in ("host_ca.pub", "id_ed25519.pub"):
        assert (out / public).read_bytes() == host_keys[public]
    # Its own key, no other worker's; the log names files, never their content.
    for file in WORKER_FILES:
        assert (out / file).read_bytes() == host_keys[f"{pod}.{file}"]
    others = {host_keys[f"{job}-worker-{i}.ssh_host_ed25519_key"] for i in range(3) if i != index}
    assert (out / "ssh_host_ed25519_key").read_bytes() not in others
    assert "PRIVATE KEY" not in done.stdout + done.stderr and f"{pod}:" in done.stdout
    # Certified by the CA for the names the master dials (the operator's hostfile) and none of another's.
    names = principals((out / "ssh_host_ed25519_key-cert.pub").read_bytes())
    fqdn = f"{pod}.{job}.default.svc"
    assert names == [pod, f"{pod}.{job}", fqdn, f"{fqdn}.cluster.local"]
    signed = subprocess.run(
        ["ssh-keygen", "-L", "-f", str(out / "ssh_host_ed25519_key-cert.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ca_fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(out / "host_ca.pub")], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert "host certificate" in signed and f"Signing CA: ED25519 {ca_fingerprint}" in signed


def test_an_mpijob_worker_without_a_key_for_its_name_does_not_start(rendered, tmp_path):
    job = mpijob(rendered)["metadata"]["name"]
    host_keys = host_keys_secret(tmp_path, job, 2)
    del host_keys["..ca"]
    # A third worker (replicas raised without making the Secret again).
    done, out = run_worker_keys_init(rendered, tmp_path, host_keys, f"{job}-worker-2")
    assert done.returncode == 2
    assert f"no host key for {job}-worker-2" in done.stderr and "fix: scripts/k8s-host-keys.sh" in done.stderr
    assert list(out.iterdir()) == []


def test_mpijob_copies_follow_a_rename(tmp_path):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    path = copy / MPIJOB / "mpijob.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["metadata"]["name"] = "llm-ssh-run"  # holds "-ssh" itself: only the suffix may be replaced
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")

    docs = kustomize(copy / MPIJOB)
    job = only(docs, "MPIJob")
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert "llm-ssh-run-host-keys" in projected_items(launcher)
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert volume(worker, "host-keys")["secret"]["secretName"] == "llm-ssh-run-host-keys"
    own = {"matchLabels": {JOB_LABEL[MPIJOB]: "llm-ssh-run"}}
    by_name = {p["metadata"]["name"]: p for p in policies(docs)}
    assert set(by_name) == {"llm-ssh-run", "llm-ssh-run-ssh"}
    assert by_name["llm-ssh-run"]["spec"]["podSelector"] == own
    workers = {"matchLabels": {**own["matchLabels"], "training.kubeflow.org/job-role": "worker"}}
    assert by_name["llm-ssh-run-ssh"]["spec"]["podSelector"] == workers
    for policy in by_name.values():
        assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": own}]


# --- docs ------------------------------------------------------------------------------------------


def test_docs_create_the_secrets_the_pods_read(rendered, tmp_path):
    docs = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    job = mpijob(rendered)["metadata"]["name"]
    workers = replica(rendered, "Worker")["replicas"]
    # The documented script, for the shipped MPIJob's name and worker count; its directory's files.
    assert f"scripts/k8s-host-keys.sh {job} {workers} default\n" in docs
    host_keys = host_keys_secret(tmp_path / "mpijob", job, workers)
    del host_keys["..ca"]
    # The same for the shipped Indexed Job (every index: the master's sshd too).
    indexed_job = indexed(rendered)[0]
    name, completions = indexed_job["metadata"]["name"], indexed_job["spec"]["completions"]
    assert f"scripts/k8s-host-keys.sh --indexed-job {name} {completions} default\n" in docs
    indexed_keys = host_keys_secret(tmp_path / "indexed", name, completions, indexed=True)
    del indexed_keys["..ca"]
    directories = {f".keys/k8s/{job}": set(host_keys), f".keys/k8s/{name}": set(indexed_keys)}
    command = r"kubectl create secret generic (\S+)((?:\s+\\?\s*--from-file=\S+)+)"
    commands = {
        # --from-file=PATH names the key after the file, --from-file=KEY=PATH names it KEY, and
        # --from-file=DIRECTORY takes every file in it (the script's .keys/k8s/<job>).
        name: {
            key
            for f in re.findall(r"--from-file=(\S+)", files)
            for key in directories.get(f, {f.split("=")[0] if "=" in f else PurePosixPath(f).name})
        }
        for name, files in re.findall(command, docs)
    }
    assert commands == {
        CLIENT_KEY_SECRET: {"id_ed25519", "id_ed25519.pub"},
        f"{name}-host-keys": set(indexed_keys),
        f"{job}-host-keys": set(host_keys),
        "gaudi-cluster-hf-token": {"HF_TOKEN"},
    }
    # Every key a pod reads from one of our Secrets is a file the command puts in it.
    for variant in VARIANTS:
        for where, template in all_pod_templates(rendered, variant):
            for spec in template["spec"].get("volumes", []):
                sources = [s["secret"] for s in spec.get("projected", {}).get("sources", [])]
                if "secret" in spec:
                    sources.append({"name": spec["secret"]["secretName"], **spec["secret"]})
                for source in sources:
                    name = source.get("name", source.get("secretName"))
                    assert name in commands, (where, name)  # every Secret a pod names is documented
                    if name in commands:
                        keys = {item["key"] for item in source.get("items", [])}
                        assert keys <= commands[name], (where, name)
