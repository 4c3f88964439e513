"""The pre-imported rank (rank/zygote): the guard, the key, a forked rank that sees what a plain start
gives it, and the zygote kept warm for the next attempt."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from gaudi_cluster.launch.node import connect_agents, start_zygote, zygote_place
from gaudi_cluster.rank import zygote_client
from gaudi_cluster.rank.cmdline import StartStrings, laid_out
from gaudi_cluster.rank.zygote_rules import (
    CPU_PRELOAD,
    DEVICE_PRELOAD,
    Script,
    fork_refusal,
    key_difference,
    openblas_threads,
    preload_modules,
    script_of,
)
from gaudi_cluster.wire.node_spec import NodeSpec

from tests.support.waiting import wait_for

PY = sys.executable


def test_the_guard_refuses_a_second_thread_a_device_file_and_a_bridge():
    assert fork_refusal(1, ["/dev/null", "pipe:[12]"], ["torch", "os"]) is None
    assert fork_refusal(2, [], []) == "the zygote has 2 threads (a fork is safe with one)"
    for device in ("/dev/accel/accel0", "/dev/nvidia0", "/dev/nvidiactl", "/dev/hl0"):
        assert fork_refusal(1, ["/dev/null", device], []) == f"the zygote has a device file open ({device})"
    assert "habana_frameworks.torch" in (fork_refusal(1, [], ["habana_frameworks.torch"]) or "")


def test_the_real_guard_sees_a_second_thread():
    """A thread started in the process itself (not a stub): the guard counts /proc/self/task."""
    code = textwrap.dedent(
        """
        import threading, time
        from gaudi_cluster.rank import zygote
        print(zygote.refusal_now())
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        print(zygote.refusal_now())
        """
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == ["None", "the zygote has 2 threads (a fork is safe with one)"]


def test_the_real_guard_sees_an_open_device_file():
    """The descriptors' targets as /proc/self/fd gives them (no accelerator here: an open /dev/null
    stands in for one), in a process of its own (a test runner's worker has threads of its own)."""
    code = textwrap.dedent(
        """
        import os
        from gaudi_cluster.rank import zygote
        print(zygote.refusal_now())
        fd = os.open(os.devnull, os.O_RDONLY)
        real = os.readlink
        zygote.os.readlink = lambda p: "/dev/accel/accel3" if p == f"/proc/self/fd/{fd}" else real(p)
        print(zygote.refusal_now())
        """
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == ["None", "the zygote has a device file open (/dev/accel/accel3)"]


def test_import_time_settings_are_the_key_and_secrets_are_not():
    base = {"PT_HPU_LAZY_MODE": "1", "OMP_NUM_THREADS": "4", "RANK": "0", "PATH": "/bin"}
    assert key_difference(base, {**base, "RANK": "5", "HF_TOKEN": "x", "PATH": "/usr/bin"}) == []
    assert key_difference(base, {**base, "PT_HPU_LAZY_MODE": "0"}) == ["PT_HPU_LAZY_MODE"]
    assert key_difference(base, {**base, "DS_ACCELERATOR": "hpu"}) == ["DS_ACCELERATOR"]
    assert key_difference(base, {k: v for k, v in base.items() if k != "OMP_NUM_THREADS"}) == [
        "OMP_NUM_THREADS"
    ]
    # numpy's OpenBLAS reads these at import too
    assert key_difference(base, {**base, "OPENBLAS_NUM_THREADS": "2", "GOTO_NUM_THREADS": "2"}) == [
        "GOTO_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
    ]


def test_a_forked_ranks_blas_pool_is_sized_as_openblas_sizes_it_at_import():
    """OPENBLAS_NUM_THREADS, then GOTO_NUM_THREADS, then OMP_NUM_THREADS (the first positive count),
    never more than the CPUs it sees; else a thread per CPU."""
    assert openblas_threads({}, 8) == 8
    assert openblas_threads({"OMP_NUM_THREADS": "2"}, 8) == 2
    assert openblas_threads({"OMP_NUM_THREADS": "2", "GOTO_NUM_THREADS": "3"}, 8) == 3
    assert (
        openblas_threads({"OPENBLAS_NUM_THREADS": "4", "GOTO_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}, 8)
        == 4
    )
    assert openblas_threads({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}, 8) == 2
    assert openblas_threads({"OPENBLAS_NUM_THREADS": "x", "OMP_NUM_THREADS": "-1"}, 8) == 8
    assert openblas_threads({"OMP_NUM_THREADS": "64"}, 8) == 8
    assert openblas_threads({}, 0) == 1


def test_only_the_cpu_stack_preimports_deepspeed():
    assert preload_modules({"DS_ACCELERATOR": "cpu"}) == CPU_PRELOAD
    assert "deepspeed" in CPU_PRELOAD
    for env in ({"DS_ACCELERATOR": "hpu", "PT_HPU_LAZY_MODE": "1"}, {"DS_ACCELERATOR": "cuda"}, {}):
        assert preload_modules(env) == DEVICE_PRELOAD
        assert not any(name.startswith(("deepspeed", "habana")) for name in preload_modules(env))


def test_only_a_python_script_runs_in_the_zygote():
    same = {"/usr/bin/python3": "/usr/bin/python3.11", "/py": "/usr/bin/python3.11"}.get
    real = lambda p: same(p, p)  # noqa: E731
    assert script_of(["/py", "-u", "t.py", "--a", "-b"], "/usr/bin/python3", real) == Script(
        "t.py", ("t.py", "--a", "-b"), True
    )
    assert script_of(["/py", "t.py"], "/usr/bin/python3", real) == Script("t.py", ("t.py",), False)
    for program in (["/py", "-m", "train"], ["/py", "-c", "x"], ["/py", "-O", "t.py"], ["/py", "-u"]):
        assert isinstance(script_of(program, "/py", real), str), program
    assert "not this interpreter" in str(script_of(["/other/python", "t.py"], "/py", real))
    assert "not this interpreter" in str(script_of(["bash", "t.sh"], "/py", real))


DUMP = """
import json, os, random, sys
import torch, transformers  # what the zygote preimports here (no DS_ACCELERATOR: torch, transformers)
print("out", os.environ["RANK"])
sys.stderr.write("err\\n")
state = {"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path,
         "name": __name__, "own_group": os.getpgid(0) == os.getpid(), "stdin": sys.stdin.read(),
         "random": random.random(), "torch_seed": torch.initial_seed(),
         "cmdline": open("/proc/self/cmdline", "rb").read().decode()}
with open(os.environ["DUMP"], "w") as f:
    json.dump(state, f)
sys.exit(int(os.environ["RANK"]))  # rank 0: a clean exit, status 0
"""


@pytest.fixture
def dump_script(tmp_path: Path) -> Path:
    script = tmp_path / "code" / "dump.py"
    script.parent.mkdir()
    script.write_text(DUMP)
    return script


def serve(tmp_path: Path, env: dict[str, str], keep_s: float = 0) -> tuple[subprocess.Popen[bytes], Path]:
    """A zygote listening in tmp_path (once its socket is there), as launch/node starts one."""
    path = tmp_path / "z.sock"
    server = subprocess.Popen(
        [PY, "-u", "-m", "gaudi_cluster.rank.zygote", "--listen", str(path), "--keep-s", str(keep_s)], env=env
    )
    assert wait_for(path.exists, 30)
    return server, path


def _rank_env(tmp_path: Path, rank: int, how: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    # OpenBLAS (numpy, under torch) starts a thread pool at import unless told one thread.
    return {
        **env,
        "OMP_NUM_THREADS": "1",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "DUMP": str(tmp_path / f"{how}{rank}.json"),
    }


def test_a_forked_rank_sees_what_a_plain_start_gives(tmp_path, dump_script):
    """Rank by rank: environment, sys.argv, cwd, sys.path, __main__, its own process group, stdin,
    output and exit code; each rank's RNGs seeded afresh, as separate processes are."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    program = [PY, "-u", str(dump_script), "--lr", "1", "x y"]
    zygote_env = {k: v for k, v in _rank_env(tmp_path, 0, "z").items() if k not in ("RANK", "LOCAL_RANK")}
    server, path = serve(tmp_path, zygote_env)
    try:
        links = [zygote_client.ZygoteLink(conn) for conn in connect_agents(path, 2) or []]
        assert [link.wait_ready() for link in links] == [None, None]
        children = [
            link.start(program, _rank_env(tmp_path, rank, "z"), str(workdir))
            for rank, link in enumerate(links)
        ]
        assert all(isinstance(child, zygote_client.ZygoteChild) for child in children), children
        forked = [(child.stdout.read(), child.wait()) for child in children]  # type: ignore[union-attr]
    finally:
        for link in links:
            link.close()
    assert server.wait(timeout=60) == 0  # it leaves once its agents and ranks have
    for rank, (output, code) in enumerate(forked):
        plain = subprocess.run(
            program, check=False, env=_rank_env(tmp_path, rank, "p"), cwd=workdir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, timeout=120,
        )  # fmt: skip
        assert (output, code) == (plain.stdout, plain.returncode) == (f"out {rank}\nerr\n".encode(), rank)
        z, p = (json.loads((tmp_path / f"{how}{rank}.json").read_text()) for how in "zp")
        assert z["env"].pop("DUMP") != p["env"].pop("DUMP")
        for field in ("env", "argv", "cwd", "path", "name", "own_group", "stdin"):
            assert z[field] == p[field], field
        assert z["argv"] == [str(dump_script), "--lr", "1", "x y"] and z["own_group"]
        assert p["cmdline"] == "\0".join(program) + "\0"
        assert shown(z["cmdline"]) in (program, [" ".join(program)]), z["cmdline"]  # what ps shows
    first, second = (json.loads((tmp_path / f"z{rank}.json").read_text()) for rank in (0, 1))
    assert first["random"] != second["random"] and first["torch_seed"] != second["torch_seed"]


def shown(cmdline: str) -> list[str]:
    """A command line's words as ps reads /proc/PID/cmdline: NUL-separated, trailing NULs dropped."""
    return cmdline.rstrip("\0").split("\0")


def test_a_forked_ranks_command_line_is_laid_over_the_zygotes_strings():
    """Where the rank's words fit the zygote's argument area they stay words (the area's last byte
    NUL); otherwise one line runs on over the environment strings, cut to fit (its last byte not NUL
    within the argument area: the kernel then reads on); where no environment follows, the argument
    area alone takes it."""
    strings = StartStrings(1000, 1020, 1020, 1100)
    assert strings.room == 100
    fits = laid_out(["python", "-u", "t.py"], strings)
    assert len(fits) == 100 and shown(fits.decode()) == ["python", "-u", "t.py"] and fits[19] == 0
    words = ["/opt/venv/bin/python3", "-u", "/workspace/train.py", "--lr", "0.1"]
    line = laid_out(words, strings)
    assert len(line) == 100 and line[19] != 0 and line.rstrip(b"\0") == " ".join(words).encode()
    longer = laid_out([*words, "--output_dir", "/x" * 60], strings)
    assert len(longer) == 100 and longer[:99] == " ".join([*words, "--output_dir", "/x" * 60]).encode()[:99]
    assert longer[99] == 0
    apart = StartStrings(1000, 1020, 5000, 5100)
    assert apart.room == 20
    cut = laid_out(words, apart)
    assert len(cut) == 20 and cut == " ".join(words).encode()[:19] + b"\0"


def fork_one(tmp_path: Path, script: Path, env: dict[str, str]) -> dict:
    """`python SCRIPT` forked as rank `env` by a zygote of its settings (not refused: it had one thread
    still), exit 0; the JSON it printed. The zygote leaves once its agent has."""
    server, path = serve(tmp_path, {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK")})
    link = zygote_client.ZygoteLink((connect_agents(path, 1) or [])[0])
    try:
        assert link.wait_ready() is None
        child = link.start([PY, str(script)], env, str(tmp_path))
        assert isinstance(child, zygote_client.ZygoteChild), child
        printed = json.loads(child.stdout.read())  # type: ignore[union-attr]
        assert child.wait() == 0
    finally:
        link.close()
    assert server.wait(timeout=60) == 0
    return printed


def test_the_cpu_zygote_preimports_the_trainer_and_still_forks_with_the_ranks_own_environment(tmp_path):
    """The bundled workload's Trainer stack (pyarrow among it, whose jemalloc would start a thread) is
    imported before the fork, and the setting that keeps that thread off never reaches the rank."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps({'trainer': 'transformers.trainer' in sys.modules,\n"
        "                  'arrow': 'pyarrow' in sys.modules,\n"
        "                  'env': sorted(n for n in os.environ if n.startswith(('JE_', 'ARROW_')))}))\n"
    )
    env = {**_rank_env(tmp_path, 0, "z"), "DS_ACCELERATOR": "cpu"}
    assert fork_one(tmp_path, script, env) == {"trainer": True, "arrow": True, "env": []}


THREADS = """
import json, os, sys
import torch, transformers  # numpy's OpenBLAS among them: its pool starts at import
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "main": __name__}))
"""


def test_a_rank_whose_omp_threads_are_not_one_is_forked_with_a_plain_starts_blas_pool(tmp_path):
    """An HPU or GPU server's ranks (nothing sets OMP_NUM_THREADS there), or CPU ranks with cores of
    their own: the zygote imports with one BLAS thread, so it may fork, and the rank then runs as many
    threads as a plain start (numpy's OpenBLAS pool sized as at its import)."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "OPENBLAS_", "GOTO_", "DS_"))}
    env |= {"RANK": "0", "LOCAL_RANK": "0"}
    forked = fork_one(tmp_path, script, env)
    plain = subprocess.run(
        [PY, str(script)], check=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert forked == json.loads(plain.stdout)
    assert forked["main"] == "__main__"
    assert forked["threads"] >= min(2, len(os.sched_getaffinity(0)))  # a pool, wherever there are 2 CPUs


def test_a_rank_with_other_import_time_settings_is_refused_with_its_reason(tmp_path, dump_script):
    server, path = serve(tmp_path, {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "hpu"})
    env = {**os.environ, "OMP_NUM_THREADS": "2", "DS_ACCELERATOR": "hpu"}
    link = zygote_client.ZygoteLink((connect_agents(path, 1) or [])[0])
    assert link.wait_ready() is None
    answer = link.start([PY, str(dump_script)], env, str(tmp_path))
    link.close()
    assert answer == "import-time settings differ from the zygote's: OMP_NUM_THREADS"
    assert server.wait(timeout=60) == 0


def test_no_preimport_and_its_variable_turn_the_zygote_off_on_every_node():
    import argparse

    from gaudi_cluster.launch.launchers import plan_for
    from gaudi_cluster.settings.config import resolve_config
    from gaudi_cluster.settings.flags import add_config_flags
    from gaudi_cluster.wire.node_spec import FanoutSpec

    from tests.unit.test_direct import inputs

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert resolve_config({}, {}).preimport is True
    assert resolve_config(vars(parser.parse_args(["--no-preimport"])), {}).preimport is False
    assert resolve_config({}, {"GAUDI_CLUSTER_PREIMPORT": "0"}).preimport is False
    for wanted in (True, False):
        launch = FanoutSpec.from_json(plan_for("direct", inputs(preimport=wanted)).stdin or "")
        assert [node.spec.preimport for node in launch.nodes] == [wanted, wanted]


def test_the_zygotes_socket_appears_only_once_it_listens(tmp_path, monkeypatch):
    """A node process connects as soon as the socket's file is there: one bound but not yet listening
    refused it, and that node's ranks started plainly (seen in CI under load). A second zygote of the
    same settings finds the name taken and leaves the first's socket as it was."""
    from gaudi_cluster.rank import zygote

    path = tmp_path / "z.sock"
    seen_at_listen: list[bool] = []
    real_listen = socket.socket.listen

    def watched_listen(self: socket.socket, *args: int) -> None:
        seen_at_listen.append(path.exists())
        real_listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", watched_listen)
    first = zygote.listen(str(path))
    assert first is not None and seen_at_listen == [False]
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        inode = path.stat().st_ino
        assert zygote.listen(str(path)) is None
        assert path.stat().st_ino == inode
        assert sorted(p.name for p in tmp_path.iterdir()) == ["z.sock"]  # no private name left
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
            agent.connect(str(path))
    finally:
        first.close()


def test_a_node_starts_no_zygote_for_a_program_it_could_not_fork():
    from gaudi_cluster.launch.launchers import plan_for
    from gaudi_cluster.launch.node import wants_zygote
    from gaudi_cluster.wire.node_spec import FanoutSpec

    from tests.unit.test_direct import inputs

    def node_wants(program: tuple[str, ...], preimport: bool = True) -> bool:
        given = inputs(preimport=preimport, program=program)
        launch = FanoutSpec.from_json(plan_for("direct", given).stdin or "")
        return wants_zygote(launch.nodes[0].spec)

    python = inputs().python
    assert node_wants((python, "-u", "train.py", "--steps", "3")) is True
    assert node_wants((python, "train.py"), preimport=False) is False
    assert node_wants((python, "-c", "import sys; sys.exit(7)")) is False
    assert node_wants((python, "-m", "pkg.train")) is False
    assert node_wants(("bash", "-c", "sleep 1")) is False


def _node_spec(cwd: Path, keep_s: float) -> NodeSpec:
    return NodeSpec(
        node_rank=0, nnodes=1, first_rank=0, slots=(0,), world_size=1, master_addr="127.0.0.1",
        master_port=29500, cwd=str(cwd), env={}, python=PY, agent_args=("--", PY, "t.py"),
        preimport_keep_s=keep_s,
    )  # fmt: skip


def _peer_pid(conn: socket.socket) -> int:
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:  # a zombie of ours: ended
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def node_temp(short_tmp, monkeypatch) -> Path:
    """launch/node's temporary directory for one test (its zygotes' sockets live under it)."""
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    return short_tmp


def test_the_next_attempt_finds_the_zygote_warm_and_other_settings_retire_it(
    node_temp, tmp_path, dump_script
):
    """Two attempts of the same settings share one zygote (no second import); a job with another
    import-time setting gets a zygote of its own, and the first leaves once its agents have gone."""
    env = {k: v for k, v in _rank_env(tmp_path, 0, "w").items() if k not in ("RANK", "LOCAL_RANK")}
    spec = _node_spec(tmp_path, keep_s=120)
    first = start_zygote(spec, env, 1)
    assert first is not None and first.leaves_with_us is None  # warm: it outlives the node process
    link = zygote_client.ZygoteLink(first.conns[0])
    assert link.wait_ready() is None
    pid = _peer_pid(first.conns[0])
    child = link.start([PY, "-u", str(dump_script)], {**env, "RANK": "0"}, str(tmp_path))
    assert isinstance(child, zygote_client.ZygoteChild) and child.wait() == 0
    link.close()

    again = start_zygote(spec, env, 2)  # the restart: the same zygote answers, ready at once
    assert again is not None and {_peer_pid(conn) for conn in again.conns} == {pid}
    started = time.monotonic()
    assert [zygote_client.ZygoteLink(conn).wait_ready() for conn in again.conns] == [None, None]
    assert time.monotonic() - started < 1.0
    place = node_temp / f"gaudi-cluster-zygotes-{os.getuid()}"
    assert stat.S_IMODE(place.stat().st_mode) == 0o700 and len(list(place.glob("*.sock"))) == 1

    other = start_zygote(spec, {**env, "OMP_NUM_THREADS": "1", "TORCH_X": "1"}, 1)
    assert other is not None and _peer_pid(other.conns[0]) != pid
    assert len(list(place.glob("*.sock"))) == 1  # the first one's socket went: it takes no one new
    assert not _gone(pid)  # its agents are still connected: it serves them
    for conn in again.conns:
        conn.close()
    assert wait_for(lambda: _gone(pid), 10), "the retired zygote did not leave"
    newer = _peer_pid(other.conns[0])
    other.conns[0].close()
    os.kill(newer, signal.SIGKILL)  # warm for 120 s otherwise


def test_a_zygote_that_never_listens_turns_the_preimport_off_and_says_why(node_temp, tmp_path, capsys):
    """Its interpreter fails at once: the ranks start plainly, and the node's line names the status
    and the zygote's log, which holds what it printed."""
    env = {k: v for k, v in _rank_env(tmp_path, 0, "f").items() if k not in ("RANK", "LOCAL_RANK")}
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho cannot start >&2\nexit 3\n")
    broken.chmod(0o755)
    spec = dataclasses.replace(_node_spec(tmp_path, keep_s=0), python=str(broken))
    assert start_zygote(spec, env, 1) is None
    line = capsys.readouterr().out.strip()
    assert "preimport off: the zygote did not open" in line and "(it exited with status 3;" in line
    log = Path(line.rsplit("its log: ", 1)[1].rstrip(")"))
    assert log.read_text() == "cannot start\n"


def test_with_keep_0_the_zygote_leaves_with_its_agents(node_temp, tmp_path):
    env = {k: v for k, v in _rank_env(tmp_path, 0, "k").items() if k not in ("RANK", "LOCAL_RANK")}
    zygote = start_zygote(_node_spec(tmp_path, keep_s=0), env, 1)
    assert zygote is not None and zygote.leaves_with_us is not None
    assert zygote_client.ZygoteLink(zygote.conns[0]).wait_ready() is None
    zygote.conns[0].close()
    assert zygote.leaves_with_us.wait(timeout=30) == 0


STAND_IN = """
import json, sys, tempfile, time
tempfile.tempdir = sys.argv[1]
from gaudi_cluster.launch.node import start_zygote
from gaudi_cluster.rank import zygote_client
from gaudi_cluster.wire.node_spec import NodeSpec
spec, env, program = NodeSpec.from_json(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
zygote = start_zygote(spec, env, 1)
link = zygote_client.ZygoteLink(zygote.conns[0])
assert link.wait_ready() is None
child = link.start(program, {**env, "RANK": "0"}, spec.cwd)
print(json.dumps([zygote.leaves_with_us.pid, child.pid]), flush=True)
time.sleep(600)
"""


def test_a_zygote_that_leaves_with_the_job_dies_with_its_node_process_and_so_do_its_ranks(
    node_temp, tmp_path
):
    """Under Slurm the zygote leaves with the attempt, yet it ignores the stop signals: a node process
    killed outright (a step killed, a node process SIGKILLed) must not leave it, nor a rank it forked,
    running on a node whose step's tracker no longer sees them."""
    env = {k: v for k, v in _rank_env(tmp_path, 0, "d").items() if k not in ("RANK", "LOCAL_RANK")}
    rank = tmp_path / "forever.py"
    rank.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    stand_in = subprocess.Popen(
        [PY, "-c", STAND_IN, str(node_temp), _node_spec(tmp_path, keep_s=0).to_json(), json.dumps(env),
         json.dumps([PY, str(rank)])],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    zygote, forked = json.loads(stand_in.stdout.readline())
    assert not _gone(zygote) and not _gone(forked)
    stand_in.kill()
    stand_in.wait(timeout=10)
    assert wait_for(lambda: _gone(zygote) and _gone(forked), 10), (_gone(zygote), _gone(forked))


def test_a_zygote_directory_others_can_enter_is_refused(short_tmp):
    place = short_tmp / f"gaudi-cluster-zygotes-{os.getuid()}"
    place.mkdir(mode=0o700)
    place.chmod(0o777)
    assert "is not a directory of ours closed to others" in str(zygote_place(os.getuid(), str(short_tmp)))
    place.chmod(0o700)
    assert zygote_place(os.getuid(), str(short_tmp)) == place


def test_the_zygote_stays_warm_by_default_and_never_inside_a_slurm_job():
    from gaudi_cluster.launch.prepare import preimport_keep_s
    from gaudi_cluster.settings.config import resolve_config

    keep = resolve_config({}, {}).preimport_keep
    assert keep == 600.0 and preimport_keep_s(keep, {}) == 600.0
    assert preimport_keep_s(keep, {"SLURM_JOB_ID": "7"}) == 0.0
    assert resolve_config({}, {"GAUDI_CLUSTER_PREIMPORT_KEEP": "0"}).preimport_keep == 0.0
