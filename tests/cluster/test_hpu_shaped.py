"""An HPU-shaped cluster: three containers that look like 8-card Gaudi nodes to the control plane.

The image is a test-only layer on the cpu image (tests/cluster/hpu/Dockerfile, never shipped): stub
hl-smi (8 cards, driver version and card name per node), stub fi_info (providers per node, found only
with the ranks' LD_LIBRARY_PATH), a fake sysfs tree (8 accel devices bound to habanalabs, one to
intel_vpu), DS_ACCELERATOR=hpu and the default (1.24) profile's file, LIBFABRIC_ROOT and MPI_ROOT as the
gaudi image has them, and the Open MPI and libfabric trees of both the 1.24 profile and the dl1 profile
at the paths profiles.json gives (a node is DL1-shaped once its profile file, card and driver say so).
/dev/accel/accel0..8 and /dev/infiniband/uverbs0 are /dev/null mapped to those paths. The master runs
with --accelerator auto.
Faked, so not tested here: HCCL, habana_frameworks and every Habana binary. The job's ranks run a plain
Python script with DS_ACCELERATOR=cpu (given with --env) that prints the environment it got.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gaudi_cluster.settings import profiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = "/workspace/hpu/rank_env.py"
FAKE = "/etc/fake-habana"
# The runtime paths every HPU preset carries (GAUDINIC_DEFAULTS), and what the master forwards of its
# own environment (DS_ACCELERATOR, TORCH_EXTENSIONS_DIR, PATH: allow-listed) plus the timeouts.
HABANA_RUNTIME = {
    "DATA_LOADER_AEON_LIB_PATH": "/usr/lib/habanalabs/libaeon.so",
    "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
    "HABANA_LOGS": "/var/log/habana_logs/",
    "HABANA_PLUGINS_LIB_PATH": "/opt/habanalabs/habana_plugins",
    "HABANA_SCAL_BIN_PATH": "/opt/habanalabs/engines_fw",
}
# The two shapes of node, from profiles.json: today's default (1.24, Gaudi 2/3) and DL1's (1.21, EFA).
TODAY = profiles.load().profile(profiles.load().default)
DL1 = profiles.load().profile("dl1")
RANK_LIBRARY_PATH = f"{TODAY.libfabric_root}/lib:/usr/lib/habanalabs:{TODAY.openmpi.root}/lib"
DL1_LIBRARY_PATH = f"{DL1.libfabric_root}/lib:/usr/lib/habanalabs:{DL1.openmpi.root}/lib"
DRIVER = "1.24.1-b336d5e"


@pytest.fixture(scope="module")
def cluster(hold_hpu):
    """A master that prepared the cluster (EFA present everywhere) and stays up: every case is an exec."""
    return hold_hpu(workers=2)


def nodes(cluster) -> list[str]:
    return [cluster.master, *cluster.worker_names]


def on_node(cluster, name: str, script: str) -> None:
    done = cluster.exec(name, "sh", "-c", script)
    assert done.returncode == 0, done.stderr


def set_providers(cluster, providers: str) -> None:
    for name in nodes(cluster):
        on_node(cluster, name, f"printf '{providers}' > {FAKE}/providers")


def in_master(
    cluster, *argv: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cluster.in_master(*argv, env=env, timeout=timeout)


def shape(cluster, name: str, profile: str, card: str, driver: str) -> None:
    """Make one node look like another server: its image's profile file, its cards and their driver."""
    on_node(
        cluster,
        name,
        f"printf '{profile}\\n' > /opt/gaudi-cluster/PROFILE && printf '{card}\\n' > {FAKE}/device_name "
        f"&& printf '{driver}\\n' > {FAKE}/driver_version",
    )


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


def doctor(cluster, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str, list[dict]]:
    """(exit code, stderr, findings) of `doctor --json`."""
    done = in_master(cluster, "gaudi-cluster", "doctor", "--json", *flags, env=env)
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
        assert by[(host, "driver")]["ok"], by[(host, "driver")]
        assert by[(host, "driver")]["detail"] == (
            f"host driver {DRIVER} on HL-325L (Gaudi 3), image {TODAY.name} Synapse {TODAY.synapse_version}"
        )
        assert by[(host, "efa")]["detail"] == "1 uverbs devices, efa provider, wrapper present"
        # The 1.24-shaped node: Open MPI 5 under /opt/habanalabs and the build's libfabric, found.
        assert by[(host, "paths")]["detail"] == (
            f"Open MPI {TODAY.openmpi.mpirun}, libfabric {TODAY.libfabric.library} "
            f"(Open MPI {TODAY.openmpi.version})"
        )
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
            "--tee",  # every rank's lines on the console, not rank 0's alone
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
        "LD_LIBRARY_PATH": f"{TODAY.libfabric_root}/lib",
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
    on_node(cluster, worker, f"printf '1.23.0-695\\n' > {FAKE}/driver_version")
    try:
        done = in_master(cluster, "gaudi-cluster", "master", "--env", "DS_ACCELERATOR=cpu", JOB)
    finally:
        on_node(cluster, worker, f"printf '{DRIVER}\\n' > {FAKE}/driver_version")
    assert done.returncode == 3, done.stderr[-2000:]
    node = f"{cluster.ip_of(worker)} (worker-2)"
    assert (
        f"driver: host driver 1.23.0-695 on {node} does not match the image's Synapse "
        f"{TODAY.synapse_version} (profile {TODAY.name}): Habana supports a driver and a container of "
        "different releases on Gaudi 2 only" in done.stderr
    ), done.stderr
    # Gaudi 3 one release behind: the profile for that fleet is named.
    assert "fix: install the 1.24.x driver" in done.stderr and "make image PROFILE=gaudi-1.23" in done.stderr
    assert "RANK-ENV" not in done.stdout


def test_a_node_without_the_profiles_open_mpi_is_named(cluster):
    worker = cluster.worker_names[0]
    root = TODAY.openmpi.root
    on_node(cluster, worker, f"mv {root} {root}.away")
    try:
        code, err, findings = doctor(cluster)
    finally:
        on_node(cluster, worker, f"mv {root}.away {root}")
    assert code == 3, err
    (missing,) = [f for f in findings if f["check"] == "paths" and not f["ok"]]
    assert missing["host"] == cluster.ip_of(worker) and missing["blocking"]
    assert missing["detail"] == f"Open MPI {TODAY.openmpi.mpirun} is missing (profile {TODAY.name})"
    assert f"make image PROFILE={TODAY.name}" in missing["fix"]
    assert sum(f["ok"] for f in findings if f["check"] == "paths") == 2


def test_dl1_shaped_nodes_find_their_efa_paths_and_a_dl1_card_under_the_1_24_image_is_refused(cluster):
    """Every node turned DL1-shaped (dl1 profile, HL-205 cards, a 1.21 driver); the master's environment
    is the dl1 image's (its profile's libfabric and Open MPI). Then one node back on the 1.24 image."""
    dl1_env = {
        "LIBFABRIC_ROOT": DL1.libfabric_root,
        "MPI_ROOT": DL1.openmpi.root,
        "LD_LIBRARY_PATH": f"{DL1.libfabric_root}/lib",
    }
    for name in nodes(cluster):
        shape(cluster, name, DL1.name, "HL-205", "1.21.0-555")
    try:
        code, err, findings = doctor(cluster, "--env-preset", "efa", env=dl1_env)
        dry = in_master(
            cluster, "gaudi-cluster", "master", "--dry-run", "--env-preset", "efa", JOB, env=dl1_env
        )
        shape(cluster, cluster.worker_names[1], TODAY.name, "HL-205", "1.21.0-555")
        refused, refused_err, refused_findings = doctor(cluster, "--env-preset", "efa", env=dl1_env)
    finally:
        for name in nodes(cluster):
            shape(cluster, name, TODAY.name, "HL-325L", DRIVER)
    assert code == 0, err
    by = {(f["host"], f["check"]): f for f in findings}
    for host in {f["host"] for f in findings if f["check"] == "slots"}:
        assert by[(host, "driver")]["detail"] == (
            "host driver 1.21.0-555 on HL-205 (first-generation Gaudi), image dl1 Synapse 1.21.0"
        )
        paths = ", ".join(f"{what} {path}" for what, path in DL1.required_paths().items())
        assert by[(host, "paths")]["ok"] and by[(host, "paths")]["detail"] == f"{paths} (Open MPI 4.1.6)"
        assert by[(host, "efa")]["ok"]
    env_text = dry.stdout.split("# env file (not written: dry run)\n", 1)[1].split("# command", 1)[0]
    assert dict(line.split("=", 1) for line in env_text.splitlines())["LD_LIBRARY_PATH"] == DL1_LIBRARY_PATH
    assert refused == 3, refused_err
    worker = cluster.ip_of(cluster.worker_names[1])
    bad = {f["check"]: f for f in refused_findings if f["host"] == worker and not f["ok"]}
    assert bad["driver"]["detail"] == (
        f"HL-205 (first-generation Gaudi) on {worker} (worker-2) is not supported by the image's Synapse "
        f"{TODAY.synapse_version} (profile {TODAY.name}: gaudi2, gaudi3)"
    )
    assert bad["driver"]["fix"] == "run the dl1 profile's image (make image PROFILE=dl1)"
    assert f"differs: {TODAY.name} (others dl1)" in bad["profile"]["detail"]


@pytest.mark.parametrize("with_devices", [True, False])
def test_run_node_passes_rdma_cm_without_privileges_when_present(image, tmp_path, with_devices):
    keys = tmp_path / "keys"  # the worker's own host key, for its name (run-node.sh mounts nodes/NAME)
    subprocess.run(
        [str(ROOT / "scripts" / "make-keys.sh"), str(keys), "rdma-node"], check=True, capture_output=True
    )
    devices = [
        "--device",
        "/dev/null:/dev/infiniband/uverbs0",
        "--device",
        "/dev/null:/dev/infiniband/rdma_cm",
    ]
    done = subprocess.run(
        ["docker", "run", "--rm", "--hostname", "rdma-node", *(devices if with_devices else []),
         "-v", f"{ROOT / 'scripts'}:/s:ro", "-v", f"{keys}:/k:ro", "-e", "DRY_RUN=1",
         "-e", "GAUDI_CLUSTER_PRIVILEGED=0", "-e", "GAUDI_CLUSTER_KEYS=/k",
         image, "bash", "/s/run-node.sh", "worker"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    passed = "--device /dev/infiniband/uverbs0 --device /dev/infiniband/rdma_cm" in done.stdout
    assert passed is with_devices and ("--privileged" not in done.stdout)
