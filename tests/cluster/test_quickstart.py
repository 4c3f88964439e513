"""README.md's CPU quickstart, run as written: the block after `<!-- quickstart: cpu -->` is extracted
and run by bash, so the test and the doc cannot drift. It mounts the user's code, data and Hugging Face
cache and passes HF_TOKEN by name; the token (a dummy) must reach rank 0's environment (its own line
says so; a plain start's /proc environ holds the very value, a forked rank's shows the zygote's) and
appear in no process's argv (host and container) and in no log or output file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- quickstart: cpu -->"
TOKEN = "hf_dummyQuickstartToken0123456789"
CONTAINER = "gaudi-cluster-master"

# Run inside the master's container while the job runs: every process's argv, and rank 0's HF_TOKEN.
SNAPSHOT = r"""
import json, os
found = {"argv": [], "rank0_token": None}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        raw = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        env = dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)
    except OSError:
        continue
    found["argv"].append(argv)
    if env.get("RANK") == "0" and "train.py" in argv and "gaudi_cluster" not in argv:  # not its agent
        found["rank0_token"] = env.get("HF_TOKEN", "")
print(json.dumps(found))
"""


def quickstart_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(re.escape(MARKER) + r"\n```bash\n(.*?)\n```", readme, re.S)
    assert match, f"README.md has no ```bash block after {MARKER}"
    return match.group(1)


def host_argvs() -> list[str]:
    argvs = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argvs.append(cmdline.read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return argvs


def test_readme_quickstart_runs_own_code_with_hf_token_reaching_rank_0(tmp_path, cluster_keys):
    # The block's paths are relative to the checkout: run it in a copy of the parts it names, so that
    # build/ (output, cache, rank logs) is this test's own. The keys are make keys' output, made by the
    # test: a fresh clone (CI) has no .keys until someone runs make keys.
    for name in ("scripts", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".keys").symlink_to(cluster_keys)
    subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True, check=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_") and k != "HF_TOKEN"}
    job = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", quickstart_block()],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert job.stdin and job.stdout
    job.stdin.write(TOKEN + "\n")
    job.stdin.close()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout or ()), daemon=True)
    reader.start()

    # Every argv seen while the job runs (container and host), and rank 0's HF_TOKEN where its
    # /proc environ shows it: a plain start's does; a rank the node's zygote forked shows the zygote's
    # start environment there (its own is set in the forked process), so only its own line says it.
    argvs: set[str] = set()
    rank0_token: str | None = None
    deadline = time.monotonic() + 300
    while job.poll() is None and time.monotonic() < deadline:
        done = subprocess.run(
            ["docker", "exec", CONTAINER, "python3", "-c", SNAPSHOT],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            seen = json.loads(done.stdout)
            argvs.update(seen["argv"])
            argvs.update(host_argvs())
            if seen["rank0_token"] is not None:
                rank0_token = seen["rank0_token"]
        time.sleep(0.3)
    try:
        rc = job.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True, check=False)
    reader.join(timeout=10)
    output = "".join(lines)
    assert rc == 0, output[-3000:]
    assert argvs and not [argv for argv in argvs if TOKEN in argv]
    assert "HF_TOKEN set; HF_HOME=/workspace/hf" in output, output[-3000:]  # rank 0's own view
    if "rank 0] gaudi-cluster[rank]: preimport: forked from the node's zygote" not in output:
        assert rank0_token == TOKEN, "rank 0 never ran with HF_TOKEN set\n" + output[-3000:]

    runs = tmp_path / "build" / "runs"
    result = json.loads((runs / "own-job-result.json").read_text())
    assert result["lines"] == 3 * result["world_size"] and result["steps"] == 20
    assert (tmp_path / "build" / "hf-cache" / "own-job-was-here").is_file()
    # The rank logs outlive the master's container, on the host beside the output.
    rank_logs = list(runs.glob("jobs/*/ranks/rank-0.log"))
    assert rank_logs, sorted(str(p.relative_to(runs)) for p in runs.rglob("*"))
    assert "HF_TOKEN set" in rank_logs[0].read_text(errors="replace")
    assert TOKEN not in output
    for path in runs.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    shutil.rmtree(tmp_path / "build", ignore_errors=True)
