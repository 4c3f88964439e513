"""The manifests let Prometheus find the master's metrics: the settings turn --metrics-port on (on every
interface: the scraper is another pod) and the master's pod carries the prometheus.io annotations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kubernetes import kustomize

K8S = Path(__file__).resolve().parents[2] / "k8s"


def master_templates(variant: str) -> list[dict]:
    docs = kustomize(K8S / variant)
    settings = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    if variant == "mpijob":
        mpijob = next(d for d in docs if d["kind"] == "MPIJob")
        return [settings, mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]]
    return [settings, next(d for d in docs if d["kind"] == "Job")["spec"]["template"]]


@pytest.mark.parametrize("variant", ["mpijob", "indexed-job"])
def test_the_masters_pod_is_scraped_where_the_master_serves(variant):
    settings, template = master_templates(variant)
    assert settings["GAUDI_CLUSTER_METRICS_ADDR"] == "0.0.0.0"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == settings["GAUDI_CLUSTER_METRICS_PORT"] == "9400"
    assert annotations["prometheus.io/path"] == "/metrics"
