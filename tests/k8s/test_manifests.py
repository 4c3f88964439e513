"""The Kubernetes manifests in k8s/, checked offline: no cluster, no network.

Each variant is rendered with `kubectl kustomize` (the kubectl of this venv, pinned in
requirements/dev.txt), every built-in kind is validated against the Kubernetes OpenAPI schemas bundled
with kubernetes-validate in strict mode (unknown fields are errors), the pod templates inside the MPIJob
are validated as PodTemplates, and then the fields that the MPI Operator, the Job controller and our
image rely on are checked one by one. What the image does with them is tested with Docker elsewhere.
"""

from __future__ import annotations

import re
import shutil
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.k8s.rendered import (
    INDEXED_JOB,
    K8S,
    MPIJOB,
    VARIANTS,
    env_of,
    indexed,
    mpijob,
    node_container,
    only,
    pod_templates,
    replica,
)
from tests.support.kubernetes import kustomize

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the message is the point
    pytest.fail(
        "kubernetes-validate is not installed in this venv; "
        "fix: .venv/bin/pip install -r requirements/dev.txt",
        pytrace=False,
    )

# The oldest Kubernetes the Indexed Job variant claims: Job successPolicy is on by default (beta) from
# 1.31 (alpha in 1.30, where the field exists in the schema but is dropped by the API server).
OLDEST_KUBERNETES = "1.31"
NEWEST_KUBERNETES = ".".join(kubernetes_validate.latest_version().split(".")[:2])
SCHEMA_VERSIONS = (OLDEST_KUBERNETES, NEWEST_KUBERNETES)

SSH_PORT = 3022
GAUDI = "habana.ai/gaudi"
HUGEPAGES = "hugepages-2Mi"
ROOT_SSH = PurePosixPath("/root/.ssh")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {variant: kustomize(K8S / variant) for variant in VARIANTS}


def gaudi_node_pod_specs(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The pods that own a Gaudi server: MPIJob workers, and every pod of the Indexed Job."""
    return {
        "MPIJob Worker": replica(rendered, "Worker")["template"]["spec"],
        "Indexed Job": only(rendered[INDEXED_JOB], "Job")["spec"]["template"]["spec"],
    }


def validate_strict(doc: dict[str, Any], version: str) -> None:
    if doc["kind"] == "MPIJob":
        # No schema for the custom resource here; its pod templates are core PodTemplateSpecs.
        for where, template in pod_templates(doc):
            wrapped = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": where.lower().replace(" ", "-")},
                "template": template,
            }
            kubernetes_validate.validate(wrapped, version, strict=True)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


# --- both variants ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "kinds"),
    [
        (MPIJOB, ["ConfigMap", "MPIJob", "NetworkPolicy", "NetworkPolicy"]),  # the -ssh one: workers only
        (INDEXED_JOB, ["ConfigMap", "Job", "NetworkPolicy", "Service"]),
    ],
)
def test_variant_renders_offline_to_exactly_its_objects(rendered, variant, kinds):
    # No Secret: the keys are made on the cluster from `make keys`, never kept in the repository.
    assert sorted(doc["kind"] for doc in rendered[variant]) == kinds


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_passes_the_strict_kubernetes_schema(rendered, variant, version):
    for doc in rendered[variant]:
        try:
            validate_strict(doc, version)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{variant}: {doc['kind']} {doc['metadata']['name']} against {version}: {error}")


def test_strict_schema_check_rejects_a_misspelt_field(rendered):
    job = only(rendered[INDEXED_JOB], "Job")
    misspelt = {**job, "spec": {**job["spec"], "completionsMode": "Indexed"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="completionsMode"):
        validate_strict(misspelt, NEWEST_KUBERNETES)
    worker = replica(rendered, "Worker")
    bad_template = {"spec": {**worker["template"]["spec"], "hostIpc": True}}
    bad_mpijob = {**mpijob(rendered), "spec": {"mpiReplicaSpecs": {"Worker": {"template": bad_template}}}}
    with pytest.raises(kubernetes_validate.ValidationError, match="hostIpc"):
        validate_strict(bad_mpijob, NEWEST_KUBERNETES)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_runs_the_image_named_once_in_the_base(rendered, variant):
    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text(encoding="utf-8"))
    (entry,) = [image for image in base["images"] if image["name"] == "gaudi-cluster"]
    expected = f"{entry['newName']}:{entry['newTag']}"
    images = [
        container["image"]
        for doc in rendered[variant]
        for _, template in pod_templates(doc)
        # Init containers too: the Indexed Job's `keys` runs the same image (nothing else to pull).
        for container in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]
    ]
    assert images, f"{variant} has no containers"
    assert set(images) == {expected}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_reads_the_generated_settings(rendered, variant):
    settings = only(rendered[variant], "ConfigMap")
    assert settings["metadata"]["name"].startswith("gaudi-cluster-settings-")
    assert all(key.startswith(("GAUDI_CLUSTER_", "OMPI_MCA_")) for key in settings["data"])
    for doc in rendered[variant]:
        for where, template in pod_templates(doc):
            refs = [source["configMapRef"]["name"] for source in node_container(template["spec"])["envFrom"]]
            assert refs == [settings["metadata"]["name"]], where


@pytest.mark.parametrize("where", ["MPIJob Worker", "Indexed Job"])
def test_gaudi_node_pods_meet_habana_container_requirements(rendered, where):
    pod = gaudi_node_pod_specs(rendered)[where]
    container = node_container(pod)
    assert pod["hostIPC"] is True
    assert "SYS_NICE" in container["securityContext"]["capabilities"]["add"]
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert str(limits[GAUDI]) == "8"
    # Kubernetes rejects extended resources and hugepages whose request differs from the limit.
    for name in (GAUDI, HUGEPAGES):
        assert str(requests[name]) == str(limits[name]), name
    assert "memory" in requests, "hugepages need a memory or cpu request"
    assert {"name": "ssh", "containerPort": SSH_PORT} in container["ports"]
    assert container["readinessProbe"]["tcpSocket"]["port"] == SSH_PORT
    # The image's entrypoint must run: no command override.
    assert "command" not in container
    assert pod["enableServiceLinks"] is False
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_variants_can_share_a_namespace(rendered):
    # The MPI Operator makes a Service named after the MPIJob; the Indexed Job brings its own.
    mpijob_name = mpijob(rendered)["metadata"]["name"]
    indexed_names = {doc["metadata"]["name"] for doc in rendered[INDEXED_JOB] if doc["kind"] != "ConfigMap"}
    assert mpijob_name not in indexed_names


# --- MPIJob (Kubeflow MPI Operator, v2beta1) ----------------------------------------------------


def test_mpijob_passes_the_operators_validation(rendered):
    job = mpijob(rendered)
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    workers = replica(rendered, "Worker")["replicas"]
    launcher = replica(rendered, "Launcher")
    assert isinstance(workers, int) and workers >= 1
    assert launcher["replicas"] == 1
    # The operator names pods <name>-launcher and <name>-worker-<i>: each must be a DNS-1035 label.
    name = job["metadata"]["name"]
    for hostname in (f"{name}-launcher", f"{name}-worker-{workers - 1}"):
        assert DNS_1035_LABEL.fullmatch(hostname) and len(hostname) <= 63, hostname
    assert spec["mpiImplementation"] == "OpenMPI"  # hostfile lines "<host> slots=N"
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    assert spec["runPolicy"]["backoffLimit"] == 0
    for name in ("Launcher", "Worker"):
        this = replica(rendered, name)
        # Set per replica (the operator overrides the template's); Never: the launcher default is OnFailure.
        assert this["restartPolicy"] == "Never", name
        assert "restartPolicy" not in this["template"]["spec"], name
        assert this["template"]["spec"]["containers"], name


def test_mpijob_slots_match_the_gaudi_cards_of_a_worker(rendered):
    worker = node_container(replica(rendered, "Worker")["template"]["spec"])
    assert mpijob(rendered)["spec"]["slotsPerWorker"] == int(worker["resources"]["limits"][GAUDI]) == 8


def test_mpijob_launcher_starts_once_every_worker_is_ready(rendered):
    assert mpijob(rendered)["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    worker = node_container(replica(rendered, "Worker")["template"]["spec"])
    assert worker["readinessProbe"]["tcpSocket"]["port"] == SSH_PORT


def test_mpijob_ssh_secret_is_mounted_away_from_root_ssh(rendered):
    mount = PurePosixPath(mpijob(rendered)["spec"]["sshAuthMountPath"])
    assert mount.is_absolute()
    assert mount != ROOT_SSH and ROOT_SSH not in mount.parents and mount not in ROOT_SSH.parents
    for name in ("Launcher", "Worker"):
        container = node_container(replica(rendered, name)["template"]["spec"])
        # The operator mounts its Secret there itself; a second volume at the same path would clash.
        assert str(mount) not in [m["mountPath"] for m in container.get("volumeMounts", [])], name
        # The image reads its own projected directory instead (test_hardening.py).
        assert env_of(container)["GAUDI_CLUSTER_SSH_DIR"] != str(mount), name


def test_mpijob_launcher_runs_the_master_and_workers_run_sshd(rendered):
    spec = mpijob(rendered)["spec"]
    launcher = node_container(replica(rendered, "Launcher")["template"]["spec"])
    worker = node_container(replica(rendered, "Worker")["template"]["spec"])
    assert launcher["args"][0] == "master"
    # Non-empty args, or the operator would run /usr/sbin/sshd -De instead of the entrypoint.
    assert worker["args"] == ["worker"]
    # The launcher is not a training node: not in the operator's hostfile, and it holds no Gaudi.
    assert spec.get("runLauncherAsWorker") in (None, False)
    assert GAUDI not in launcher.get("resources", {}).get("limits", {})
    assert GAUDI not in launcher.get("resources", {}).get("requests", {})


# --- Indexed Job + headless Service -------------------------------------------------------------


def test_indexed_job_runs_each_pod_once_and_the_master_decides(rendered):
    job, _ = indexed(rendered)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] >= 2
    assert spec["parallelism"] == spec["completions"]
    assert env_of(node_container(pod))["GAUDI_CLUSTER_NODES"] == str(spec["completions"])
    assert pod["restartPolicy"] == "Never"
    assert spec["backoffLimit"] == 0
    assert "backoffLimitPerIndex" not in spec
    assert {"succeededIndexes": "0"} in spec["successPolicy"]["rules"]
    exit_rules = [rule for rule in spec["podFailurePolicy"]["rules"] if "onExitCodes" in rule]
    assert exit_rules == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]},
        }
    ]


def test_indexed_job_pods_are_named_through_the_headless_service(rendered):
    job, service = indexed(rendered)
    pod = job["spec"]["template"]["spec"]
    service_name = service["metadata"]["name"]
    assert pod["subdomain"] == service_name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    # Hostname of the last pod: <job>-<index>, one DNS label.
    last = f"{job['metadata']['name']}-{job['spec']['completions'] - 1}"
    assert DNS_1123_LABEL.fullmatch(last) and len(last) <= 63, last
    container = node_container(pod)
    assert container["args"][0] == "auto"
    env = env_of(container)
    assert env["GAUDI_CLUSTER_PEERS_DNS"] == service_name
    assert not {"GAUDI_CLUSTER_PEERS", "GAUDI_CLUSTER_HOSTFILE"} & env.keys(), "one peer source only"


def test_indexed_job_copies_follow_a_rename_and_a_new_size(tmp_path):
    # Names and the node count are written once; kustomize's replacements must carry them everywhere.
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    job_file, service_file = copy / INDEXED_JOB / "job.yaml", copy / INDEXED_JOB / "service.yaml"
    job = yaml.safe_load(job_file.read_text(encoding="utf-8"))
    service = yaml.safe_load(service_file.read_text(encoding="utf-8"))
    job["metadata"]["name"], job["spec"]["completions"] = "llm-run", 4
    service["metadata"]["name"] = "llm"
    job_file.write_text(yaml.safe_dump(job), encoding="utf-8")
    service_file.write_text(yaml.safe_dump(service), encoding="utf-8")

    docs = kustomize(copy / INDEXED_JOB)
    job, service, policy = only(docs, "Job"), only(docs, "Service"), only(docs, "NetworkPolicy")
    env = env_of(node_container(job["spec"]["template"]["spec"]))
    assert job["spec"]["template"]["spec"]["subdomain"] == "llm"
    assert env["GAUDI_CLUSTER_PEERS_DNS"] == "llm"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "llm-run"}
    own = {"matchLabels": {"batch.kubernetes.io/job-name": "llm-run"}}
    assert policy["metadata"]["name"] == "llm-run"
    assert policy["spec"]["podSelector"] == own
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": own}]
    assert job["spec"]["parallelism"] == 4
    assert env["GAUDI_CLUSTER_NODES"] == "4"
