from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import LocalCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow]
USER_DIR = Path(__file__).resolve().parent / "user"


@pytest.fixture
def make_cluster(request, image, cluster_keys, tmp_path) -> Iterator:
    """Build LocalClusters that are removed even when the test fails, printing their logs then."""
    made: list[LocalCluster] = []

    def factory(workers: int = 2, **kwargs) -> LocalCluster:
        shared = tmp_path / "shared"
        shared.mkdir(exist_ok=True)
        shared.chmod(0o777)
        run_args = ["-v", f"{USER_DIR}:/workspace/user:ro", "-v", f"{shared}:/workspace/shared"]
        cluster = LocalCluster(
            image=image,
            key_dir=cluster_keys,
            workers=workers,
            output_dir=kwargs.pop("output_dir", tmp_path / "output"),
            run_args=run_args + kwargs.pop("run_args", []),
            **kwargs,
        )
        made.append(cluster)
        cluster.create_network()
        return cluster

    yield factory
    failed = getattr(request.node, "rep_call", None) is None or request.node.rep_call.failed
    for cluster in made:
        if failed:
            print(cluster.all_logs())
        cluster.remove()
