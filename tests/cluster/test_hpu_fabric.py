"""The fabric check on HPU-shaped nodes (conftest's `hold_hpu`: the stub hl-smi, fake accel and uverbs
devices; the ranks all-reduce with gloo on CPU, as these nodes have no habana_frameworks): a Gaudi NIC
port that hl-smi reports down, and a gaudinet.json missing where GAUDINET_PATH says it is, are each
named by `doctor --fabric` and stop `master --fabric-check` with one line naming the host and the fix; a
held node's failed pairs show the last lines of its HCCL log. One rank per node (--slots 1): the facts
and the links are per node."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

JOB = "/workspace/hpu/rank_env.py"
FAKE = "/etc/fake-habana"
CHECK = ("--slots", "1", "--env", "DS_ACCELERATOR=cpu")
GAUDINET = "/etc/gaudinet.json"


HELD = 2  # the worker given NET_ADMIN, whose traffic tc holds


@pytest.fixture(scope="module")
def cluster(hold_hpu):
    return hold_hpu(workers=2, worker_args={HELD: ["--cap-add", "NET_ADMIN"]})


def on_node(cluster, name: str, script: str) -> None:
    done = cluster.exec(name, "sh", "-c", script)
    assert done.returncode == 0, done.stderr


def names(cluster, name: str) -> set[str]:
    return {f"worker-{name.rsplit('-', 1)[1]}", cluster.ip_of(name)}  # its hostname or its address


def doctor_fabric(cluster, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = cluster.in_master("gaudi-cluster", "doctor", "--fabric", "--json", *CHECK, *flags)
    assert done.stdout.strip(), done.stderr
    return done, json.loads(done.stdout)["fabric"]


def master_stop_line(cluster, *flags: str) -> str:
    done = cluster.in_master("gaudi-cluster", "master", "--fabric-check", *CHECK, *flags, JOB)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RANK-ENV" not in done.stdout  # the job never started
    return done.stdout.strip().splitlines()[-1]


def the_bad_node(result: dict, worker: str, cluster) -> dict:
    (bad,) = result["bad_hosts"]
    assert bad in names(cluster, worker), result
    return next(n for n in result["nodes"] if n["host"] == bad)


def test_a_gaudi_nic_port_down_is_named_and_stops_the_launch(cluster):
    worker = cluster.worker_names[0]
    on_node(cluster, worker, f"printf '3/22\\n' > {FAKE}/ports_down")
    try:
        done, result = doctor_fabric(cluster)
        line = master_stop_line(cluster)
    finally:
        on_node(cluster, worker, f"rm -f {FAKE}/ports_down")
    assert done.returncode == 3, done.stderr
    node = the_bad_node(result, worker, cluster)
    assert node["state"] == "ports down" and node["ports_down"] == ["3/22"]
    assert all(n["efa_devices"] == 1 for n in result["nodes"])  # the uverbs0 stand-in on every node
    assert all(n["state"] == "ok" for n in result["nodes"] if n is not node)
    named = f"host {node['host']}: Gaudi NIC port(s) 3/22 down (hl-smi -n link); fix: drop it with --exclude "
    assert done.stderr.strip().splitlines()[-1].startswith(f"gaudi-cluster: fabric check failed: {named}")
    assert line.startswith(f"gaudi-cluster: fabric check failed: {named}"), line


def test_a_missing_gaudinet_json_is_named_and_stops_the_launch(cluster):
    worker = cluster.worker_names[1]
    present = [cluster.master, cluster.worker_names[0]]
    for name in present:
        on_node(cluster, name, f"echo '{{\"NIC_NET_CONFIG\": []}}' > {GAUDINET}")
    try:
        done, result = doctor_fabric(cluster, "--env", f"GAUDINET_PATH={GAUDINET}")
        line = master_stop_line(cluster, "--env", f"GAUDINET_PATH={GAUDINET}")
    finally:
        for name in present:
            on_node(cluster, name, f"rm -f {GAUDINET}")
    assert done.returncode == 3, done.stderr
    node = the_bad_node(result, worker, cluster)
    assert node["state"] == "no gaudinet"
    named = f"host {node['host']}: {GAUDINET} is missing (L3 scale-out reads it); fix: write it there, or "
    assert done.stderr.strip().splitlines()[-1].startswith(f"gaudi-cluster: fabric check failed: {named}")
    assert line.startswith(f"gaudi-cluster: fabric check failed: {named}") and "--exclude " in line, line


def test_a_held_node_is_named_with_the_last_lines_of_its_hccl_log(cluster):
    worker = cluster.worker(HELD)
    log = "/var/log/habana_logs/hccl.log"  # under HABANA_LOGS, which every HPU preset sets
    lines = [f"[HCCL] scaleout link {i}: retry" for i in range(30)] + ["[HCCL] port 3 link down"]
    on_node(
        cluster,
        worker,
        f"mkdir -p {log.rsplit('/', 1)[0]} && printf '%s\\n' "
        + " ".join(f"'{line}'" for line in lines)
        + f" > {log}",
    )
    # Everything but ssh, the control channel, the rendezvous store and ARP starved to 8 kbit/s.
    starve = (
        "tc qdisc add dev eth0 root handle 1: htb default 20"
        " && tc class add dev eth0 parent 1: classid 1:10 htb rate 1gbit"
        " && tc class add dev eth0 parent 1: classid 1:20 htb rate 8kbit ceil 8kbit"
        " && for m in 'sport 3022' 'dport 29400' 'dport 29500'; do tc filter add dev eth0 parent 1:"
        " protocol ip prio 1 u32 match ip $m 0xffff flowid 1:10; done"
        " && tc filter add dev eth0 parent 1: protocol arp prio 2 u32 match u32 0 0 flowid 1:10"
    )
    on_node(cluster, worker, starve)
    try:
        done, result = doctor_fabric(cluster, "--fabric-timeout", "8")
    finally:
        on_node(cluster, worker, "tc qdisc del dev eth0 root")
        on_node(cluster, worker, f"rm -f {log}")
    assert done.returncode == 3, done.stderr
    node = the_bad_node(result, worker, cluster)
    assert node["state"] == "no answer"
    assert f"no answer from host {node['host']} within 8 s" in done.stderr.strip().splitlines()[-1]
    tail = [d.strip() for d in result["details"] if d.strip().startswith(f"{log}: ")]
    assert tail and tail[-1] == f"{log}: [HCCL] port 3 link down", result["details"]
    assert f"{log}: [HCCL] scaleout link 10: retry" not in tail  # its last 20 lines, not the whole log
