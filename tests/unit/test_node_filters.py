"""--include/--exclude in DeepSpeed's grammar (NODE[:SLOT,SLOT][@NODE...]) select the same slots as
DeepSpeed's own runner, and every launcher runs the ranks on them (not only DeepSpeed's).

The differential test draws random hostfiles and filters and compares active_resources with
deepspeed.launcher.runner.parse_inclusion_exclusion, the function DeepSpeed's runner calls."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from deepspeed.launcher.runner import parse_inclusion_exclusion
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.launchers import plan_for
from gaudi_cluster.launch.plan import AgentSettings, LaunchOptions, PlanInputs
from gaudi_cluster.launch.prepare import selected_hostfile
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile, active_resources
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.wire.node_spec import FanoutSpec

PY = "/opt/venv/bin/python"


def random_case(rng: random.Random) -> tuple[Hostfile, str]:
    hosts = [f"h{i}" for i in range(rng.randint(1, 5))]
    hostfile = Hostfile(tuple(HostEntry(h, rng.randint(1, 4)) for h in hosts))
    parts = []
    # Hosts drawn with replacement: DeepSpeed merges a host named twice (a:1@a:0).
    for host in (rng.choice(hosts) for _ in range(rng.randint(1, len(hosts) + 1))):
        slots = hostfile.entries[hosts.index(host)].slots
        if rng.random() < 0.5:
            parts.append(host)
        else:
            chosen = rng.sample(range(slots), rng.randint(1, slots))
            parts.append(f"{host}:{','.join(map(str, chosen))}")
    return hostfile, "@".join(parts)


def deepspeed_selects(hostfile: Hostfile, include: str, exclude: str) -> dict[str, list[int]] | None:
    """DeepSpeed's answer; None where it refuses (a filter that leaves nothing)."""
    pool = OrderedDict((e.host, e.slots) for e in hostfile.entries)
    try:
        return dict(parse_inclusion_exclusion(pool, include, exclude))
    except ValueError:
        return None


@pytest.mark.parametrize("kind", ["include", "exclude"])
def test_the_same_slots_as_deepspeed_s_parse_inclusion_exclusion(kind):
    rng = random.Random(35)
    compared = 0
    for _ in range(400):
        hostfile, text = random_case(rng)
        include, exclude = (text, "") if kind == "include" else ("", text)
        expected = deepspeed_selects(hostfile, include, exclude)
        try:
            ours = active_resources(hostfile, include, exclude)
        except ConfigError:
            ours = None
        if expected is not None and not expected:  # DeepSpeed returns an empty pool; we refuse it
            assert ours is None, (hostfile, text)
            continue
        assert ours == expected, (hostfile, kind, text)
        compared += 1
    assert compared > 200


def test_the_issue_s_case_b0_on_three_by_two():
    hostfile = Hostfile((HostEntry("a", 2), HostEntry("b", 2), HostEntry("c", 2)))
    assert active_resources(hostfile, exclude="b:0") == {"a": [0, 1], "b": [1], "c": [0, 1]}


def inputs(launcher_hostfile: Hostfile, device_ids: dict[str, tuple[int, ...]]) -> PlanInputs:
    return PlanInputs(
        hostfile=launcher_hostfile,
        hostfile_path="/j/hostfile",
        env={},
        env_path="/j/deepspeed_env",
        ssh_config_path="/j/ssh_config",
        ssh_port=3022,
        master_addr="a",
        master_port=29500,
        program=(PY, "-u", "/w/train.py"),
        python=PY,
        agent=AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, "a:29400"),
        this_node="a",
        cwd="/w",
        device_ids=device_ids,
    )


def test_the_direct_launcher_runs_the_ranks_on_the_selected_slots():
    hostfile = Hostfile((HostEntry("a", 2), HostEntry("b", 2), HostEntry("c", 2)))
    active = active_resources(hostfile, exclude="b:0@c")
    ids = {host: tuple(slots) for host, slots in active.items()}
    launch = FanoutSpec.from_json(plan_for("direct", inputs(selected_hostfile(active), ids)).stdin)
    nodes = [(n.host, n.spec.slots, n.spec.first_rank, n.spec.world_size) for n in launch.nodes]
    assert nodes == [("a", (0, 1), 0, 3), ("b", (1,), 2, 3)]


def test_mpirun_takes_whole_nodes_and_names_direct_for_a_slot_subset():
    hostfile = Hostfile((HostEntry("a", 2), HostEntry("b", 2)))
    whole = active_resources(hostfile, exclude="b")
    plan = plan_for("mpirun", inputs(selected_hostfile(whole), {h: tuple(s) for h, s in whole.items()}))
    assert "a:2" in plan.argv and "-n" in plan.argv and plan.argv[plan.argv.index("-n") + 1] == "2"
    part = active_resources(hostfile, exclude="b:0")
    with pytest.raises(ConfigError, match="fix: --launcher direct"):
        plan_for("mpirun", inputs(selected_hostfile(part), {h: tuple(s) for h, s in part.items()}))


def test_deepspeed_gets_the_filter_others_do_not():
    options = LaunchOptions(exclude="b")
    assert options.runner_args() == ("--exclude", "b")
    assert options.runner_args(with_selection=False) == ()


@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        ({"exclude": "b:x"}, "--exclude"),
        ({"include": "bad name!"}, "--include"),
        ({"include": "a", "exclude": "b"}, "--include and --exclude"),
    ],
)
def test_a_malformed_filter_is_refused_when_read(flags, culprit):
    with pytest.raises(ConfigError, match=culprit):
        resolve_config(flags, {})


def test_a_filter_from_the_environment_is_named_as_the_variable():
    with pytest.raises(ConfigError, match="GAUDI_CLUSTER_INCLUDE and GAUDI_CLUSTER_EXCLUDE"):
        resolve_config({}, {"GAUDI_CLUSTER_INCLUDE": "a", "GAUDI_CLUSTER_EXCLUDE": "b"})
