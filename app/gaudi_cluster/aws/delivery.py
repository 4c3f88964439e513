"""After the nodes run, their secret keys reach them, and nothing is trusted on first sight:

- over ssh: each instance's own ssh host keys are read from its console (GetConsoleOutput, which only the
  account can read) and pinned before the first connection; then every node gets a host key of its own
  for its container's sshd, certified by the cluster's host CA for its name and private IP (the master
  pins the CA), and the master the client key, over ssh that accepts no other host key;
- over SSM: the master fetches the client key at boot (each node's container makes its own host key);
  once every node's console says it has its keys, the parameters are deleted, so they do not outlive
  the delivery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, Protocol

from gaudi_cluster.aws import calls, keys
from gaudi_cluster.aws.diff import ExistingNode
from gaudi_cluster.aws.facts import CLIENT_KEY, MASTER
from gaudi_cluster.aws.keys import ClusterKeys, Delivery, SshHost
from gaudi_cluster.aws.userdata import console_host_keys, keys_received
from gaudi_cluster.errors import ClusterNotReady

log = logging.getLogger("gaudi_cluster.aws")


class Consoles(Protocol):
    ssm: Any

    def console_output(self, instance_id: str) -> str: ...


def ssh_hosts(nodes: Sequence[ExistingNode], public_ip: str) -> list[SshHost]:
    """The master at its Elastic IP, then each worker at its private IP (reached through the master)."""
    master, *workers = nodes
    return [
        SshHost("master", public_ip, master.instance_id),
        *(SshHost(f"node-{n.index}", n.private_ip or "", n.instance_id) for n in workers),
    ]


def host_principals(node: ExistingNode) -> tuple[str, ...]:
    """What a node's host certificate names: its name and the private IP the master dials it by (the
    master reaches itself at its own)."""
    if not node.private_ip:
        raise ClusterNotReady(
            f"node {node.index} ({node.instance_id}) has no private IP yet, so its host key cannot be "
            "certified; fix: run up again once it is running"
        )
    names = ("master", "node-0") if node.role == MASTER else (f"node-{node.index}",)
    return (*names, node.private_ip)


def pin_host_keys(
    cloud: Consoles,
    hosts: Sequence[SshHost],
    known_hosts: Path,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """known_hosts holds, under each instance id, the keys the instance printed on its console. An
    instance pinned by an earlier `up` keeps its pin; a new one is waited for until it has printed them."""
    earlier = keys.read_pins(known_hosts)
    pins = {h.instance_id: earlier[h.instance_id] for h in hosts if h.instance_id in earlier}
    waiting = [h for h in hosts if h.instance_id not in pins]
    while waiting:
        for host in list(waiting):
            found = console_host_keys(cloud.console_output(host.instance_id))
            if found:
                pins[host.instance_id] = found
                waiting.remove(host)
                log.info(
                    "pinned %s (%s): %d host key(s) from its console", host.name, host.instance_id, len(found)
                )
        if not waiting:
            break
        if clock() >= deadline:
            first = waiting[0]
            raise ClusterNotReady(
                f"{first.name} ({first.instance_id}) printed no ssh host keys on its console before the "
                "deadline, and its ssh is not trusted unseen, so no key was sent; fix: run up again once it "
                f"has (aws ec2 get-console-output --latest --output text --instance-id {first.instance_id})"
            )
        sleep(calls.POLL_INTERVAL_S)
    keys.write_pins(known_hosts, pins)


def deliver_over_ssh(
    cloud: Consoles,
    nodes: Sequence[ExistingNode],
    public_ip: str,
    cluster_keys: ClusterKeys,
    directory: Path,
    user: str,
    identity: Path | None,
    deadline: float,
) -> Path:
    """Pin every node's host keys, write the ssh config, send each node its role's secret files."""
    hosts = ssh_hosts(nodes, public_ip)
    ssh = keys.ssh_program()
    config = keys.write_ssh_config(directory, user, identity, hosts[0], hosts[1:], ssh)
    pin_host_keys(cloud, hosts, directory / "known_hosts", deadline)
    deliveries = [
        Delivery(
            host,
            cluster_keys.files_for(node.role, host.name, host_principals(node)),
            () if node.role == MASTER else (CLIENT_KEY,),
        )
        for host, node in zip(hosts, nodes, strict=True)
    ]
    keys.deliver_over_ssh(deliveries, config, deadline, ssh=ssh)
    return config


def receive_over_ssm(
    cloud: Consoles,
    nodes: Sequence[ExistingNode],
    launched: Set[int],
    left_over: Sequence[str],
    names: Mapping[str, str],
    deadline: float,
) -> None:
    """The nodes launched now fetch their keys at boot; once their consoles say they have them, the
    parameters go. Parameters an unfinished delivery left behind wait for every node."""
    waiting = [n for n in nodes if left_over or n.index in launched]
    if waiting:
        wait_keys_received(cloud, waiting, deadline)
        keys.delete_key_parameters(cloud.ssm, sorted({*left_over, *names.values()}))


def wait_keys_received(
    cloud: Consoles,
    nodes: Sequence[ExistingNode],
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until every node's console says its secret keys are in place (they fetch them from SSM at boot)."""
    waiting = list(nodes)
    while True:
        waiting = [n for n in waiting if not keys_received(cloud.console_output(n.instance_id))]
        if not waiting:
            return
        if clock() >= deadline:
            first = waiting[0]
            raise ClusterNotReady(
                f"node {first.index} ({first.instance_id}) has not said on its console that it has its keys, "
                "so the SSM parameters stay (tagged: down deletes them); fix: see its boot log (journalctl "
                "-u gaudi-cluster-node: the instance profile needs ssm:GetParameter and kms:Decrypt), then "
                "run up again"
            )
        sleep(calls.POLL_INTERVAL_S)
