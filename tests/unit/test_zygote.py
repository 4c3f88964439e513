"""The pre-imported rank (rank/zygote): the guard, the key, and a forked rank that sees what a plain
start gives it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gaudi_cluster.rank import zygote_client
from gaudi_cluster.rank.zygote_rules import (
    CPU_PRELOAD,
    DEVICE_PRELOAD,
    Script,
    fork_refusal,
    key_difference,
    preload_modules,
    script_of,
)

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
         "random": random.random(), "torch_seed": torch.initial_seed()}
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
    pairs = [socket.socketpair() for _ in range(2)]
    theirs = [b.fileno() for _, b in pairs]
    server = subprocess.Popen(
        [PY, "-u", "-m", "gaudi_cluster.rank.zygote", "--fds", ",".join(map(str, theirs))],
        env=zygote_env,
        pass_fds=theirs,
    )
    for _, b in pairs:
        b.close()
    try:
        links = [zygote_client.ZygoteLink(a) for a, _ in pairs]
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
    first, second = (json.loads((tmp_path / f"z{rank}.json").read_text()) for rank in (0, 1))
    assert first["random"] != second["random"] and first["torch_seed"] != second["torch_seed"]


def test_a_rank_with_other_import_time_settings_is_refused_with_its_reason(tmp_path, dump_script):
    a, b = socket.socketpair()
    server = subprocess.Popen(
        [PY, "-u", "-m", "gaudi_cluster.rank.zygote", "--fds", str(b.fileno())],
        env={**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "hpu"},
        pass_fds=(b.fileno(),),
    )
    b.close()
    env = {**os.environ, "OMP_NUM_THREADS": "2", "DS_ACCELERATOR": "hpu"}
    link = zygote_client.ZygoteLink(a)
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
