"""What `up` learns from the new instances' consoles before it trusts them: their ssh host keys (pinned
before the first ssh, never taken on first contact) and each node's word that it has its keys (after
which the SSM parameters are deleted)."""

from __future__ import annotations

import pytest
from gaudi_cluster.aws import delivery
from gaudi_cluster.aws.diff import ExistingNode
from gaudi_cluster.aws.keys import SshHost, read_pins, write_pins
from gaudi_cluster.errors import ClusterNotReady

from tests.aws.conftest import booted_console, made_up_host_key


class Consoles:
    """GetConsoleOutput answers per instance, one per call (the last one repeats); counts the reads."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.reads: list[str] = []

    def console_output(self, instance_id: str) -> str:
        self.reads.append(instance_id)
        queue = self.answers[instance_id]
        return queue.pop(0) if len(queue) > 1 else queue[0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 1.0)


HOSTS = [SshHost("master", "198.51.100.7", "i-0a"), SshHost("node-1", "10.0.0.11", "i-0b")]
BOOTING = "[    0.000000] Linux version 5.15.0-1051-aws\n"


def test_each_instance_is_pinned_to_the_keys_its_console_printed(tmp_path):
    master_key, worker_key = made_up_host_key(), made_up_host_key()
    consoles = Consoles(
        {"i-0a": [booted_console(master_key)], "i-0b": [BOOTING, BOOTING, booted_console(worker_key)]}
    )
    clock = Clock()
    known_hosts = tmp_path / "known_hosts"
    delivery.pin_host_keys(consoles, HOSTS, known_hosts, deadline=60, clock=clock, sleep=clock.sleep)
    pins = read_pins(known_hosts)
    assert set(pins) == {"i-0a", "i-0b"}
    assert master_key in pins["i-0a"] and worker_key in pins["i-0b"]
    # Only the printed keys (ecdsa and ed25519 here), nothing else from the console.
    assert all(len(keys) == 2 for keys in pins.values())
    assert consoles.reads.count("i-0a") == 1 and consoles.reads.count("i-0b") == 3


def test_an_instance_pinned_by_an_earlier_up_keeps_its_pin_without_a_console_read(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    earlier = made_up_host_key()
    write_pins(known_hosts, {"i-0a": (earlier,), "i-0gone": (made_up_host_key(),)})
    consoles = Consoles({"i-0b": [booted_console(made_up_host_key())]})
    delivery.pin_host_keys(consoles, HOSTS, known_hosts, deadline=60)
    pins = read_pins(known_hosts)
    assert pins["i-0a"] == (earlier,) and consoles.reads == ["i-0b"]
    assert "i-0gone" not in pins  # a terminated instance's pin goes


def test_an_instance_that_prints_no_host_keys_is_never_trusted(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    consoles = Consoles({"i-0a": [booted_console(made_up_host_key())], "i-0b": [BOOTING]})
    clock = Clock()
    with pytest.raises(ClusterNotReady) as refused:
        delivery.pin_host_keys(consoles, HOSTS, known_hosts, deadline=30, clock=clock, sleep=clock.sleep)
    assert str(refused.value).startswith(
        "node-1 (i-0b) printed no ssh host keys on its console before the deadline, and its ssh is not "
        "trusted unseen, so no key was sent; fix: "
    )
    assert not known_hosts.exists()


def node(index: int, instance_id: str) -> ExistingNode:
    return ExistingNode(index, "master" if index == 0 else "worker", instance_id, "running")


def test_ssm_delivery_waits_until_every_console_says_keys_received():
    key = made_up_host_key()
    consoles = Consoles(
        {"i-0a": [booted_console(key)], "i-0b": [booted_console(key, keyed=False), booted_console(key)]}
    )
    clock = Clock()
    delivery.wait_keys_received(consoles, [node(0, "i-0a"), node(1, "i-0b")], 60, clock, clock.sleep)
    assert consoles.reads == ["i-0a", "i-0b", "i-0b"]


def test_a_node_that_never_gets_its_keys_keeps_the_parameters_and_is_named():
    consoles = Consoles({"i-0a": [booted_console(made_up_host_key())], "i-0b": [BOOTING]})
    clock = Clock()
    with pytest.raises(
        ClusterNotReady, match=r"^node 1 \(i-0b\) has not said on its console that it has its keys"
    ):
        delivery.wait_keys_received(consoles, [node(0, "i-0a"), node(1, "i-0b")], 10, clock, clock.sleep)


class Ssm:
    """Records DeleteParameter calls (the real calls are checked with the Stubber)."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_parameter(self, Name: str) -> None:
        self.deleted.append(Name)


class Cloud(Consoles):
    def __init__(self, answers: dict[str, list[str]]) -> None:
        super().__init__(answers)
        self.ssm = Ssm()


NAMES = {
    "id_ed25519": "/gaudi-cluster/demo/id_ed25519",
    "ssh_host_ed25519_key": "/gaudi-cluster/demo/ssh_host_ed25519_key",
}


def test_ssm_parameters_go_once_the_nodes_launched_now_have_their_keys():
    keyed = booted_console(made_up_host_key())
    cloud = Cloud({"i-0a": [keyed], "i-0b": [keyed]})
    nodes = [node(0, "i-0a"), node(1, "i-0b")]
    delivery.receive_over_ssm(cloud, nodes, {1}, (), NAMES, deadline=60)
    # Only the new node is asked; node 0 had its keys from an earlier up.
    assert cloud.reads == ["i-0b"]
    assert sorted(cloud.ssm.deleted) == sorted(NAMES.values())


def test_parameters_an_unfinished_delivery_left_wait_for_every_node():
    keyed = booted_console(made_up_host_key())
    cloud = Cloud({"i-0a": [keyed], "i-0b": [keyed]})
    delivery.receive_over_ssm(cloud, [node(0, "i-0a"), node(1, "i-0b")], set(), tuple(NAMES.values()), {}, 60)
    assert cloud.reads == ["i-0a", "i-0b"] and sorted(cloud.ssm.deleted) == sorted(NAMES.values())


def test_a_converged_cluster_reads_no_console_and_deletes_nothing():
    cloud = Cloud({})
    delivery.receive_over_ssm(cloud, [node(0, "i-0a")], set(), (), NAMES, deadline=60)
    assert cloud.reads == [] and cloud.ssm.deleted == []
