"""Reading the rendered k8s/ variants: the objects, their pod templates and the node container, shared by
the offline manifest checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
MPIJOB = "mpijob"
INDEXED_JOB = "indexed-job"
VARIANTS = (MPIJOB, INDEXED_JOB)

Rendered = dict[str, list[dict[str, Any]]]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def pod_templates(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, PodTemplateSpec) for every pod template in a rendered object."""
    if doc["kind"] == "MPIJob":
        for replica, spec in doc["spec"]["mpiReplicaSpecs"].items():
            yield f"MPIJob {replica}", spec["template"]
    elif doc["kind"] == "Job":
        yield "Job", doc["spec"]["template"]


def all_pod_templates(rendered: Rendered, variant: str) -> list[tuple[str, dict[str, Any]]]:
    templates = [found for doc in rendered[variant] for found in pod_templates(doc)]
    assert templates, f"{variant} has no pod template"
    return templates


def node_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    # containers[0]: the MPI Operator adds its env, mounts and (without args) its command to this one.
    container = pod_spec["containers"][0]
    assert container["name"] == "node"
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def mpijob(rendered: Rendered) -> dict[str, Any]:
    return only(rendered[MPIJOB], "MPIJob")


def replica(rendered: Rendered, name: str) -> dict[str, Any]:
    return mpijob(rendered)["spec"]["mpiReplicaSpecs"][name]


def indexed(rendered: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    return only(rendered[INDEXED_JOB], "Job"), only(rendered[INDEXED_JOB], "Service")


def volume(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod_spec.get("volumes", []) if v["name"] == name]
    return found


def mounts_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's volume mounts by volume name."""
    return {mount["name"]: mount for mount in container.get("volumeMounts", [])}
