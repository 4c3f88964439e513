"""Each PeerSource describes and discovers itself with its world injected; the engine's source is
detected in the same order as before; the survey turns a source into the job's nodes."""

from __future__ import annotations

import dataclasses
import socket
import time
from types import SimpleNamespace

import pytest
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.nodes import find as node_finding
from gaudi_cluster.nodes import world as this_machine
from gaudi_cluster.nodes.discovery import (
    DnsPeers,
    HostfilePeers,
    MpiOperatorPeers,
    Peer,
    SlurmPeers,
    StaticPeers,
    World,
    choose_source,
    detect_source,
)
from gaudi_cluster.nodes.hostfile import parse_hostfile


def _unread(what: str):
    def refuse(arg: str):
        raise AssertionError(f"this source must not read {what} ({arg})")

    return refuse


def world(resolve=None, files=None, hostfiles=None, exists=None) -> World:
    """A world that answers only what a test gives it and fails on anything else it is asked."""
    return World(
        resolve=resolve or _unread("DNS"),
        read_text=files.__getitem__ if files is not None else _unread("a file"),
        load_hostfile=(lambda path: parse_hostfile(hostfiles[path], path))
        if hostfiles
        else _unread("a hostfile"),
        exists=exists or _unread("the filesystem"),
    )


SOURCES = [
    pytest.param(
        StaticPeers("a,b:2"),
        ("static peer list", "GAUDI_CLUSTER_PEERS=a,b:2", False, False),
        {},
        world(),
        [Peer("a"), Peer("b", 2)],
        id="static",
    ),
    pytest.param(
        DnsPeers("svc"),
        ("DNS name 'svc'", "GAUDI_CLUSTER_PEERS_DNS=svc", False, True),
        {},
        world(resolve={"svc": ["10.0.0.3", "10.0.0.1"]}.__getitem__),
        [Peer("10.0.0.1"), Peer("10.0.0.3")],
        id="dns",
    ),
    pytest.param(
        HostfilePeers("/hf"),
        ("hostfile /hf", "GAUDI_CLUSTER_HOSTFILE=/hf", True, False),
        {},
        world(hostfiles={"/hf": "h slots=1\ng slots=4\n"}),
        [Peer("h", 1), Peer("g", 4)],
        id="hostfile",
    ),
    pytest.param(
        SlurmPeers(),
        ("Slurm node list", "Slurm", True, False),
        {"SLURM_JOB_NODELIST": "s[1-2]"},
        world(),
        [Peer("s1"), Peer("s2")],
        id="slurm",
    ),
    pytest.param(
        MpiOperatorPeers(),
        ("MPI Operator hostfile", "MPI Operator", True, False),
        {},
        world(files={"/etc/mpi/hostfile": "m slots=2\n"}),
        [Peer("m", 2)],
        id="mpi-operator",
    ),
]


@pytest.mark.parametrize(("source", "facts", "environ", "its_world", "peers"), SOURCES)
def test_each_source_describes_and_discovers_itself(source, facts, environ, its_world, peers):
    assert (source.describe(), source.setting(), source.lists_every_node, source.grows) == facts
    # The world answers only what this source needs: reading anything else fails the test.
    assert source.discover(environ, its_world) == peers


@pytest.mark.parametrize(("source", "facts", "environ", "its_world", "peers"), SOURCES)
def test_sources_are_frozen_values(source, facts, environ, its_world, peers):
    assert source == dataclasses.replace(source)
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.extra = 1


def test_the_mpi_operator_source_reads_the_hostfile_the_environment_names():
    environ = {"OMPI_MCA_orte_default_hostfile": "/x/hosts"}
    assert MpiOperatorPeers().discover(environ, world(files={"/x/hosts": "a slots=2\n"})) == [Peer("a", 2)]


def test_a_dns_name_that_does_not_resolve_yet_raises_oserror_for_the_wait():
    def nx(name):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(OSError):
        DnsPeers("worker").discover({}, world(resolve=nx))


def test_a_bad_hostfile_is_refused_with_its_path():
    with pytest.raises(ConfigError, match=r"^/hf:2: "):
        HostfilePeers("/hf").discover({}, world(hostfiles={"/hf": "a slots=2\nb slots=x\n"}))


@pytest.mark.parametrize(
    ("env", "exists", "expected"),
    [
        pytest.param({"SLURM_JOB_NODELIST": "n1"}, False, SlurmPeers(), id="slurm"),
        pytest.param({"OMPI_MCA_orte_default_hostfile": "/h"}, False, MpiOperatorPeers(), id="ompi-env"),
        pytest.param({}, True, MpiOperatorPeers(), id="etc-mpi"),
        pytest.param({"SLURM_JOB_NODELIST": "n1"}, True, SlurmPeers(), id="slurm-wins"),
        pytest.param({"SLURM_STEP_NODELIST": "n1"}, False, SlurmPeers(), id="slurm-step"),
        pytest.param({"SLURM_NODELIST": "n1"}, False, SlurmPeers(), id="slurm-old-nodelist"),
        pytest.param({"SLURM_JOB_NODELIST": ""}, False, None, id="empty-nodelist-is-none"),
        pytest.param({}, False, None, id="nothing"),
    ],
)
def test_detect_source(env, exists, expected):
    asked = []

    def exists_here(path):
        asked.append(path)
        return exists and path == "/etc/mpi/hostfile"

    assert detect_source(env, exists_here) == expected
    assert set(asked) <= {"/etc/mpi/hostfile"}  # only the operator's fixed path is looked for


def test_the_settings_win_over_the_engine():
    slurm_env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    assert choose_source("a,b", None, None, slurm_env, lambda path: True) == StaticPeers("a,b")
    assert choose_source(None, "svc", None, slurm_env, lambda path: True) == DnsPeers("svc")
    assert choose_source(None, None, "/hf", slurm_env, lambda path: True) == HostfilePeers("/hf")


def test_empty_settings_name_no_source():
    slurm_env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    assert choose_source("", "", "", slurm_env, lambda path: False) == SlurmPeers()
    assert choose_source(None, None, None, {}, lambda path: False) is None


def test_two_sources_name_both():
    with pytest.raises(ConfigError) as exc:
        choose_source("a", "svc", None, {}, lambda path: False)
    assert str(exc.value) == (
        "more than one peer source is configured (GAUDI_CLUSTER_PEERS=a and GAUDI_CLUSTER_PEERS_DNS=svc); "
        "fix: keep only one"
    )
    with pytest.raises(
        ConfigError, match=r"PEERS=a and GAUDI_CLUSTER_PEERS_DNS=svc and GAUDI_CLUSTER_HOSTFILE=/h"
    ):
        choose_source("a", "svc", "/h", {}, lambda path: False)


def test_the_real_world_resolves_reads_and_looks(tmp_path):
    addresses = this_machine.REAL_WORLD.resolve("localhost")
    assert "127.0.0.1" in addresses or "::1" in addresses
    (tmp_path / "hf").write_text("a slots=2\n")
    assert this_machine.REAL_WORLD.read_text(str(tmp_path / "hf")) == "a slots=2\n"
    assert this_machine.REAL_WORLD.load_hostfile(str(tmp_path / "hf")).hosts == ("a",)
    assert this_machine.REAL_WORLD.exists(str(tmp_path / "hf"))
    assert not this_machine.REAL_WORLD.exists(str(tmp_path / "nope"))


def settings(**given):
    fields = {"peers": None, "peers_dns": None, "hostfile": None, "nodes": None, "slots": None, "spares": 0}
    return SimpleNamespace(**{**fields, "master_addr": None, **given})


def find(config, environ=None, its_world=None, timeout=30.0):
    self_names = {"me", "10.0.0.1"}
    deadline = time.monotonic() + timeout
    return node_finding.find_nodes(
        config, environ or {}, self_names, "10.0.0.1", deadline, world=its_world or world()
    )


def test_a_list_of_the_others_puts_this_node_first_and_leaves_itself_out():
    nodes = find(settings(peers="me,a:2,b"))
    assert nodes.hosts == ("10.0.0.1", "a", "b")
    assert nodes.master_addr == "10.0.0.1"
    assert nodes.requested_slots == {"10.0.0.1": None, "a": 2, "b": None}


def test_a_list_of_every_node_is_led_by_its_first():
    nodes = find(settings(hostfile="/hf"), its_world=world(hostfiles={"/hf": "m slots=4\nw slots=2\n"}))
    assert nodes.hosts == ("m", "w")
    assert nodes.master_addr == "m"
    assert nodes.requested_slots == {"m": 4, "w": 2}


def test_the_engine_source_is_used_when_nothing_is_set():
    nodes = find(settings(nodes=2), {"SLURM_JOB_NODELIST": "n[1-3]"}, world(exists=lambda path: False))
    assert nodes.hosts == ("n1", "n2")  # --nodes takes the first ones


def test_no_source_is_a_local_run_unless_more_nodes_are_asked_for():
    assert find(settings(slots=2), its_world=world(exists=lambda path: False)).hosts == ("localhost",)
    with pytest.raises(ConfigError, match=r"^--nodes 3 but no peer source; fix: set --peers, --peers-dns"):
        find(settings(nodes=3), its_world=world(exists=lambda path: False))


@pytest.mark.parametrize(
    ("config", "its_world", "message"),
    [
        pytest.param(
            settings(peers="a,b", nodes=4),
            world(),
            "--nodes 4 but the static peer list names only 3 node(s); "
            "fix: lower --nodes to 3 or list every node",
            id="others",
        ),
        pytest.param(
            settings(hostfile="/hf", nodes=3),
            world(hostfiles={"/hf": "m slots=1\nw slots=1\n"}),
            "--nodes 3 but the hostfile /hf names only 2 node(s); fix: lower --nodes to 2 or list every node",
            id="every-node",
        ),
    ],
)
def test_a_list_that_is_too_short_is_refused_at_once(config, its_world, message):
    with pytest.raises(ConfigError) as exc:
        find(config, its_world=its_world)
    assert str(exc.value) == message


def test_a_dns_name_is_waited_for_under_the_deadline():
    polls = []

    def resolve(name):
        polls.append(name)
        return ["10.0.0.2"]

    with pytest.raises(
        ClusterNotReady, match=r"^found 1 of 2 peers via DNS name 'worker' after 0s: 10\.0\.0\.2;"
    ):
        find(settings(peers_dns="worker", nodes=3), its_world=world(resolve=resolve), timeout=0.0)
    assert polls == ["worker"]
    nodes = find(settings(peers_dns="worker", nodes=2), its_world=world(resolve=resolve))
    assert nodes.hosts == ("10.0.0.1", "10.0.0.2")
