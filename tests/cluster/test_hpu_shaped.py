"""An HPU-shaped cluster: three containers that look like 8-card Gaudi nodes to the control plane.

The image is a test-only layer on the cpu image (tests/cluster/hpu/Dockerfile, never shipped): stub
hl-smi (8 cards, driver version per node), stub fi_info (providers per node, found only with the
ranks' LD_LIBRARY_PATH), a fake sysfs tree (8 accel devices bound to habanalabs, one to intel_vpu),
DS_ACCELERATOR=hpu and the gaudi profile file as the gaudi image has them. /dev/accel/accel0..8 and
/dev/infiniband/uverbs0 are /dev/null mapped to those paths. The master runs with --accelerator auto.
Faked, so not tested here: HCCL, habana_frameworks and every Habana binary. The job's ranks run a plain
Python script with DS_ACCELERATOR=cpu (given with --env) that prints the environment it got.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HPU_DIR = Path(__file__).resolve().parent / "hpu"
ROOT = Path(__file__).resolve().parents[2]
JOB = "/workspace/hpu/rank_env.py"
FAKE = "/etc/fake-habana"
DEVICES = [
    *(f"/dev/null:/dev/accel/accel{i}" for i in range(9)),  # accel8: the intel_vpu stand-in
    *(f"/dev/null:/dev/accel/accel_controlD{i}" for i in range(8)),
    "/dev/null:/dev/infiniband/uverbs0",
]
# The runtime paths every HPU preset carries (GAUDINIC_DEFAULTS), and what the master forwards of its
# own environment (DS_ACCELERATOR, TORCH_EXTENSIONS_DIR, PATH: allow-listed) plus the timeouts.
HABANA_RUNTIME = {
    "DATA_LOADER_AEON_LIB_PATH": "/usr/lib/habanalabs/libaeon.so",
    "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
    "HABANA_LOGS": "/var/log/habana_logs/",
    "HABANA_PLUGINS_LIB_PATH": "/opt/habanalabs/habana_plugins",
    "HABANA_SCAL_BIN_PATH": "/opt/habanalabs/engines_fw",
}
RANK_LIBRARY_PATH = "/opt/fake-libfabric/lib:/usr/lib/habanalabs:/opt/amazon/openmpi/lib"


@pytest.fixture(scope="module")
def hpu_image(image) -> str:
    tag = f"{image}-hpu-test" if ":" in image else f"{image}:hpu-test"
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, "--build-arg", f"BASE={image}", str(HPU_DIR)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return tag


@pytest.fixture(scope="module")
def cluster(hpu_image, cluster_keys, tmp_path_factory):
    """A master that prepared the cluster (EFA present everywhere) and stays up: every case is an exec."""
    from gaudi_cluster_dev.localcluster import LocalCluster

    run_args = ["-v", f"{HPU_DIR}:/workspace/hpu:ro"]
    for device in DEVICES:
        run_args += ["--device", device]
    cluster = LocalCluster(
        image=hpu_image,
        key_dir=cluster_keys,
        workers=2,
        output_dir=tmp_path_factory.mktemp("out"),
        run_args=run_args,
    )
    try:
        cluster.create_network()
        cluster.start_workers()
        cluster.wait_healthy(cluster.worker_names)
        # No GAUDI_CLUSTER_SLOTS: the slots must come from the devices.
        cluster.start_master(extra_env={"GAUDI_CLUSTER_HOLD": "1", "GAUDI_CLUSTER_SLOTS": ""})
        deadline = time.monotonic() + 120
        while cluster.exec(cluster.master, "test", "-s", "/run/gaudi-cluster/hostfile").returncode != 0:
            assert time.monotonic() < deadline, cluster.all_logs()
            time.sleep(0.5)
        yield cluster
    except BaseException:
        print(cluster.all_logs())
        raise
    finally:
        cluster.remove()


def nodes(cluster) -> list[str]:
    return [cluster.master, *cluster.worker_names]


def on_node(cluster, name: str, script: str) -> None:
    done = cluster.exec(name, "sh", "-c", script)
    assert done.returncode == 0, done.stderr


def set_providers(cluster, providers: str) -> None:
    for name in nodes(cluster):
        on_node(cluster, name, f"printf '{providers}' > {FAKE}/providers")


def in_master(cluster, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = ["docker", "exec", "-e", "GAUDI_CLUSTER_HOLD=0", "-e", "GAUDI_CLUSTER_SLOTS=", cluster.master]
    return subprocess.run([*command, *argv], capture_output=True, text=True, timeout=timeout, check=False)


def newest_env_file(cluster) -> dict[str, str]:
    done = cluster.exec(
        cluster.master, "sh", "-c", 'cat "$(ls -td /run/gaudi-cluster/jobs/*/ | head -n 1)deepspeed_env"'
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(line and "=" in line for line in lines), done.stdout  # DeepSpeed's reader needs this
    return dict(line.split("=", 1) for line in lines)


def master_forwards(cluster) -> dict[str, str]:
    path = cluster.exec(cluster.master, "printenv", "PATH").stdout.strip()
    return {
        "DEEPSPEED_TIMEOUT": "30",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_EXTENSIONS_DIR": "/opt/torch-extensions",
        "PATH": path,
    }


def doctor(cluster, *flags: str) -> tuple[int, str, list[dict]]:
    """(exit code, stderr, findings) of `doctor --json`."""
    done = in_master(cluster, "gaudi-cluster", "doctor", "--json", *flags)
    return done.returncode, done.stderr, json.loads(done.stdout)


def test_efa_present_the_master_picks_efa_and_writes_slots_8_and_the_env_file(cluster):
    hostfile = cluster.exec(cluster.master, "cat", "/run/gaudi-cluster/hostfile").stdout.splitlines()
    worker_ips = [cluster.ip_of(name) for name in cluster.worker_names]
    assert hostfile == [f"{cluster.ip_of(cluster.master)} slots=8", *(f"{ip} slots=8" for ip in worker_ips)]
    assert newest_env_file(cluster) == {
        **HABANA_RUNTIME,
        **master_forwards(cluster),
        "DS_ACCELERATOR": "hpu",
        "HCCL_OVER_OFI": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "RDMAV_FORK_SAFE": "1",
        "LD_LIBRARY_PATH": RANK_LIBRARY_PATH,
        # The interface that routes to the master (its own address: the interface holding it).
        "HCCL_SOCKET_IFNAME": "eth0",
    }
    assert "env preset: efa (auto: EFA uverbs devices and libfabric's efa provider on the master)" in (
        cluster.logs(cluster.master)
    )


def test_the_doctor_table_of_hpu_nodes(cluster):
    code, table, findings = doctor(cluster)
    assert code == 0, table
    shown = in_master(cluster, "gaudi-cluster", "doctor").stdout
    assert shown.splitlines()[0].split()[:3] == ["HOST", "CHECK", "RESULT"]
    assert all(f"{f['check']}" in shown for f in findings)
    by = {(f["host"], f["check"]): f for f in findings}
    hosts = {f["host"] for f in findings if f["check"] == "slots"}
    assert len(hosts) == 3
    for host in hosts:
        # 9 /dev/accel nodes, 8 of them bound to habanalabs.
        assert by[(host, "slots")]["detail"] == "8 used, 8 hpu detected"
        assert by[(host, "driver")]["ok"] and "host driver 1.22.1-97ec1a4" in by[(host, "driver")]["detail"]
        assert by[(host, "efa")]["detail"] == "1 uverbs devices, efa provider, wrapper present"
    (preset,) = [f for f in findings if f["check"] == "env preset"]
    assert preset["host"] == cluster.ip_of(cluster.master) and preset["detail"].startswith("efa (auto:")
    assert all(f["ok"] for f in findings), table


def test_without_efa_the_job_gets_gaudinic_on_24_ranks(cluster):
    set_providers(cluster, "")
    try:
        # 24 ranks start on the machine's few shared cores: give them time to check in.
        done = in_master(
            cluster,
            "gaudi-cluster",
            "master",
            "--start-timeout",
            "400",
            "--env",
            "DS_ACCELERATOR=cpu",
            JOB,
            timeout=600,
        )
    finally:
        set_providers(cluster, "efa\n")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "env preset: gaudinic (auto: uverbs devices but libfabric has no efa provider on the master)" in (
        done.stderr
    )
    ranks = [
        json.loads(line.split("RANK-ENV ", 1)[1]) for line in done.stdout.splitlines() if "RANK-ENV " in line
    ]
    assert sorted(int(r["RANK"]) for r in ranks) == list(range(24))
    assert {r["WORLD_SIZE"] for r in ranks} == {"24"}
    assert sorted(int(r["LOCAL_RANK"]) for r in ranks) == sorted(list(range(8)) * 3)
    assert len({r["host"] for r in ranks}) == 3
    for rank in ranks:
        assert rank["HCCL_OVER_OFI"] is None and rank["HCCL_GAUDI_DIRECT"] is None
        assert rank["GC_KERNEL_PATH"] == HABANA_RUNTIME["GC_KERNEL_PATH"]
        assert rank["HCCL_SOCKET_IFNAME"] == "eth0" and rank["DS_ACCELERATOR"] == "cpu"
    assert newest_env_file(cluster) == {
        **HABANA_RUNTIME,
        **master_forwards(cluster),
        "DS_ACCELERATOR": "cpu",
        "LD_LIBRARY_PATH": "/opt/fake-libfabric/lib",
        "HCCL_SOCKET_IFNAME": "eth0",
    }


def test_hostnic_when_asked_needs_verbs(cluster):
    set_providers(cluster, "verbs\n")
    try:
        code, table, findings = doctor(cluster, "--env-preset", "hostnic")
        dry = in_master(cluster, "gaudi-cluster", "master", "--dry-run", "--env-preset", "hostnic", JOB)
        set_providers(cluster, "")
        refused, refused_err, refused_findings = doctor(cluster, "--env-preset", "hostnic")
    finally:
        set_providers(cluster, "efa\n")
    assert code == 0, table
    ofi = [f for f in findings if f["check"] == "ofi"]
    assert [f["detail"] for f in ofi] == ["1 uverbs devices, verbs provider, wrapper present"] * 3
    assert (
        next(f for f in findings if f["check"] == "env preset")["detail"]
        == "hostnic (asked for (--env-preset))"
    )
    env_text = dry.stdout.split("# env file (not written: dry run)\n", 1)[1].split("# command", 1)[0]
    env = dict(line.split("=", 1) for line in env_text.splitlines())
    assert env == {
        **HABANA_RUNTIME,
        **master_forwards(cluster),
        "DS_ACCELERATOR": "hpu",
        "HCCL_OVER_OFI": "1",
        "HCCL_GAUDI_DIRECT": "1",
        "RDMAV_FORK_SAFE": "1",
        "MLX5_SCATTER_TO_CQE": "0",
        "LD_LIBRARY_PATH": RANK_LIBRARY_PATH,
        "HCCL_SOCKET_IFNAME": "eth0",
    }
    assert refused == 3, refused_err
    assert any("`fi_info -p verbs` finds no verbs provider" in f["detail"] for f in refused_findings)


def test_gaudi_direct_without_ofi_is_refused_before_anything_runs(cluster):
    done = in_master(
        cluster, "gaudi-cluster", "master", "--env-preset", "gaudinic", "--env", "HCCL_GAUDI_DIRECT=1", JOB
    )
    assert done.returncode == 2
    assert "HCCL_GAUDI_DIRECT=1 (--env / GAUDI_CLUSTER_ENV) with HCCL_OVER_OFI unset" in done.stderr
    assert "RANK-ENV" not in done.stdout


def test_a_driver_of_another_release_on_one_node_blocks_the_launch(cluster):
    worker = cluster.worker_names[1]
    on_node(cluster, worker, f"printf '1.21.0-555\\n' > {FAKE}/driver_version")
    try:
        done = in_master(cluster, "gaudi-cluster", "master", "--env", "DS_ACCELERATOR=cpu", JOB)
    finally:
        on_node(cluster, worker, f"printf '1.22.1-97ec1a4\\n' > {FAKE}/driver_version")
    assert done.returncode == 3, done.stderr[-2000:]
    node = f"{cluster.ip_of(worker)} (worker-2)"
    assert (
        f"driver: host driver 1.21.0-555 on {node} does not match the image's Synapse 1.22.0 (profile gaudi)"
        in done.stderr
    ), done.stderr
    assert "fix: install the 1.22.x driver" in done.stderr and "make image PROFILE=dl1" in done.stderr
    assert "RANK-ENV" not in done.stdout


@pytest.mark.parametrize("with_devices", [True, False])
def test_run_node_passes_rdma_cm_without_privileges_when_present(image, cluster_keys, with_devices):
    devices = [
        "--device",
        "/dev/null:/dev/infiniband/uverbs0",
        "--device",
        "/dev/null:/dev/infiniband/rdma_cm",
    ]
    done = subprocess.run(
        ["docker", "run", "--rm", *(devices if with_devices else []), "-v", f"{ROOT / 'scripts'}:/s:ro",
         "-v", f"{cluster_keys}:/k:ro", "-e", "DRY_RUN=1", "-e", "GAUDI_CLUSTER_PRIVILEGED=0",
         "-e", "GAUDI_CLUSTER_KEYS=/k", image, "bash", "/s/run-node.sh", "worker"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    passed = "--device /dev/infiniband/uverbs0 --device /dev/infiniband/rdma_cm" in done.stdout
    assert passed is with_devices and ("--privileged" not in done.stdout)
