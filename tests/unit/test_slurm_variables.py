"""Slurm's host lists and job-step variables (gaudi_cluster.nodes.slurm), and the slots they leave to
the node.

The expected expansions are what `scontrol show hostnames` of Slurm 22.05 prints (checked against the
real one in tests/slurm on every `make test`); here they guard the parser without a Slurm.
"""

from __future__ import annotations

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import devices, slurm


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        pytest.param("node1", ["node1"], id="one"),
        pytest.param("n[08-10]", ["n08", "n09", "n10"], id="padding-from-low-bound"),
        pytest.param("n[8-10]", ["n8", "n9", "n10"], id="no-padding"),
        pytest.param("n[008-10]", ["n008", "n009", "n010"], id="padding-wider-than-high"),
        pytest.param(
            "rack[1-2]-node[01-03],n[08-10]",
            [*(f"rack{r}-node0{n}" for r in (1, 2) for n in (1, 2, 3)), "n08", "n09", "n10"],
            id="two-brackets-outer-first",
        ),
        pytest.param(
            "a[1-2]b[3-4]c[5-6]",
            ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
            id="three-brackets-in-slurms-order",
        ),
        pytest.param("a b\tc,d", ["a", "b", "c", "d"], id="separators"),
        pytest.param("x[1-2],x2", ["x1", "x2", "x2"], id="duplicates-kept"),
        pytest.param(",, ,", [], id="only-separators"),
        pytest.param("n[5-]", ["n5"], id="open-range"),
        pytest.param("n[+5]", ["n05"], id="sign-counts-in-width"),
        pytest.param("n[1, 2]", ["n1", "n02"], id="space-inside-bracket"),
        pytest.param("n[1a-3]", ["n01", "n02", "n03"], id="low-bound-garbage-unchecked"),
        pytest.param("n99999999999999999999999", ["n00018446744073709551615"], id="suffix-clamped"),
        pytest.param("n[1-3", ["n]"], id="unclosed-bracket"),
        pytest.param("a[x]b[1]c[1]", [], id="bad-third-bracket-dropped"),
    ],
)
def test_expand_hostlist_as_slurm(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


def test_range_cap_is_slurms_64k():
    assert len(slurm.expand_hostlist("n[0-65535]")) == slurm.MAX_RANGE == 65536
    with pytest.raises(slurm.HostlistError, match="more than 65536"):
        slurm.expand_hostlist("n[0-65536]")
    with pytest.raises(slurm.HostlistError, match="more than 65536"):
        slurm.expand_hostlist("n[0-18446744073709551615]")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("node[1-3]-ib", "'-ib' follows the last", id="text-after-last-bracket"),
        pytest.param("n[3-1]", "backwards", id="backwards"),
        pytest.param("n[1--2]", "negative", id="negative"),
        pytest.param("n[1a]", "invalid range", id="garbage"),
        pytest.param("n[]", "invalid range", id="empty"),
        pytest.param("n[1,]", "invalid range", id="empty-item"),
        pytest.param("n[1x2]", "invalid range", id="box"),
        pytest.param("a[3-1]b[1-2]", "before the last", id="bad-prefix-bracket"),
    ],
)
def test_expand_hostlist_refuses_as_slurm(text, match):
    with pytest.raises(slurm.HostlistError, match=match):
        slurm.expand_hostlist(text)


def test_step_hosts_prefers_the_step_and_checks_its_size():
    env = {
        "SLURM_JOB_NODELIST": "gaudi[01-04]",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_STEP_NODELIST": "gaudi[02-03]",
        "SLURM_STEP_NUM_NODES": "2",
    }
    assert slurm.step_hosts(env) == ["gaudi02", "gaudi03"]
    assert slurm.first_host(env) == "gaudi02"
    assert slurm.step_hosts({"SLURM_JOB_NODELIST": "g[1-2]", "SLURM_NNODES": "2"}) == ["g1", "g2"]


@pytest.mark.parametrize(
    ("env", "match"),
    [
        pytest.param({}, r"no Slurm node list.*fix:", id="none"),
        pytest.param({"SLURM_STEP_NODELIST": "n[1-2]-x"}, r"SLURM_STEP_NODELIST=.*fix:", id="invalid"),
        pytest.param({"SLURM_STEP_NODELIST": ","}, "names no host", id="empty"),
        pytest.param({"SLURM_STEP_NODELIST": "n1,n1"}, "n1 twice", id="twice"),
        pytest.param(
            {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "3"},
            "SLURM_STEP_NUM_NODES=3",
            id="count",
        ),
    ],
)
def test_step_hosts_errors(env, match):
    with pytest.raises(ConfigError, match=match):
        slurm.step_hosts(env)


def test_master_port_from_the_job_id_in_enroots_range():
    assert slurm.master_port({"SLURM_JOB_ID": "1"}) == 61001
    assert slurm.master_port({"SLURM_JOB_ID": "4536"}) == 61000
    assert slurm.master_port({"SLURM_JOB_ID": "123456"}) == 61000 + 123456 % 4536
    assert all(61000 <= slurm.master_port({"SLURM_JOB_ID": str(j)}) <= 65535 for j in range(0, 20000, 7))
    assert slurm.master_port({}) is None
    with pytest.raises(ConfigError, match="SLURM_JOB_ID='12a'"):
        slurm.master_port({"SLURM_JOB_ID": "12a"})


def test_run_key_node_id_and_gpus():
    assert slurm.run_key({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}) == "42.0"
    assert slurm.run_key({"SLURM_JOB_ID": "42"}) == "42.0"
    assert slurm.run_key({}) is None
    assert slurm.node_id({"SLURM_NODEID": "2"}) == 2
    assert slurm.node_id({}) is None
    assert slurm.gpus_on_node({"SLURM_GPUS_ON_NODE": "8"}) == 8
    with pytest.raises(ConfigError, match="SLURM_NODEID"):
        slurm.node_id({"SLURM_NODEID": "x"})


@pytest.mark.parametrize(
    ("env", "accel_nodes", "slots"),
    [
        pytest.param({}, 8, 8, id="devices"),
        pytest.param({"HABANA_VISIBLE_DEVICES": "all"}, 8, 8, id="all-means-detect"),
        pytest.param({"HABANA_VISIBLE_DEVICES": "4,5,6,7"}, 8, 4, id="visible-list"),
        pytest.param({"SLURM_GPUS_ON_NODE": "2"}, 8, 2, id="gres"),
        pytest.param({"SLURM_GPUS_ON_NODE": "0"}, 8, 8, id="no-gres-asked"),
        pytest.param({"HABANA_VISIBLE_MODULES": "0,1", "SLURM_GPUS_ON_NODE": "4"}, 8, 2, id="modules-first"),
        pytest.param(
            {"HABANA_VISIBLE_DEVICES": "0,1,2", "SLURM_GPUS_ON_NODE": "4"}, 8, 3, id="list-over-gres"
        ),
        pytest.param({"SLURM_NTASKS_PER_NODE": "1"}, 8, 8, id="tasks-ignored"),
    ],
)
def test_hpu_slots_honour_what_the_engine_gave(env, accel_nodes, slots):
    listing = [f"accel{i}" for i in range(accel_nodes)] + [f"accel_controlD{i}" for i in range(accel_nodes)]
    gaudi = lambda _: devices.HABANA_DRIVER  # noqa: E731 - every card's sysfs driver
    assert (
        devices.detect_slots("hpu", env, list_dir=lambda _: listing, run=lambda _: None, driver_of=gaudi)
        == slots
    )
