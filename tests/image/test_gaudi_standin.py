"""testinfra checks of the gaudi flavor built for real, offline, on a stand-in of the vault base
(`make image-gaudi-standin`, tests/image/standin): the image every RUN step of the gaudi path made,
checked as the cpu image is (sshd, tini, no key in a layer, the entrypoint's roles) and for what only the
gaudi path does (hccl_ofi_wrapper built and resolved, the fork installed by the commit git ls-remote
resolved, its label and pin file, the profile's pins, prometheus_client for METRICS_PORT).

GAUDI_CLUSTER_STANDIN_IMAGE names the image (default gaudi-cluster-standin:gaudi). Needs a Docker engine.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import pytest
import testinfra
from gaudi_cluster.settings import fork_pin, profiles

from tests.support.docker import (
    FAST_HEALTH,
    ROOT,
    SESSION,
    SSH_DIR,
    Containers,
    docker,
    health,
    run_once,
    wait_until,
)
from tests.support.image_scan import scan_layers

pytestmark = [pytest.mark.docker]  # one xdist worker: tests/conftest.py GROUPS

PROFILE = profiles.load().profile("gaudi")
FORK = f"file://{ROOT}/build/gaudi-standin/deepspeed-fork.git"
PIN_FILE = ROOT / "build" / "gaudi-standin" / "pins" / "gaudi.env"


@pytest.fixture(scope="module")
def standin(docker_engine) -> str:
    name = os.environ.get("GAUDI_CLUSTER_STANDIN_IMAGE", "gaudi-cluster-standin:gaudi")
    if docker("image", "inspect", name, check=False).returncode != 0:
        pytest.fail(f"image {name} is missing; fix: make image-gaudi-standin", pytrace=False)
    return name


@pytest.fixture(scope="module")
def labels(standin) -> dict[str, str]:
    return json.loads(docker("image", "inspect", standin).stdout)[0]["Config"]["Labels"]


@pytest.fixture(scope="module")
def pool(request, standin, cluster_keys) -> Iterator[Containers]:
    containers = Containers(standin, cluster_keys, network=f"gc-test-{SESSION}-standin")
    request.addfinalizer(lambda: containers.remove_all(show_logs=request.session.testsfailed > 0))
    yield containers


@pytest.fixture(scope="module")
def worker(pool) -> str:
    name = pool.run(role="worker", run_args=FAST_HEALTH)
    if not wait_until(lambda: health(name) == "healthy", timeout=90):
        pytest.fail(f"stand-in worker {name} did not turn healthy ({health(name)}):\n{pool.logs(name)}")
    return name


@pytest.fixture(scope="module")
def host(worker):
    return testinfra.get_host(f"docker://root@{worker}")


# ---- the fork: resolved, installed, labelled, recorded --------------------------------------------------


def test_the_fork_commit_is_the_branch_head_ls_remote_resolved(labels, host):
    head = fork_pin.ls_remote(FORK, PROFILE.data["habana_deepspeed"]["branch"])
    assert labels[fork_pin.COMMIT_LABEL] == head
    assert labels[fork_pin.REPO_LABEL] == FORK
    assert labels["io.gaudi-cluster.profile"] == "gaudi" and labels["io.gaudi-cluster.flavor"] == "gaudi"
    # What pip built: the fork's setup.py recorded the checkout's hash, and PINS says the same.
    pins = host.file("/opt/gaudi-cluster/PINS").content_string.splitlines()
    name, version, commit = pins[0].split()
    assert (name, version) == ("deepspeed", "0.16.1+hpu.synapse.v1.23.0") and head.startswith(commit)


def test_the_build_recorded_the_commit_where_the_next_build_pins_it(labels):
    text = PIN_FILE.read_text()
    assert f"HABANA_DEEPSPEED_COMMIT={labels[fork_pin.COMMIT_LABEL]}\n" in text
    pin = fork_pin.ForkPin.from_env("gaudi", text, str(PIN_FILE))
    chosen = fork_pin.choose("gaudi", pin.branch, FORK, None, None, str(PIN_FILE.parent))
    assert chosen.commit == labels[fork_pin.COMMIT_LABEL] and chosen.source == str(PIN_FILE)


# ---- the gaudi path's contents ------------------------------------------------------------------------


def test_the_profiles_pins_are_installed_and_torch_is_the_bases(host):
    script = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    names = [*PROFILE.data["python_pins"], *PROFILE.data["control_plane_pins"], "torch"]
    found = json.loads(host.check_output("python3 -c %s" + " %s" * len(names), script, *names))
    for name, pin in {**PROFILE.data["python_pins"], **PROFILE.data["control_plane_pins"]}.items():
        assert found[name] == pin, name
    # The base's torch untouched: the stand-in's is the CPU build 2.13.0 (make-standin.sh STANDIN_TORCH).
    assert found["torch"] == "2.13.0+cpu"
    assert host.run("python3 -c 'import prometheus_client'").rc == 0


def test_the_wrapper_is_built_and_resolves_the_profiles_libfabric(host):
    wrapper = "/usr/lib/habanalabs/libhccl_ofi_wrapper.so"
    assert host.file(wrapper).is_file
    symbols = host.check_output("nm -D --defined-only %s", wrapper)
    assert "create_ofi_plugin_handle" in symbols and "_ZN10ofi_pluginD0Ev" in symbols
    fabric = re.search(r"libfabric\.so\.1 => (\S+)", host.check_output("ldd %s", wrapper))
    assert fabric and fabric.group(1) == f"{PROFILE.libfabric_root}/lib/libfabric.so.1"


def test_the_profiles_paths_and_environment(host):
    env = host.environment()
    assert env["DS_ACCELERATOR"] == "hpu" and env["GAUDI_CLUSTER_FLAVOR"] == "gaudi"
    assert env["LIBFABRIC_ROOT"] == PROFILE.libfabric_root
    assert env["LD_LIBRARY_PATH"].split(":")[0] == f"{PROFILE.libfabric_root}/lib"
    assert host.file("/opt/gaudi-cluster/PROFILE").content_string == "gaudi\n"
    assert "Open MPI) 5" in host.check_output("%s --version", PROFILE.openmpi.mpirun)
    # Habana's .bashrc line that starts sshd in every bash is gone; its profile stays sourced.
    bashrc = host.file("/root/.bashrc").content_string
    assert "init.d/ssh" not in bashrc and "habanalabs" in bashrc
    for command in ("/usr/sbin/sshd", "/usr/bin/tini", "pdsh", "gaudi-cluster", "gaudi_spawn.py", "hl-smi"):
        assert host.run("command -v %s", command).rc == 0, command
    assert host.check_output("command -v ssh") == "/usr/local/bin/ssh"  # the LD_PRELOAD-free wrapper


# ---- as the cpu image: sshd, tini, keys, roles ----------------------------------------------------------


def test_pid1_is_tini_and_sshd_listens(host):
    assert host.process.get(pid=1).comm == "tini"
    assert host.socket("tcp://0.0.0.0:3022").is_listening


def test_a_second_node_logs_in_with_the_cluster_key(pool, worker):
    client = pool.run(
        "bash", "-c",
        f"install -d -m 0700 /root/.ssh && install -m 0600 {SSH_DIR}/id_ed25519 /root/.ssh/"
        " && exec sleep infinity",
        role=None,
    )  # fmt: skip
    ok = wait_until(
        lambda: (
            docker("exec", client, "ssh", "-o", "ConnectTimeout=2", worker, "echo in", check=False).stdout
            == "in\n"
        ),
        timeout=30,
    )
    assert ok, pool.logs(worker)


def test_no_layer_holds_a_private_or_host_key(standin):
    """As the cpu image's test: no ssh_host_* file, ~/.ssh/id_* or private key text in any layer."""
    layers = scan_layers(standin)
    found = [*layers.named(r"(^|/)ssh_host_[^/]*$|(^|/)root/\.ssh/id_"), *layers.private_keys]
    assert not found, f"keys in image layers: {found}"


def test_the_entrypoints_roles(standin, cluster_keys, tmp_path):
    assert "usage" in run_once(standin, "--help").stdout.lower()
    assert run_once(standin, "bash", "-c", "echo ok").stdout == "ok\n"
    boss = run_once(standin, env={"GAUDI_CLUSTER_ROLE": "boss"}, mounts=[f"{cluster_keys}:{SSH_DIR}:ro"])
    assert boss.returncode == 2 and "master | worker" in boss.stderr
    assert run_once(standin, "worker").returncode == 2  # no keys mounted
    # The master starts its control plane with METRICS_PORT set (k8s/base): prometheus_client is there.
    script = "from gaudi_cluster.supervise import metrics_serving; import prometheus_client; print('ok')"
    out = run_once(standin, "python3", "-c", script, env={"METRICS_PORT": "9400"})
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
