"""What plan, up and status print. Pure: the time is a parameter."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gaudi_cluster.aws.diff import Diff, Existing, ExistingNode
from gaudi_cluster.aws.facts import BILLED_STATES, PRICES_AS_OF, QuotaCheck, hourly_price, price_line
from gaudi_cluster.aws.spec import ClusterSpec, describe_rule, wanted_egress, wanted_ingress


def render_plan(spec: ClusterSpec, existing: Existing, changes: Diff, quota: QuotaCheck | None) -> str:
    """What `plan` prints (and `up` before acting): every resource, created or already there."""
    r = spec.request

    def mark(create: bool) -> str:
        return "create" if create else "exists"

    efa = spec.facts.efa_interfaces
    lines = [
        f"cluster {spec.cluster_id}: {r.nodes} x {spec.facts.name} ({spec.gaudi.accelerators} Gaudi each) "
        f"in {spec.az} ({r.region}), subnet {spec.subnet_id} of {spec.vpc_id}",
        f"AMI: {spec.ami.image_id} {spec.ami.name!r} (created {spec.ami.created or 'unknown'})",
    ]
    for file, name in spec.parameter_names.items():
        if changes.create_parameters or name in existing.parameters:
            lines.append(
                f"  {mark(changes.create_parameters)} SSM parameter {name} "
                f"(SecureString: {file}; deleted once the new nodes have it)"
            )
    group = existing.security_group_id or "(new)"
    lines.append(f"  {mark(changes.create_security_group)} security group {spec.security_group_name} {group}")
    new_group = changes.create_security_group
    for rule in sorted(wanted_ingress(r.ssh_cidr)):
        lines.append(
            f"    {mark(new_group or rule in changes.authorize_ingress)} ingress {describe_rule(rule)}"
        )
    for rule in sorted(wanted_egress()):
        lines.append(
            f"    {mark(new_group or rule in changes.authorize_egress)} egress {describe_rule(rule)}"
        )
    for rule in changes.revoke_ingress:
        lines.append(f"    revoke ingress {describe_rule(rule)}")
    for rule in changes.revoke_egress:
        lines.append(f"    revoke egress {describe_rule(rule)}")
    if r.ssh_cidr is None:
        lines.append("    no ssh ingress (no --ssh-cidr): reach the nodes through SSM Session Manager")
    if spec.placement_group_name is None:
        lines.append("  no placement group (--placement-group none)")
    else:
        lines.append(
            f"  {mark(changes.create_placement_group)} placement group {spec.placement_group_name} "
            "(strategy cluster)"
        )
    launching = {n.index for n in changes.launch}
    cards = f"{efa} EFA interface{'s' if efa != 1 else ''}"
    if efa > 1:
        cards += f" (card 0: efa with the primary IP; cards 1-{efa - 1}: efa-only)"
    for node in spec.nodes:
        found = existing.nodes.get(node.index)
        state = "" if found is None else f" {found.instance_id} {found.state}"
        lines.append(f"  {mark(node.index in launching)} instance {node.name} ({node.role}){state}: {cards}")
    lines.append(
        f"  {mark(changes.allocate_address)} Elastic IP {existing.address_public_ip or '(new)'} on node 0"
    )
    if changes.launch and 0 in existing.nodes:
        lines.append(
            "  note: the master keeps the peer list it booted with; to add these workers to it, terminate "
            f"{existing.nodes[0].instance_id} and run up again"
        )
    lines.append(price_line(spec.facts.name, r.region, r.nodes))
    if quota is not None:
        lines.append(f"quota: {quota.line()}")
    lines.append(f"key delivery: {_key_delivery_line(spec)}")
    return "\n".join(lines) + "\n"


def _key_delivery_line(spec: ClusterSpec) -> str:
    if spec.request.key_delivery == "ssm":
        return (
            "SSM Parameter Store SecureString, the client key read by the master at boot, deleted once "
            "the new nodes' consoles say they have their keys; each node's container makes its own host "
            "key, pinned at first contact"
        )
    return (
        f"over ssh after boot (from {spec.request.ssh_cidr}, workers through the master), to host keys "
        "pinned from each instance's console: each node its own host key, certified by the host CA for "
        "its name and private IP; the client key to the master only; never in user data"
    )


def reach_lines(cluster_id: str, public_ip: str | None, identity: str | None, ssh_user: str) -> list[str]:
    """How to reach the master: its Elastic IP with the key pair's private key (`identity`, if known)."""
    if public_ip is None:
        return [f"the master has no public address yet; see: gaudi-cluster aws status {cluster_id}"]
    login = f"ssh {f'-i {identity} ' if identity else ''}{ssh_user}@{public_ip}"
    return [
        f"master: {login}",
        f"   then: {login} -t sudo docker exec -it gaudi-cluster-master bash",
        f"   boot log: {login} sudo journalctl -u gaudi-cluster-node -f",
    ]


def cost_so_far(node: ExistingNode, price: float | None, now: datetime) -> float | None:
    if price is None or node.launch_time is None or node.state not in BILLED_STATES:
        return 0.0 if price is not None else None
    hours = max(0.0, (now - node.launch_time).total_seconds() / 3600.0)
    return price * hours


def render_status(
    cluster_id: str, region: str, nodes: Sequence[ExistingNode], public_ip: str | None, now: datetime
) -> str:
    if not nodes:
        return f"cluster {cluster_id} in {region}: no instances\n"
    lines = [f"cluster {cluster_id} in {region}:"]
    lines.append(
        f"  {'node':<6} {'role':<7} {'instance':<20} {'state':<13} {'private ip':<15} "
        f"{'uptime':>9} {'cost':>9}"
    )
    total: float | None = 0.0
    for node in sorted(nodes, key=lambda n: n.index):
        price = hourly_price(node.instance_type, region)
        cost = cost_so_far(node, price, now)
        total = None if cost is None or total is None else total + cost
        uptime = (
            _duration((now - node.launch_time).total_seconds())
            if node.launch_time is not None and node.state in BILLED_STATES
            else "-"
        )
        lines.append(
            f"  {node.index:<6} {node.role:<7} {node.instance_id:<20} {node.state:<13} "
            f"{node.private_ip or '-':<15} {uptime:>9} {_money(cost):>9}"
        )
    lines.append(f"  Elastic IP: {public_ip or '-'}")
    lines.append(
        f"  cost so far: {_money(total)} (on-demand price table as of {PRICES_AS_OF}; EBS and traffic extra)"
    )
    return "\n".join(lines) + "\n"


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def _duration(seconds: float) -> str:
    minutes = int(max(0.0, seconds)) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m"
