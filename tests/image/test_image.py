"""Checks of the built cpu image: contents, ssh hardening, entrypoint behaviour, prebuilt ops, layers.

Run with `make test-image` (builds the image first) or `pytest tests/image` against
GAUDI_CLUSTER_IMAGE (default gaudi-cluster:cpu). Needs a Docker engine; fails without one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from gaudi_cluster.nodes.ssh import KEX_ALGORITHMS

from tests.support import image_scan
from tests.support.docker import (
    BASE_IMAGE,
    SSH_DIR,
    Containers,
    docker,
    health,
    lock_pins,
    normalize,
    passes_health_check,
    run_once,
    wait_until,
)
from tests.support.image_scan import LayerScan, scan_layers

pytestmark = [pytest.mark.docker]  # one xdist worker: tests/conftest.py GROUPS

VENV_PY = "/opt/venv/bin/python"
MAX_IMAGE_BYTES = 2.5e9


def ssh_from(client: str, target: str, command: str, port: int | None = None) -> subprocess.CompletedProcess:
    """ssh from the client container to target (the image's client config: BatchMode, accept-new)."""
    args = ["exec", client, "ssh", "-o", "ConnectTimeout=2"]
    if port:
        args += ["-p", str(port)]
    return docker(*args, target, command, check=False, timeout=30)


# ---- contents ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "/usr/sbin/sshd",
        "ssh",
        "mpirun",
        "pdsh",
        "fi_info",
        "ibv_devices",
        "/usr/bin/tini",
        "ip",
        "ps",
        "g++",
        VENV_PY,
        "gaudi-cluster",
        "gaudi_spawn.py",
        "deepspeed",
    ],
)
def test_tool_present(host, command):
    assert host.run("command -v %s", command).rc == 0, f"{command} is not in the image"


def test_python_is_311_venv(host):
    assert host.check_output(f"{VENV_PY} -c 'import sys; print(sys.version_info[:2], sys.prefix)'") == (
        "(3, 11) /opt/venv"
    )


def test_installed_packages_match_lock(host):
    """Every pin of requirements/cpu-image.txt is installed at its version, and nothing else (but pip)."""
    installed = {normalize(n): v for n, v in host.pip.get_packages(pip_path="/opt/venv/bin/pip").items()}
    installed = {n: d["version"] if isinstance(d, dict) else d for n, d in installed.items()}
    pins = lock_pins()
    wrong = {
        name: (pinned, installed.get(name))
        for name, pinned in pins.items()
        if installed.get(name) not in (pinned,) and not str(installed.get(name)).startswith(pinned + "+")
    }
    assert not wrong, f"lock pin vs installed: {wrong}"
    extra = set(installed) - set(pins) - {"pip"}
    assert not extra, f"installed but not in the lock: {sorted(extra)}"


def test_pip_check(host):
    assert host.run("/opt/venv/bin/pip check").rc == 0


def test_pinned_frameworks_import(host):
    pins = lock_pins()
    out = host.check_output(
        f"{VENV_PY} -c 'import torch, deepspeed, transformers; "
        "print(torch.__version__, deepspeed.__version__, transformers.__version__)'"
    )
    torch_v, ds_v, tf_v = out.split()[-3:]
    assert torch_v.split("+")[0] == pins["torch"] == "2.13.0"
    assert ds_v == pins["deepspeed"]
    assert tf_v == pins["transformers"]


def test_app_importable_without_pythonpath(host):
    out = host.check_output(
        f"env -u PYTHONPATH {VENV_PY} -c 'import gaudi_cluster, train; print(gaudi_cluster.__file__)'"
    )
    assert out.startswith("/opt/gaudi-cluster/app/gaudi_cluster/")


def test_environment(host):
    env = host.environment()
    assert env["TORCH_EXTENSIONS_DIR"] == "/opt/torch-extensions"
    assert env["DS_ACCELERATOR"] == "cpu"
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"


def test_embedded_data_present(host):
    assert host.file("/opt/gaudi-cluster/data").is_directory
    assert host.file("/opt/gaudi-cluster/data").listdir(), "the embedded data directory is empty"


def test_deepspeed_shm_op_prebuilt(host):
    """The shm comm op is in TORCH_EXTENSIONS_DIR and loads without compiling.

    Proof of "no compile": ninja appends to .ninja_log for every build step and the .so keeps its
    mtime; the load costs well under 10 s of CPU (compiling it costs about 70 s). CPU time, not wall
    time, so a busy machine cannot fail the test.
    """
    ext = "/opt/torch-extensions/deepspeed_shm_comm"
    assert host.file(f"{ext}/deepspeed_shm_comm.so").is_file
    state = f"stat -c %Y {ext}/deepspeed_shm_comm.so && md5sum {ext}/.ninja_log"
    before = host.check_output(state)
    result = host.run(
        "bash -c %s",
        f"TIMEFORMAT=%U+%S; time {VENV_PY} -c 'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; "
        "ShareMemCommBuilder().load()' >/dev/null 2>&1",
    )
    assert result.rc == 0, result.stderr
    cpu = sum(float(x) for x in result.stderr.strip().splitlines()[-1].split("+"))
    assert host.check_output(state) == before, "the shm op was rebuilt at run time"
    assert cpu < 10, f"loading the shm op used {cpu:.1f}s of CPU (compiled at run time?)"


# ---- image metadata -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config(image):
    return json.loads(docker("image", "inspect", image).stdout)[0]


def test_entrypoint_and_defaults(config):
    cfg = config["Config"]
    assert cfg["Entrypoint"] == ["/usr/bin/tini", "--", "/opt/gaudi-cluster/entrypoint/entrypoint.sh"]
    assert not cfg.get("Cmd")
    assert cfg["WorkingDir"] == "/workspace"
    assert cfg["StopSignal"] == "SIGTERM"
    assert cfg["Healthcheck"]["Test"] == ["CMD", "/opt/gaudi-cluster/entrypoint/healthcheck.sh"]
    # each check is a docker exec; a short interval costs real CPU on every idle node
    assert cfg["Healthcheck"]["Interval"] >= 10 * 10**9
    assert "3022/tcp" in cfg["ExposedPorts"]
    labels = cfg["Labels"]
    for key in ("title", "version", "revision", "source", "description"):
        assert f"org.opencontainers.image.{key}" in labels


def test_image_size(config):
    assert config["Size"] <= MAX_IMAGE_BYTES, f"image is {config['Size'] / 1e9:.2f} GB"


# ---- no keys baked in ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layers(image) -> LayerScan:
    """One streamed pass over every layer of the image, shared by the two no-key tests below."""
    return scan_layers(image)


def test_filesystem_has_no_host_or_user_keys(layers: LayerScan):
    """No layer (so neither the filesystem of a container whose entrypoint never ran) has ssh host keys
    or a ~/.ssh/id_*: every file of that filesystem comes from a layer, and a key a later layer deletes
    still ships in its layer."""
    bad = layers.named(r"(^|/)etc/ssh/ssh_host_|(^|/)root/\.ssh/id_")
    assert not bad, f"keys in the image: {bad}"


def test_no_layer_holds_a_private_or_host_key(layers: LayerScan):
    """Every layer of `docker save`: no ssh_host_* file and no text file holding a PEM/OpenSSH private key.

    Binaries (libssl, ssh-keygen) contain the "PRIVATE KEY" header as a string; a key file is text
    with a base64 body, which is what the pattern requires.
    """
    found = [*layers.named(r"(^|/)ssh_host_[^/]*$"), *layers.private_keys]
    assert not found, f"keys in image layers: {found}"


def test_the_layer_scan_finds_a_key_a_later_layer_deleted(tmp_path, monkeypatch):
    """The two no-key tests can fail: a key copied in under another name and one at ~/.ssh/id_*, both
    deleted by the next layer, are found, by the overlay2 walk where it applies and by `docker save`."""
    # A throwaway key made now: no key-shaped text lives in the repository.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY k /opt/x/notes.txt\n"
        "RUN mkdir -p /root/.ssh && cp /opt/x/notes.txt /root/.ssh/id_ed25519\nRUN rm -rf /root/.ssh /opt/x\n"
    )
    tag = f"gc-keyscan-{tmp_path.name.lower()}"
    docker("build", "-q", "-t", tag, str(tmp_path))
    try:
        walked = scan_layers(tag)
        monkeypatch.setattr(image_scan, "layer_dirs", lambda _image: None)
        saved = scan_layers(tag)
    finally:
        docker("rmi", "-f", tag, check=False)
    for scan in (walked, saved):
        assert sorted(entry.split(": ", 1)[1] for entry in scan.private_keys) == [
            "opt/x/notes.txt", "root/.ssh/id_ed25519",
        ], scan.private_keys  # fmt: skip
        named = [entry.split(": ", 1)[1] for entry in scan.named(r"(^|/)root/\.ssh/id_")]
        assert named == ["root/.ssh/id_ed25519"]


# ---- running worker -------------------------------------------------------------------------------------


def test_pid1_is_tini(host):
    assert host.process.get(pid=1).comm == "tini"


def test_sshd_listens_on_3022(host):
    assert host.socket("tcp://0.0.0.0:3022").is_listening


def test_sshd_effective_config_is_key_only(host):
    config = dict(
        line.split(" ", 1)
        for line in host.check_output("/usr/sbin/sshd -T -p 3022").splitlines()
        if " " in line
    )
    assert config["port"] == "3022"
    assert config["passwordauthentication"] == "no"
    assert config["kbdinteractiveauthentication"] == "no"
    assert config["pubkeyauthentication"] == "yes"
    assert config["permitrootlogin"] == "without-password"
    assert config["permitemptypasswords"] == "no"
    assert config["disableforwarding"] == "yes"  # no tunnel from one node into the others


def test_the_cluster_key_is_restricted_and_the_host_key_is_the_nodes_own(host, worker, cluster_keys):
    authorized = host.file("/root/.ssh/authorized_keys").content_string.splitlines()
    assert authorized and all(line.startswith("restrict ssh-") for line in authorized), authorized
    own = cluster_keys / "nodes" / worker
    served = host.file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[:2]
    assert served == (own / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    others = [p for p in cluster_keys.rglob("ssh_host_ed25519_key.pub") if p.parent != own]
    assert served not in [p.read_text().split()[:2] for p in others]  # no other node's key
    # The node's own host key, served with its certificate; clients here pin the CA, not a key.
    cert = (own / "ssh_host_ed25519_key-cert.pub").read_text()
    assert host.file("/etc/ssh/ssh_host_ed25519_key-cert.pub").content_string == cert
    assert (
        "HostCertificate /etc/ssh/ssh_host_ed25519_key-cert.pub"
        in host.file("/etc/ssh/sshd_config.d/20-gaudi-cluster-cert.conf").content_string
    )
    ca = " ".join((cluster_keys / "ca" / "host_ca.pub").read_text().split()[:2])
    assert host.file("/etc/ssh/ssh_known_hosts").content_string == f"@cert-authority * {ca}\n"


def test_ssh_client_config(host):
    config = dict(
        line.split(" ", 1) for line in host.check_output("ssh -G node-x").splitlines() if " " in line
    )
    assert config["port"] == "3022"
    assert config["batchmode"] == "yes"
    # The cluster's host key is mounted, so clients on the node accept no other (ssh -G says "true").
    assert config["stricthostkeychecking"] == "true"
    assert config["connecttimeout"] == "5"
    assert config["serveraliveinterval"] == "5"
    assert config["serveralivecountmax"] == "3"
    assert config["loglevel"] == "ERROR"
    # the cheap key exchange first (see gaudi_cluster/nodes/ssh.py), and the same list the control plane uses
    assert config["kexalgorithms"] == KEX_ALGORITHMS


def test_installed_key_modes(host):
    assert host.file("/root/.ssh").mode == 0o700
    assert host.file("/root/.ssh/authorized_keys").mode == 0o600
    assert not host.file("/root/.ssh/id_ed25519").exists  # a worker holds no client key
    assert host.file("/etc/ssh/ssh_host_ed25519_key").mode == 0o600
    # one host key, named in the sshd drop-in (RSA keygen costs ~0.8 s of CPU per node start)
    assert not host.file("/etc/ssh/ssh_host_rsa_key").exists
    assert host.run("sshd -T -p 3022 | grep -i '^hostkey '").stdout.split() == [
        "hostkey",
        "/etc/ssh/ssh_host_ed25519_key",
    ]


def test_healthcheck_healthy(worker):
    assert health(worker) == "healthy"


def test_worker_accepts_ssh_within_10s(containers: Containers, client):
    """A freshly started worker accepts the cluster key over the network within 10 s of docker run."""
    started = time.monotonic()
    name = containers.run(role="worker")
    ok = wait_until(lambda: ssh_from(client, name, "true").returncode == 0, timeout=10, interval=0.3)
    elapsed = time.monotonic() - started
    assert ok, f"no ssh login to {name} within 10 s:\n{containers.logs(name)}"
    print(f"ssh login {elapsed:.1f}s after docker run")


def test_ssh_session_sees_image_environment(worker, client):
    """Commands run over ssh get the image Python, the .pth and TORCH_EXTENSIONS_DIR (sshd SetEnv)."""
    out = ssh_from(
        client, worker, "command -v python; echo $TORCH_EXTENSIONS_DIR; python -c 'import gaudi_cluster'"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [VENV_PY, "/opt/torch-extensions"]


def test_password_login_refused(worker, client):
    out = docker(
        "exec",
        client,
        "ssh",
        "-o",
        "PreferredAuthentications=password",
        "-o",
        "PubkeyAuthentication=no",
        worker,
        "true",
        check=False,
    )
    assert out.returncode == 255


def test_ssh_port_from_environment(containers: Containers, client):
    name = containers.run(role="worker", env={"GAUDI_CLUSTER_SSH_PORT": "4022"})
    assert wait_until(lambda: passes_health_check(name), timeout=30), containers.logs(name)
    assert ssh_from(client, name, "true", port=4022).returncode == 0
    # the node's own client follows the port (for launchers that use the default)
    port = docker("exec", name, "sh", "-c", "ssh -G x | sed -n 's/^port //p'").stdout.strip()
    assert port == "4022"


def test_sigterm_stops_worker_quickly(containers: Containers):
    name = containers.run(role="worker")
    assert wait_until(lambda: passes_health_check(name), timeout=30), containers.logs(name)
    started = time.monotonic()
    docker("stop", "-t", "10", name)
    assert time.monotonic() - started < 5
    code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
    assert code in ("0", "143")


# ---- entrypoint dispatch ------------------------------------------------------------------------------


def test_help_prints_cli_help(image):
    out = run_once(image, "--help")
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()
    assert "master" in out.stdout


def test_unknown_command_passes_through(image):
    out = run_once(image, "bash", "-c", "echo ok")
    assert out.returncode == 0
    assert out.stdout == "ok\n"


def test_unknown_role_env_exits_2(image, cluster_keys):
    out = run_once(image, env={"GAUDI_CLUSTER_ROLE": "boss"}, mounts=[f"{cluster_keys}:{SSH_DIR}:ro"])
    assert out.returncode == 2
    assert "GAUDI_CLUSTER_ROLE='boss'" in out.stderr
    assert "master | worker" in out.stderr


def test_unknown_word_exits_2(image):
    out = run_once(image, "wrker")
    assert out.returncode == 2
    assert "'wrker' is neither a role" in out.stderr


def test_worker_without_keys_fails_clearly(image):
    out = run_once(image, "worker")
    assert out.returncode == 2
    assert f"no cluster key at {SSH_DIR}/id_ed25519.pub" in out.stderr
    assert "make keys" in out.stderr


def test_master_without_private_key_fails(image, tmp_path, cluster_keys):
    shutil.copy(cluster_keys / "id_ed25519.pub", tmp_path / "id_ed25519.pub")
    out = run_once(image, "master", mounts=[f"{tmp_path}:{SSH_DIR}:ro"])
    assert out.returncode == 2
    assert f"no private key at {SSH_DIR}/id_ed25519" in out.stderr


@pytest.mark.parametrize("role", ["master", "worker"])
def test_world_readable_private_key_refused(image, tmp_path, cluster_keys, role):
    for name in ("id_ed25519", "id_ed25519.pub"):
        shutil.copy(cluster_keys / name, tmp_path / name)
    (tmp_path / "id_ed25519").chmod(0o644)
    out = run_once(image, role, mounts=[f"{tmp_path}:{SSH_DIR}:ro"])
    assert out.returncode == 2
    assert "is readable by others (mode 0644)" in out.stderr
    assert f"chmod 600 {SSH_DIR}/id_ed25519" in out.stderr


def test_not_a_public_key_refused(image, tmp_path: Path):
    (tmp_path / "id_ed25519.pub").write_text("hello world\n")
    out = run_once(image, "worker", mounts=[f"{tmp_path}:{SSH_DIR}:ro"])
    assert out.returncode == 2
    assert "is not an ed25519, rsa or ecdsa public key" in out.stderr


@pytest.mark.parametrize("port", ["0", "70000", "ssh", "-1"])
def test_bad_port_refused(image, cluster_keys, port):
    out = run_once(
        image, "worker", env={"GAUDI_CLUSTER_SSH_PORT": port}, mounts=[f"{cluster_keys}:{SSH_DIR}:ro"]
    )
    assert out.returncode == 2
    assert f"GAUDI_CLUSTER_SSH_PORT='{port}' is not a TCP port" in out.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "role auto needs an engine"),
        ({"K_MPI_JOB_ROLE": "boss"}, "K_MPI_JOB_ROLE='boss' is neither launcher nor worker"),
        ({"SLURM_STEP_NODELIST": "node[1-2]-ib", "SLURM_NODEID": "0"}, "SLURM_STEP_NODELIST='node[1-2]-ib'"),
    ],
)
def test_auto_role_without_a_clear_engine_exits_2(image, cluster_keys, env, message):
    out = run_once(image, "auto", env=env, mounts=[f"{cluster_keys}:{SSH_DIR}:ro"])
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "fix:" in out.stderr


def test_mpi_operator_keys_mounted_at_root_ssh_are_used_in_place(containers: Containers, tmp_path, client):
    """The MPI Operator's default sshAuthMountPath: its Secret, read-only and 0600, is /root/.ssh."""
    key = tmp_path / "keygen"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-C", "", "-f", str(key)],
        check=True,
    )
    mount = tmp_path / "ssh"
    mount.mkdir()
    public = b" ".join(key.with_suffix(".pub").read_bytes().split()[:2]) + b"\n"
    for name, content in (("id_rsa", key.read_bytes()), ("id_rsa.pub", public), ("authorized_keys", public)):
        (mount / name).write_bytes(content)
        (mount / name).chmod(0o600)
    worker = containers.run(
        role="auto",
        keys=False,
        env={"GAUDI_CLUSTER_SSH_DIR": "/root/.ssh", "K_MPI_JOB_ROLE": "worker"},
        mounts=[f"{mount}:/root/.ssh:ro"],
    )
    assert wait_until(lambda: passes_health_check(worker), timeout=30), containers.logs(worker)
    assert "role auto: worker (K_MPI_JOB_ROLE=worker)" in containers.logs(worker)
    # The operator's key logs in (the node's own client uses it); ours is refused there.
    assert ssh_from(worker, worker, "echo in").stdout.strip() == "in"
    assert ssh_from(client, worker, "true").returncode == 255


def test_entrypoint_is_sourceable(image):
    script = (
        "source /opt/gaudi-cluster/entrypoint/entrypoint.sh"
        " && ep_is_role master && ep_is_role worker && ep_is_role auto && ! ep_is_role boss"
        ' && [ "$(GAUDI_CLUSTER_SSH_PORT=022 ep_ssh_port)" = 22 ] && echo sourced'
    )
    out = run_once(image, "bash", "-c", script)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "sourced\n"


def test_the_whole_key_directory_is_refused_for_its_host_ca(image, cluster_keys):
    """`make keys`' directory holds the host CA's private key, which no node may hold."""
    out = run_once(image, "worker", mounts=[f"{cluster_keys}:{SSH_DIR}:ro"])
    assert out.returncode == 2, out.stderr
    assert "the host CA's private key is mounted on this node" in out.stderr
    assert "fix: mount .keys/master on the master and .keys/nodes/NAME" in out.stderr
