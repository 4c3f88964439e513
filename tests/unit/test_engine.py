"""The role `auto`, engine defaults, a Slurm worker's end (gaudi_cluster.engines.auto), the nodewatch
helpers, the identity lookup for the MPI Operator's key, and the shipped sbatch script (dry run)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gaudi_cluster.engines import auto as engine
from gaudi_cluster.engines import nodewatch
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import ssh
from gaudi_cluster.settings.config import ClusterConfig, resolve_config

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "slurm" / "gaudi-cluster.sbatch"
RUN_NODE = ROOT / "scripts" / "run-node.sh"
SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gaudi[01-03]"}


@pytest.mark.parametrize(
    ("env", "hostnames", "role", "engine_name", "master"),
    [
        pytest.param(
            {"K_MPI_JOB_ROLE": "launcher"}, {"x"}, "master", "mpi-operator", None, id="mpi-launcher"
        ),
        pytest.param({"K_MPI_JOB_ROLE": "worker"}, {"x"}, "worker", "mpi-operator", None, id="mpi-worker"),
        pytest.param({"JOB_COMPLETION_INDEX": "0"}, {"j-0"}, "master", "indexed-job", None, id="index-0"),
        pytest.param({"JOB_COMPLETION_INDEX": "3"}, {"j-3"}, "worker", "indexed-job", None, id="index-3"),
        pytest.param({**SLURM_STEP, "SLURM_NODEID": "0"}, {"x"}, "master", "slurm", None, id="nodeid-0"),
        pytest.param({**SLURM_STEP, "SLURM_NODEID": "2"}, {"x"}, "worker", "slurm", "gaudi01", id="nodeid-2"),
        pytest.param(SLURM_STEP, {"gaudi01.cluster.example"}, "master", "slurm", None, id="first-host-fqdn"),
        pytest.param(SLURM_STEP, {"gaudi03"}, "worker", "slurm", "gaudi01", id="not-first-host"),
        # The operator's pods also run under other engines' variables in odd setups: it names the role.
        pytest.param(
            {"K_MPI_JOB_ROLE": "worker", "JOB_COMPLETION_INDEX": "0"},
            {"x"},
            "worker",
            "mpi-operator",
            None,
            id="operator-first",
        ),
    ],
)
def test_auto_role(env, hostnames, role, engine_name, master):
    found = engine.auto_role(env, hostnames)
    assert (found.role, found.engine, found.master_host) == (role, engine_name, master)
    # Only a Slurm worker follows a master (Kubernetes ends its pods itself): only it is given one.
    assert (found.master_host is not None) == (role == "worker" and engine_name == "slurm")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        pytest.param({}, r"role auto needs an engine.*fix: pass the role master or worker", id="nothing"),
        pytest.param({"K_MPI_JOB_ROLE": "boss"}, "K_MPI_JOB_ROLE='boss'", id="bad-mpi-role"),
        pytest.param({"JOB_COMPLETION_INDEX": "one"}, "JOB_COMPLETION_INDEX='one'", id="bad-index"),
        pytest.param({"SLURM_STEP_NODELIST": "n[1-2]-ib"}, "SLURM_STEP_NODELIST", id="bad-nodelist"),
    ],
)
def test_auto_role_errors(env, match):
    with pytest.raises(ConfigError, match=match):
        engine.auto_role(env, {"x"})


def test_engine_defaults_derive_the_port_unless_chosen():
    config = ClusterConfig()
    assert engine.engine_defaults(config, {}).master_port == 29500
    assert engine.engine_defaults(config, SLURM_STEP).master_port == 61077
    chosen = resolve_config({}, {"GAUDI_CLUSTER_MASTER_PORT": "29600"})
    assert (
        engine.engine_defaults(chosen, {**SLURM_STEP, "GAUDI_CLUSTER_MASTER_PORT": "29600"}).master_port
        == 29600
    )


def test_release_marker_name_needs_a_run_key():
    assert engine.release_marker_name("77.0") == "released-77.0"
    with pytest.raises(ConfigError, match="release key"):
        engine.release_marker_name("../x")


def watch() -> engine.MasterWatch:
    return engine.MasterWatch("node1", started_at=0.0, startup_timeout_s=100.0, gone_after_s=10.0)


def test_worker_exits_0_when_released():
    verdict = watch().observe(5.0, released=True, agents_running=True, master_answers=None)
    assert verdict is not None and verdict.exit_code == 0


def test_worker_waits_for_a_late_master_then_gives_up():
    w = watch()
    assert w.observe(99.0, released=False, agents_running=False, master_answers=False) is None
    verdict = w.observe(101.0, released=False, agents_running=False, master_answers=False)
    assert verdict is not None and verdict.exit_code == 1 and "never answered" in verdict.message


def test_worker_exits_1_once_the_master_is_gone_longer_than_the_bound():
    w = watch()
    assert w.observe(1.0, released=False, agents_running=False, master_answers=True) is None
    # ranks running: their agents vouch for the master, nobody knocks
    assert not w.should_knock(agents_running=True)
    assert w.observe(50.0, released=False, agents_running=True, master_answers=None) is None
    assert w.observe(59.0, released=False, agents_running=False, master_answers=False) is None
    verdict = w.observe(61.0, released=False, agents_running=False, master_answers=False)
    assert verdict is not None and verdict.exit_code == 1 and "unreachable for 11s" in verdict.message


def test_worker_stopped_by_slurm_waits_for_its_ranks_then_exits_0():
    w = watch()
    stop = {"released": False, "master_answers": None, "stop_requested": True}
    assert w.observe(1.0, agents_running=True, **stop) is None
    verdict = w.observe(2.0, agents_running=False, **stop)
    assert verdict is not None and verdict.exit_code == 0


def test_agents_running_reads_proc(tmp_path):
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cmdline").write_bytes(b"/usr/bin/python\0-m\0gaudi_cluster.rank.agent\0--job-id\0x\0")
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "cmdline").write_bytes(b"/usr/sbin/sshd\0-D\0")
    (tmp_path / "self").mkdir()
    assert nodewatch.agents_running(tmp_path)
    (tmp_path / "12" / "cmdline").unlink()
    assert not nodewatch.agents_running(tmp_path)
    # A node process that hosts its node's agents as threads (under srun, on the master's node).
    node = b"/usr/bin/python\0-m\0gaudi_cluster.launch.node\0--from-launch\0"
    (tmp_path / "12" / "cmdline").write_bytes(node)
    assert nodewatch.agents_running(tmp_path)


@pytest.mark.parametrize(
    ("on_sigterm", "ended_by", "took_grace"),
    [("signal.SIG_DFL", -signal.SIGTERM, False), ("signal.SIG_IGN", -signal.SIGKILL, True)],
)
def test_sshd_is_stopped_alone_sigterm_then_sigkill_after_the_grace(on_sigterm, ended_by, took_grace):
    # Started like sshd: in this process's group. Were the group signalled, pytest would get it too.
    code = (
        f"import signal, time; signal.signal(signal.SIGTERM, {on_sigterm}); print(flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"\n"  # its handler is in place
    started = time.monotonic()
    nodewatch._stop(child, grace_s=1.0)
    assert child.returncode == ended_by
    assert (time.monotonic() - started >= 1.0) is took_grace
    child.stdout.close()
    nodewatch._stop(child)  # already reaped: nothing is signalled (its pid may be another's by now)


def test_release_leaves_the_marker_follow_looks_for(tmp_path):
    config = resolve_config({}, {"GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs")})
    assert nodewatch.release(config, "77.0", 3) == 0
    assert (tmp_path / "released-77.0").read_text() == "3\n"


def test_default_identity_finds_the_mpi_operators_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "id_rsa").write_text("key")
    assert ssh.default_identity(mount) == mount / "id_rsa"
    installed = tmp_path / "home" / ".ssh"
    installed.mkdir(parents=True)
    (installed / "id_rsa").write_text("key")
    assert ssh.default_identity(mount) == installed / "id_rsa"
    (installed / "id_ed25519").write_text("key")
    assert ssh.default_identity(mount) == installed / "id_ed25519"


# --- slurm/gaudi-cluster.sbatch, dry run ----------------------------------------------------------------


def dry_run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "DRY_RUN": "1", "SLURM_NNODES": "3", "SLURM_JOB_ID": "77"}
    return subprocess.run(
        ["bash", str(script), *args], env={**base, **env}, capture_output=True, text=True, check=False
    )


def test_sbatch_docker_mode_runs_the_node_with_run_nodes_flags(tmp_path):
    keys = str(tmp_path / "keys")
    common = {"GAUDI_CLUSTER_KEYS": keys, "GAUDI_CLUSTER_IMAGE": "img:tag", "GAUDI_CLUSTER_NODES": "3"}
    done = dry_run(SBATCH, "train.py", "--lr", "1e-4", **common)
    assert done.returncode == 0, done.stderr
    srun_line, docker_line = done.stdout.splitlines()
    # (the srun line carries the node function's body in bash's $'...' quoting: compare its head only)
    srun = srun_line.split()
    assert srun[:5] == ["srun", "--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--export=ALL"]
    ours = shlex.split(docker_line)
    assert ours[-5:] == ["img:tag", "auto", "train.py", "--lr", "1e-4"]
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")
    theirs = shlex.split(dry_run(RUN_NODE, "worker", **common).stdout)
    # Every flag of scripts/run-node.sh's docker run, except its fixed name, -d and the role.
    skipped = {"--name", "gaudi-cluster-worker", "-d", "worker", "HABANA_VISIBLE_DEVICES=all"}
    missing = [word for word in theirs if word not in ours and word not in skipped]
    assert missing == [], missing
    for variable in ("SLURM_NODEID", "SLURM_STEP_NODELIST", "SLURM_STEP_ID", "GAUDI_CLUSTER_NODES"):
        assert variable in ours
    assert "GAUDI_CLUSTER_IMAGE" not in ours


def test_sbatch_docker_mode_gives_the_client_key_to_node_0_only(tmp_path):
    """Node 0 mounts make keys' master/, a worker its own nodes/<host name>/ (refused without one: no
    shared nodes/any), and no node the key directory itself (it holds the host CA)."""
    keys = tmp_path / "keys"
    me = socket.gethostname().split(".")[0]
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(keys), me], check=True, capture_output=True)
    common = {"GAUDI_CLUSTER_KEYS": str(keys), "GAUDI_CLUSTER_IMAGE": "img:tag"}
    mounts = {}
    for node_id in ("0", "1"):
        docker_line = dry_run(SBATCH, SLURM_NODEID=node_id, **common).stdout.splitlines()[-1]
        words = shlex.split(docker_line)
        volumes = [words[i + 1] for i, word in enumerate(words) if word == "-v"]
        mounts[node_id] = [volume for volume in volumes if "secrets" in volume]
    assert mounts["0"] == [f"{keys}/master:/run/secrets/gaudi-cluster:ro"]
    assert mounts["1"] == [f"{keys}/nodes/{me}:/run/secrets/gaudi-cluster:ro"]
    shutil.rmtree(keys / "nodes" / me)
    (keys / "nodes" / "any").mkdir()  # make keys' old shared part: never mounted
    done = dry_run(SBATCH, SLURM_NODEID="1", **common)
    assert done.returncode == 2 and "nodes/any" not in done.stdout
    assert done.stderr.count("\n") == 1
    assert f"no host key of its own for node {me} in {keys}/nodes; fix: make keys NAMES=" in done.stderr
    old = tmp_path / "old"
    old.mkdir()
    (old / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")  # a key directory from before nodes/
    done = dry_run(SBATCH, DRY_RUN="0", **{**common, "GAUDI_CLUSTER_KEYS": str(old)})
    assert done.returncode == 2 and f"{old}/nodes" in done.stderr and "fix: make keys NAMES=" in done.stderr


def test_sbatch_pyxis_mode_refuses_a_key_directory_with_a_host_key(tmp_path):
    """pyxis mounts one directory on every node: a host key in it would be every node's."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")
    mode = {"GAUDI_CLUSTER_SLURM_MODE": "pyxis", "GAUDI_CLUSTER_KEYS": str(keys)}
    assert dry_run(SBATCH, **mode).returncode == 0
    (keys / "ssh_host_ed25519_key").write_text("one key\n")
    done = dry_run(SBATCH, **mode)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert (
        "would be every node's; fix: GAUDI_CLUSTER_KEYS=a directory with the client key pair only"
        in done.stderr
    )


@pytest.mark.parametrize("old", ["nodes/any", "worker"])
def test_run_node_refuses_a_worker_without_its_own_key(tmp_path, old):
    """scripts/run-node.sh mounts a worker's own nodes/<host name>/; make keys' old shared parts
    (nodes/any, worker/: one host key on many nodes) are never a fallback."""
    keys = tmp_path / "keys"
    (keys / old).mkdir(parents=True)
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")
    done = dry_run(RUN_NODE, "worker", GAUDI_CLUSTER_KEYS=str(keys))
    me = socket.gethostname().split(".")[0]
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert f"no host key of this node's own in {keys}/nodes/ ({me}); fix: make keys NAMES=" in done.stderr
    (keys / "nodes" / me).mkdir(parents=True)
    words = shlex.split(dry_run(RUN_NODE, "worker", GAUDI_CLUSTER_KEYS=str(keys)).stdout)
    assert f"{keys}/nodes/{me}:/run/secrets/gaudi-cluster:ro" in words


def test_sbatch_pyxis_and_direct_modes_run_the_entrypoint_with_auto(tmp_path):
    keys = tmp_path / "keys"  # the client key pair only: not the checkout's .keys, whatever it holds
    keys.mkdir()
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAA\n")
    mode = {"GAUDI_CLUSTER_SLURM_MODE": "pyxis", "GAUDI_CLUSTER_KEYS": str(keys)}
    pyxis = shlex.split(dry_run(SBATCH, "job.py", **mode).stdout)
    assert any(word.startswith("--container-image=gaudi-cluster:gaudi") for word in pyxis)
    assert pyxis[-3:] == ["/opt/gaudi-cluster/entrypoint/entrypoint.sh", "auto", "job.py"]
    direct = shlex.split(dry_run(SBATCH, GAUDI_CLUSTER_SLURM_MODE="direct").stdout)
    assert direct[-2:] == ["/opt/gaudi-cluster/entrypoint/entrypoint.sh", "auto"]
    assert "--kill-on-bad-exit=1" in direct


def test_sbatch_refuses_an_unknown_mode_and_a_missing_key():
    done = dry_run(SBATCH, GAUDI_CLUSTER_SLURM_MODE="podman")
    assert done.returncode == 2
    assert "GAUDI_CLUSTER_SLURM_MODE='podman'" in done.stderr and "fix:" in done.stderr
    done = dry_run(SBATCH, DRY_RUN="0", GAUDI_CLUSTER_KEYS="/nonexistent")
    assert done.returncode == 2
    assert "no cluster key in /nonexistent" in done.stderr


# --- the master's release of a Slurm step's workers ---------------------------------------------------


def test_master_releases_the_other_nodes_of_the_step_but_not_lost_ones(tmp_path, monkeypatch):
    from gaudi_cluster.engines import nodewatch

    calls = []

    def fake_run_on_hosts(hosts, command, config, timeout_s, connect_timeout_s=None, stdin=None):
        calls.append((list(hosts), command, config.read_text()))
        return {host: ssh.SshResult(host, 0, "", "") for host in hosts}

    monkeypatch.setattr(ssh, "run_on_hosts", fake_run_on_hosts)
    from gaudi_cluster.job.settings import JobSettings

    config = JobSettings.from_config(resolve_config({}, {"GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs")}))
    env = {**SLURM_STEP, "SLURM_NODEID": "0"}
    nodewatch.release_workers(config.release, env, None, 1, skip={"gaudi03"})
    ((hosts, command, ssh_config),) = calls
    assert hosts == ["gaudi02"]
    assert command[-6:] == ["gaudi_cluster.engines.nodewatch", "release", "--key", "77.0", "--exit-code", "1"]
    assert "BatchMode yes" in ssh_config
    calls.clear()
    nodewatch.release_workers(config.release, {"GAUDI_CLUSTER_PEERS": "a,b"}, None, 0)
    assert calls == []


def test_auto_follows_here_as_a_slurm_worker_reached_by_srun_and_goes_back_to_the_entrypoint_otherwise(
    tmp_path,
):
    """One interpreter decides the role and, as a Slurm worker the master reaches by srun steps, is the
    node's follower itself; any other answer goes back to the entrypoint with the answer."""
    stub = tmp_path / "entrypoint.sh"
    stub.write_text('#!/bin/sh\necho "ran: $* | $GAUDI_CLUSTER_AUTO_ROLE"\n')
    stub.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "K_MPI", "JOB_COMPLETION"))},
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "run" / "jobs"),
    }

    def auto(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        argv = [
            "-m",
            "gaudi_cluster.engines.nodewatch",
            "auto",
            "--entrypoint",
            str(stub),
            "--",
            "job.py",
            "x",
        ]
        return subprocess.run(
            [sys.executable, *argv], check=False, env=env, capture_output=True, text=True, timeout=60
        )

    indexed = auto({**base, "JOB_COMPLETION_INDEX": "1"})
    assert (indexed.returncode, indexed.stdout) == (0, "ran: auto job.py x | worker indexed-job - ssh\n")

    slurm_worker = {**base, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1"}
    slurm_worker["SLURM_STEP_NODELIST"] = "node[1-2]"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "released-77.0").write_text("0\n")  # the master released it: it ends at once
    followed = auto(slurm_worker)
    assert (followed.returncode, followed.stdout) == (0, ""), followed.stderr  # the entrypoint never ran
    assert "role auto: worker (SLURM_NODEID=1); nodes reached by srun" in followed.stderr
    assert "following the master on node1 (Slurm step 77.0)" in followed.stderr
    assert "the job arguments are the master's: job.py x" in followed.stderr
    assert (tmp_path / "run" / "jobs").is_dir() and not (tmp_path / "run" / "released-77.0").exists()
