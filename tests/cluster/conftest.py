from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import LocalCluster

from tests.support.mounts import user_mounts

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def make_cluster(request, image, cluster_keys, tmp_path) -> Iterator:
    """Build LocalClusters that are removed even when the test fails, printing their logs then."""
    made: list[LocalCluster] = []

    def factory(workers: int = 2, **kwargs) -> LocalCluster:
        shared = tmp_path / "shared"
        shared.mkdir(exist_ok=True)
        run_args = user_mounts(shared)
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


@dataclass
class HeldCluster(LocalCluster):
    """A cluster whose master prepared it and stays up (GAUDI_CLUSTER_HOLD=1): every case is one exec."""

    exec_env: dict[str, str] = field(default_factory=dict)  # given to every in_master command

    def in_master(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        command = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0"]
        for name, value in {**self.exec_env, **(env or {})}.items():
            command += ["-e", f"{name}={value}"]
        return subprocess.run(
            [*command, self.master, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def start_in_master(self, *argv: str, log: Path, env: dict[str, str] | None = None) -> MasterRun:
        """`argv` in the master's container in the background, its output (stdout and stderr) in `log`."""
        command = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0"]
        for name, value in {**self.exec_env, **(env or {})}.items():
            command += ["-e", f"{name}={value}"]
        with log.open("wb") as out:
            process = subprocess.Popen([*command, self.master, *argv], stdout=out, stderr=subprocess.STDOUT)
        return MasterRun(process, log)


@dataclass
class MasterRun:
    """A master run in a held cluster's container, as a test follows it: its output so far, its end."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)


@pytest.fixture(scope="module")
def hold(image, cluster_keys, tmp_path_factory) -> Iterator[Callable[..., HeldCluster]]:
    """Start held clusters for a test module (removed when it ends): `hold(workers=3, run_args=[...],
    worker_args={...}, image=..., master_env={...}, exec_env={...})`."""
    made: list[HeldCluster] = []

    def start(master_env: dict[str, str] | None = None, **kwargs) -> HeldCluster:
        kwargs.setdefault("image", image)
        cluster = HeldCluster(key_dir=cluster_keys, output_dir=tmp_path_factory.mktemp("out"), **kwargs)
        made.append(cluster)
        try:
            cluster.create_network()
            cluster.start_workers()
            cluster.wait_healthy(cluster.worker_names)
            cluster.start_master(extra_env={"GAUDI_CLUSTER_HOLD": "1", **(master_env or {})})
            # Its "cluster ready" line, not the hostfile: that is written while it prepares, before it
            # removes the staged private files and closes its ssh connections (a test that looked then
            # found its control masters still up, on two busy cores).
            deadline = time.monotonic() + 120
            while "gaudi-cluster: cluster ready;" not in cluster.logs(cluster.master):
                assert time.monotonic() < deadline, cluster.all_logs()
                time.sleep(0.5)
        except BaseException:
            print(cluster.all_logs())
            raise
        return cluster

    yield start
    for cluster in made:
        cluster.remove()


HPU_DIR = Path(__file__).resolve().parent / "hpu"
HPU_DEVICES = [
    *(f"/dev/null:/dev/accel/accel{i}" for i in range(9)),  # accel8: the intel_vpu stand-in
    *(f"/dev/null:/dev/accel/accel_controlD{i}" for i in range(8)),
    "/dev/null:/dev/infiniband/uverbs0",
]


@pytest.fixture(scope="module")
def hpu_image(image) -> str:
    """The test-only HPU-shaped layer on the cpu image (tests/cluster/hpu/Dockerfile, never shipped), its
    Open MPI and libfabric trees where profiles.json puts them for the default and the dl1 profile."""
    from gaudi_cluster.settings import profiles

    today = profiles.load().profile(profiles.load().default)
    dl1 = profiles.load().profile("dl1")
    tag = f"{image}-hpu-test" if ":" in image else f"{image}:hpu-test"
    shapes = {
        "PROFILE": today.name,
        "OPENMPI_ROOT": today.openmpi.root,
        "OPENMPI_VERSION": today.openmpi.version or f"{today.openmpi.major}.0.0",
        "LIBFABRIC_ROOT": today.libfabric_root,
        "DL1_OPENMPI_ROOT": dl1.openmpi.root,
        "DL1_OPENMPI_VERSION": dl1.openmpi.version or f"{dl1.openmpi.major}.1.6",
        "DL1_LIBFABRIC_ROOT": dl1.libfabric_root,
    }
    args = [word for name, value in shapes.items() for word in ("--build-arg", f"{name}={value}")]
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, "--build-arg", f"BASE={image}", *args, str(HPU_DIR)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return tag


@pytest.fixture(scope="module")
def hold_hpu(hold, hpu_image) -> Callable[..., HeldCluster]:
    """Start a held cluster of HPU-shaped nodes (8 accel devices and one uverbs device each, tests/cluster/
    hpu mounted at /workspace/hpu); no GAUDI_CLUSTER_SLOTS anywhere: the slots come from the devices."""

    def start(**kwargs) -> HeldCluster:
        run_args = ["-v", f"{HPU_DIR}:/workspace/hpu:ro"]
        for device in HPU_DEVICES:
            run_args += ["--device", device]
        no_slots = {"GAUDI_CLUSTER_SLOTS": ""}
        return hold(image=hpu_image, run_args=run_args, master_env=no_slots, exec_env=no_slots, **kwargs)

    return start
