"""gaudi-cluster under a real Slurm 22.05 (controller + three nodes in containers, see conftest.py).

Every job is the shipped slurm/gaudi-cluster.sbatch, submitted with `sbatch -N3`; the nodes decide
their roles themselves (role `auto`), the master reads the step's node list, and the step ends when
the job does. The nodes have Slurm's client, so the master starts everything by srun steps and no
node runs ssh or sshd (nodes/srun); one job keeps the ssh path (GAUDI_CLUSTER_SLURM_LAUNCH=ssh).
The test that kills a node runs last: it leaves the cluster one node short.
"""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest
from gaudi_cluster.nodes import slurm as slurm_lists
from train.checkpoints import COMPLETE_MARKER

from tests.support.docker import wait_until
from tests.support.slurm import JOB_DIR, NODES, OUTPUT_MOUNT, SlurmCluster, SshWatch

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RANK_LINE = re.compile(r"^\[(?P<host>[\w.-]+) rank (?P<rank>\d+)\] ", re.MULTILINE)
SCRIPT = "/opt/gaudi-cluster/app/train/run_clm.py"
# Rank 0 logs every step (--logging_steps 1); the workload's events go to the job directory.
FIRST_STEP = r"rank 0\] \{'loss'"
# Generous: imports alone take 10 s on an idle core, and three ranks share two cores here.
FIRST_STEP_TIMEOUT_S = 300


def long_job(output: str) -> list[str]:
    """The bundled workload for far more steps than a test waits for, checkpointing only on a stop."""
    return [SCRIPT, "--do_train", "--output_dir", output, "--deepspeed", "ds_cpu",
            "--max_steps", "2000", "--save_steps", "1000", "--logging_steps", "1"]  # fmt: skip


def rank_hosts(log: str) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for match in RANK_LINE.finditer(log):
        seen.setdefault(int(match["rank"]), set()).add(match["host"])
    return seen


def complete_checkpoints(slurm: SlurmCluster, node: str, subdir: str) -> list[int]:
    root = slurm.output_dir(node) / subdir
    return sorted(
        int(path.parent.name.split("-")[1]) for path in root.glob(f"checkpoint-*/{COMPLETE_MARKER}")
    )


def no_job_processes_anywhere(slurm: SlurmCluster, nodes=NODES) -> bool:
    return not any(slurm.job_processes(node) for node in nodes)


def left_behind(slurm: SlurmCluster) -> dict[str, list[str]]:
    """What a failed no-leftover check shows: each node's job processes still there."""
    return {node: slurm.job_processes(node) for node in NODES}


# Valid and invalid expressions, the quirks of hostlist.c included; scontrol is the judge.
HOSTLISTS = [
    "node1",
    "node[1-3]",
    "n[08-10]",
    "n[8-10]",
    "n[008-10]",
    "node001,node[002-003]",
    "rack[1-2]-node[01-03],n[08-10]",
    "a[1-2]b[3-4]c[5-6]",
    "node1 node2\tnode3",
    "x[1-2],x2,y",
    "n[1,3-4,7]",
    "host-a.dom,host-b.dom",
    ",, ,",
    "n[5-]",
    "n[+5]",
    "n[1, 2]",
    "n[1a-3]",
    "n99999999999999999999999",
    "n[1-3",
    "[1-3",
    "a[x]b[1]c[1]",
    "n[0-65535]",
    "node[1-3]-ib",
    "n[3-1]",
    "n[1--2]",
    "n[0-65536]",
    "n[1a]",
    "n[]",
    "n[1,]",
    "n[[1]]",
    "n[1-2]x]",
    "n[a-b]",
    "n[1x2]",
    "a[3-1]b[1-2]",
]

SCONTROL_ALL = """
import json, subprocess, sys
out = {}
for expr in json.load(sys.stdin):
    done = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True)
    out[expr] = {"hosts": done.stdout.splitlines(), "invalid": "Invalid hostlist" in done.stderr}
print(json.dumps(out))
"""


def test_hostlist_expansion_matches_scontrol(slurm):
    proc = slurm.exec(NODES[0], "python3", "-c", SCONTROL_ALL, stdin=json.dumps(HOSTLISTS), check=True)
    truth = json.loads(proc.stdout)
    invalid = [expr for expr in HOSTLISTS if truth[expr]["invalid"]]
    assert len(invalid) >= 10 and len(HOSTLISTS) - len(invalid) >= 20, invalid
    for expr in HOSTLISTS:
        if truth[expr]["invalid"]:
            with pytest.raises(slurm_lists.HostlistError):
                slurm_lists.expand_hostlist(expr)
        else:
            assert slurm_lists.expand_hostlist(expr) == truth[expr]["hosts"], expr


def test_sbatch_trains_the_default_job_on_three_nodes(slurm):
    started = time.monotonic()
    with SshWatch(slurm) as watch:
        job = slurm.submit()
        state = slurm.wait_for_end(job, timeout=900)
    log = slurm.output(job)
    assert state == "COMPLETED", log[-4000:]
    assert slurm.job_field(job, "ExitCode") == "0:0"
    print(
        f"\ndefault job: sbatch -> COMPLETED in {time.monotonic() - started:.1f}s; ps samples {watch.samples}"
    )

    # Slurm started every process: no ssh client or sshd on any node, at any sample of the job.
    assert watch.seen == [], watch.seen
    assert all(watch.samples.get(node, 0) >= 5 for node in NODES), watch.samples
    assert "nodes reached by srun" in log
    assert re.search(r"3 ranks on 3 nodes, started by srun \(Slurm job \d+\)", log), log[-3000:]

    # Node 0 of the step is the master, every node runs one rank (slots from each node, not Slurm's 1).
    assert "role auto: master (SLURM_NODEID=0)" in log
    assert log.count("role auto: worker") == 2
    # A worker's task is one interpreter that decided its role and then followed the master (no
    # second one started to follow); the master's node ran none once its role was known.
    assert {node: watch.nodewatch.get(node) for node in NODES[1:]} == {"node2": {"auto"}, "node3": {"auto"}}
    assert watch.nodewatch.get("node1", {"auto"}) == {"auto"}, watch.nodewatch
    # Each node's launch task (launch.node, alive as long as its ranks) runs the node's relay and its
    # rank agents itself: besides the node's task, one interpreter a node beside its ranks.
    assert watch.relay_processes == set() and watch.agent_processes == set()
    assert rank_hosts(log) == {0: {"node1"}, 1: {"node2"}, 2: {"node3"}}
    assert re.search(r"job \S+ succeeded: 3 ranks on 3 nodes", log), log[-3000:]
    # The rendezvous port comes from the job id (enroot's rule), not the fixed default.
    assert f"master_port={61000 + job % 4536}" in log
    # The workers ended because the master released them: the step ended with the job.
    assert log.count("released by the master on node1") == 2

    # Training happened: loss went down, and every node holds its complete final checkpoint.
    state_file = slurm.output_dir("node1") / "checkpoint-40" / "trainer_state.json"
    losses = [e["loss"] for e in json.loads(state_file.read_text())["log_history"] if "loss" in e]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    for node in NODES:
        assert complete_checkpoints(slurm, node, ".")[-1] == 40, node
    assert wait_until(lambda: no_job_processes_anywhere(slurm), timeout=10), left_behind(slurm)


def test_the_ssh_path_stays_reachable_under_slurm(slurm):
    """GAUDI_CLUSTER_SLURM_LAUNCH=ssh: every node runs sshd and the master probes and launches over ssh."""
    job = slurm.submit("python3", "-c", "print('hello')", env={"GAUDI_CLUSTER_SLURM_LAUNCH": "ssh"})
    state = slurm.wait_for_end(job, timeout=300)
    log = slurm.output(job)
    assert state == "COMPLETED", log[-4000:]
    assert "nodes reached by ssh" in log
    assert re.search(r"3 ranks on 3 nodes, started over ssh", log), log[-3000:]
    assert rank_hosts(log) == {0: {"node1"}, 1: {"node2"}, 2: {"node3"}}
    assert log.count("released by the master on node1") == 2
    assert wait_until(lambda: no_job_processes_anywhere(slurm), timeout=10), left_behind(slurm)


def test_scancel_checkpoints_on_every_node_and_leaves_nothing(slurm):
    job = slurm.submit(*long_job("/workspace/output/stopped"))
    assert slurm.wait_for_output(job, FIRST_STEP, FIRST_STEP_TIMEOUT_S), slurm.output(job)[-4000:]
    assert "started by srun" in slurm.output(job)
    slurm.exec("slurmctl", "scancel", str(job), check=True)
    cancelled = time.monotonic()
    state = slurm.wait_for_end(job, timeout=60)
    ended_s = time.monotonic() - cancelled
    log = slurm.output(job)
    assert state == "CANCELLED", log[-4000:]
    print(f"\nscancel -> job {state} in {ended_s:.1f}s")
    assert "received SIGTERM; stopping job" in log
    assert wait_until(lambda: no_job_processes_anywhere(slurm), timeout=10), {
        node: slurm.job_processes(node) for node in NODES
    }
    # Every node saved the same step, and marked it complete.
    steps = {node: complete_checkpoints(slurm, node, "stopped") for node in NODES}
    if not all(steps[node] for node in NODES):
        print(f"\n{log}\n{slurm.rank_logs()}")
    assert all(steps[node] for node in NODES), steps
    assert len({tuple(found) for found in steps.values()}) == 1, steps


def test_an_exported_hf_token_reaches_rank_0_and_no_command_line(slurm):
    """docs/slurm.md's way: HF_TOKEN exported before sbatch, GAUDI_CLUSTER_ENV_PASS=HF_TOKEN."""
    token = "hf_dummySlurmToken0123456789"
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    # Every rank stays up until the test has read every process's argv (the stop file in each node's
    # output mount), not for a fixed time that a slow machine could outlast.
    stop = "stop-hf-token-test"
    job_code = (
        "import hashlib, os, time\n"
        "seen = hashlib.sha256(os.environ.get('HF_TOKEN', '').encode()).hexdigest()[:16]\n"
        "if os.environ['RANK'] == '0':\n"
        "    print('token', seen, flush=True)\n"
        "deadline = time.monotonic() + 300\n"
        f"while not os.path.exists('{OUTPUT_MOUNT}/{stop}') and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
    )
    job = slurm.submit(
        "python3", "-c", job_code, env={"GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN"}, secrets={"HF_TOKEN": token}
    )
    assert slurm.wait_for_output(job, r"rank 0\] token [0-9a-f]{16}", timeout=FIRST_STEP_TIMEOUT_S), (
        slurm.output(job)[-4000:]
    )
    argvs = {
        host: slurm.exec(host, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
        for host in (*NODES, "slurmctl")
    }
    for node in NODES:
        (slurm.output_dir(node) / stop).touch()
    state = slurm.wait_for_end(job, timeout=300)
    log = slurm.output(job)
    assert state == "COMPLETED", log[-4000:]
    assert f"rank 0] token {digest}" in log, log[-4000:]
    assert all(argv.strip() for argv in argvs.values()), argvs
    assert not [host for host, argv in argvs.items() if token in argv]
    assert token not in log
    # No file of the job (rank logs, the master's state) holds it; grep reads the token from stdin.
    for node in NODES:
        found = slurm.exec(
            node, "grep", "-rlF", "-f", "-", "/run/gaudi-cluster/jobs", JOB_DIR, stdin=token + "\n"
        )
        assert found.stdout == "", (node, found.stdout)


def test_failed_rank_fails_the_slurm_job_with_its_exit_code(slurm):
    job = slurm.submit("python3", "-c", "import os,sys;sys.exit(7*(os.environ['RANK']=='1'))")
    state = slurm.wait_for_end(job, timeout=300)
    log = slurm.output(job)
    assert state == "FAILED", log[-4000:]
    assert slurm.job_field(job, "ExitCode") == "7:0", log[-4000:]
    assert re.search(r"job \S+ failed: host node2 rank 1 exited with code 7", log), log[-4000:]
    gone = wait_until(lambda: no_job_processes_anywhere(slurm), timeout=10)
    assert gone, {node: slurm.job_processes(node) for node in NODES}


def test_killed_node_fails_the_job_fast_and_stops_the_others(slurm):
    """Last: node3 stays dead. Same bounds as tests/cluster/test_reliability.py for our part.

    The ranks only sleep: how fast a lost node is noticed does not depend on what they run, and a
    training job would spend most of this test importing torch.
    """
    job = slurm.submit("python3", "-u", "-c", "import time; print('up'); time.sleep(3600)")
    assert slurm.wait_for_output(job, r"(?s)(rank \d\] up.*){3}", 120), slurm.output(job)[-4000:]
    slurm.kill("node3")
    killed = time.monotonic()
    named = slurm.wait_for_output(job, r"gaudi-cluster: job \S+ failed: host node3", timeout=30)
    detected_s = time.monotonic() - killed
    log = slurm.output(job)
    assert named, log[-4000:]
    assert detected_s < 15, detected_s
    survivors = NODES[:2]
    assert wait_until(lambda: no_job_processes_anywhere(slurm, survivors), timeout=15), {
        node: slurm.job_processes(node) for node in survivors
    }
    # Slurm itself notices the dead node after SlurmdTimeout (5 s in slurm.conf) and fails the job.
    state = slurm.wait_for_end(job, timeout=120)
    print(f"\nkilled node: named after {detected_s:.1f}s, job {state} {time.monotonic() - killed:.1f}s after")
    assert state in ("NODE_FAIL", "FAILED"), state
