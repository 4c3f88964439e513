from __future__ import annotations

import socket

import pytest
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.nodes import slurm
from gaudi_cluster.nodes.discovery import (
    Peer,
    peers_from_dns,
    peers_from_hostfile,
    peers_from_mpi_operator,
    peers_from_slurm,
    peers_from_static,
    wait_for_peers,
)
from gaudi_cluster.nodes.world import read_hostfile


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("a", [Peer("a")], id="one"),
        pytest.param("a:8,b:4", [Peer("a", 8), Peer("b", 4)], id="slots"),
        pytest.param(" a , b\n c\td ", [Peer("a"), Peer("b"), Peer("c"), Peer("d")], id="separators"),
        pytest.param("[fe80::1]:8,[::2]", [Peer("fe80::1", 8), Peer("::2")], id="ipv6-brackets"),
        pytest.param("fe80::1", [Peer("fe80::1")], id="ipv6-bare"),
        pytest.param("10.0.0.2:2,10.0.0.1", [Peer("10.0.0.2", 2), Peer("10.0.0.1")], id="ips-order-kept"),
    ],
)
def test_static_ok(spec, expected):
    assert peers_from_static(spec) == expected


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param(" , ", "empty", id="only-separators"),
        pytest.param("a:0", "'a:0'", id="zero-slots"),
        pytest.param("a:x", "'a:x'", id="bad-slots"),
        pytest.param("a:", "'a:'", id="empty-slots"),
        pytest.param("a,a:2", "twice", id="duplicate"),
        pytest.param("root@a", "ssh config", id="user-at"),
        pytest.param("[fe80::1:8", "unclosed", id="unclosed-bracket"),
        pytest.param("a/b", "not a valid host", id="bad-char"),
    ],
)
def test_static_errors(spec, match):
    with pytest.raises(ConfigError, match=match) as exc:
        peers_from_static(spec)
    assert str(exc.value).startswith("GAUDI_CLUSTER_PEERS")
    assert "fix:" in str(exc.value)


def test_dns_sorted_deduplicated_numerically():
    addrs = ["10.0.0.10", "10.0.0.9", "10.0.0.10", "fd00::1", "10.0.0.2"]
    peers = peers_from_dns("worker", resolve=lambda name: addrs if name == "worker" else [])
    assert [p.host for p in peers] == ["10.0.0.2", "10.0.0.9", "10.0.0.10", "fd00::1"]
    assert all(p.slots is None for p in peers)


def test_dns_error_propagates():
    def nx(name):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(OSError):
        peers_from_dns("worker", resolve=nx)


def test_peers_from_hostfile(tmp_path):
    p = tmp_path / "hf"
    p.write_text("m slots=4\nw slots=2\n")
    assert peers_from_hostfile(str(p), read_hostfile) == [Peer("m", 4), Peer("w", 2)]
    with pytest.raises(ConfigError):
        peers_from_hostfile(str(tmp_path / "missing"), read_hostfile)


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        pytest.param("node1", ["node1"], id="single"),
        pytest.param("a,b", ["a", "b"], id="plain-list"),
        pytest.param("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"], id="padded"),
        pytest.param("n[8-11]", ["n8", "n9", "n10", "n11"], id="width-grows"),
        pytest.param("n[08-10]", ["n08", "n09", "n10"], id="padding-kept"),
        pytest.param("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"], id="two-brackets"),
        pytest.param("gpu[3],cpu[1-2]", ["gpu3", "cpu1", "cpu2"], id="two-items"),
        pytest.param("host-a.dom,host-b.dom", ["host-a.dom", "host-b.dom"], id="fqdn"),
    ],
)
def test_slurm_source_expands_the_node_list(nodelist, expected):
    assert peers_from_slurm({"SLURM_JOB_NODELIST": nodelist}) == [Peer(h) for h in expected]


def test_slurm_duplicates_are_kept_by_the_expansion_and_refused_by_the_source():
    assert slurm.expand_hostlist("x[1-2],x2,y") == ["x1", "x2", "x2", "y"]
    with pytest.raises(ConfigError, match=r"^SLURM_JOB_NODELIST='x\[1-2\],x2,y' lists x2 twice; fix:"):
        peers_from_slurm({"SLURM_JOB_NODELIST": "x[1-2],x2,y"})


@pytest.mark.parametrize(
    "nodelist",
    [
        pytest.param("a[1-2]b,c", id="text-after-bracket"),
        pytest.param("n[3-1]", id="backwards"),
        pytest.param("n[a-b]", id="letters"),
        pytest.param("n[]", id="empty-brackets"),
        pytest.param("n[[1]]", id="nested"),
    ],
)
def test_slurm_source_refuses_a_bad_node_list(nodelist):
    with pytest.raises(ConfigError, match=r"^SLURM_JOB_NODELIST=.*fix:"):
        peers_from_slurm({"SLURM_JOB_NODELIST": nodelist})


def test_slurm_source_refuses_an_empty_node_list():
    with pytest.raises(ConfigError, match=r"^no Slurm node list.*fix:"):
        peers_from_slurm({"SLURM_JOB_NODELIST": ""})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"SLURM_JOB_NODELIST": "n[1-2]"}, [Peer("n1"), Peer("n2")], id="job-nodelist"),
        pytest.param({"SLURM_NODELIST": "n3"}, [Peer("n3")], id="old-nodelist"),
        pytest.param(
            {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_STEP_NODELIST": "n[2-3]", "SLURM_STEP_NUM_NODES": "2"},
            [Peer("n2"), Peer("n3")],
            id="step-first",
        ),
        # One container task per node: Slurm's task counts say nothing about a node's cards.
        pytest.param(
            {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)"},
            [Peer("n1"), Peer("n2")],
            id="task-counts-ignored",
        ),
    ],
)
def test_peers_from_slurm(env, expected):
    assert peers_from_slurm(env) == expected


def test_peers_from_slurm_errors():
    with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST"):
        peers_from_slurm({})
    with pytest.raises(ConfigError, match="SLURM_JOB_NUM_NODES=3"):
        peers_from_slurm({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "3"})


def test_mpi_operator_default_path_and_formats():
    files = {"/etc/mpi/hostfile": "job-worker-0.job.ns.svc slots=8\n# c\njob-worker-1.job.ns.svc:4\nw2\n"}
    peers = peers_from_mpi_operator({}, read_text=files.__getitem__)
    assert peers == [Peer("job-worker-0.job.ns.svc", 8), Peer("job-worker-1.job.ns.svc", 4), Peer("w2")]


def test_mpi_operator_env_path():
    files = {"/x/hosts": "a slots=2 max_slots=2\n"}
    env = {"OMPI_MCA_orte_default_hostfile": "/x/hosts"}
    assert peers_from_mpi_operator(env, read_text=files.__getitem__) == [Peer("a", 2)]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("", r"^/etc/mpi/hostfile:1: .*no hosts", id="empty"),
        pytest.param("a slots=2\na slots=2\n", "twice", id="duplicate"),
        pytest.param("a foo=1\n", r"^/etc/mpi/hostfile:1: unknown token", id="unknown"),
        pytest.param("a\nb slots=x\n", r"^/etc/mpi/hostfile:2: ", id="bad-slots"),
    ],
)
def test_mpi_operator_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        peers_from_mpi_operator({}, read_text=lambda path: text)


def test_mpi_operator_unreadable():
    def missing(path):
        raise FileNotFoundError(path)

    with pytest.raises(ConfigError, match=r"/etc/mpi/hostfile cannot be read.*fix:"):
        peers_from_mpi_operator({}, read_text=missing)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_wait_returns_as_soon_as_all_found():
    clock = FakeClock()
    results = iter([[], [Peer("a")], [Peer("a"), Peer("b")], [Peer("never")]])
    calls = []

    def discover():
        calls.append(clock())
        return next(results)

    peers = wait_for_peers(discover, 2, 30, clock, clock.sleep)
    assert peers == [Peer("a"), Peer("b")]
    assert calls == [100.0, 101.0, 102.0]
    assert clock.sleeps == [1.0, 1.0]


def test_wait_expiry_names_what_is_missing():
    clock = FakeClock()
    with pytest.raises(ClusterNotReady) as exc:
        wait_for_peers(
            lambda: [Peer("10.0.0.2"), Peer("10.0.0.3")],
            3,
            30,
            clock,
            clock.sleep,
            source="DNS name 'worker'",
        )
    msg = str(exc.value)
    assert msg.startswith(
        "found 2 of 3 peers via DNS name 'worker' after 30s: 10.0.0.2, 10.0.0.3; missing 1;"
    )
    assert "fix:" in msg
    assert clock.t == 130.0  # one deadline, never overshot
    assert sum(clock.sleeps) == 30.0


def test_wait_names_what_is_missing_and_forgets_an_old_error():
    clock = FakeClock()

    def discover():
        if clock() < 110:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [Peer("w1")]

    with pytest.raises(ClusterNotReady) as exc:
        wait_for_peers(discover, 3, 12.5, clock, clock.sleep, interval_s=5)
    msg = str(exc.value)
    assert "found 1 of 3 peers" in msg
    assert "w1; missing 2; fix:" in msg
    assert "gaierror" not in msg  # the last poll succeeded
    assert clock.sleeps == [5, 5, 2.5]


def test_wait_dns_errors_count_as_zero_then_succeed():
    clock = FakeClock()

    answers = []

    def discover():
        if clock() < 103:
            answers.append("gaierror")
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers.append(None)
        return [Peer("10.0.0.5")]

    peers = wait_for_peers(discover, None, 10, clock, clock.sleep)
    assert peers == [Peer("10.0.0.5")]
    assert answers == ["gaierror"] * 3 + [None]


def test_wait_expected_none_returns_first_nonempty_answer():
    clock = FakeClock()
    assert wait_for_peers(lambda: [Peer("a"), Peer("b")], None, 5, clock, clock.sleep) == [
        Peer("a"),
        Peer("b"),
    ]
    assert clock.sleeps == []


def test_wait_expiry_reports_last_error():
    clock = FakeClock()

    def nx():
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(ClusterNotReady, match=r"found 0 of 1 peers.*none; missing 1; last error: gaierror"):
        wait_for_peers(nx, None, 3, clock, clock.sleep)


def test_wait_config_error_is_not_retried():
    clock = FakeClock()

    def bad():
        raise ConfigError("x; fix: y")

    with pytest.raises(ConfigError):
        wait_for_peers(bad, 2, 30, clock, clock.sleep)
    assert clock.sleeps == []


def test_wait_zero_timeout_polls_once():
    clock = FakeClock()
    calls = []
    with pytest.raises(ClusterNotReady):
        wait_for_peers(lambda: calls.append(1) or [], 1, 0, clock, clock.sleep)
    assert calls == [1]
