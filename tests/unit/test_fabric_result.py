"""The fabric check's figures and verdict (view/fabric), and the rank program's pair schedule."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.view import fabric
from train.fabric_rounds import ring_rounds

HOSTS = {0: "master", 1: "worker-1", 2: "worker-2", 3: "worker-3"}
MB8 = 8 << 20


def _pair(a: int, b: int, seconds: float) -> dict:
    return {"ranks": [a, b], "bytes": MB8, "seconds": seconds}


def _full(seconds: float = 0.02) -> dict:
    return {str(r): [{"bytes": 4096, "seconds": 0.001}, {"bytes": MB8, "seconds": seconds}] for r in HOSTS}


def _report(pairs: list[dict], full: dict | None = None, **extra: object) -> dict:
    base = {"world": 4, "backend": "gloo", "timeout_s": 20.0, "pairs": pairs, **extra}
    return {**base, "full": full} if full is not None else base


def test_bus_bandwidth_is_algorithm_bandwidth_times_2_n_minus_1_over_n():
    assert fabric.busbw(1000, 1.0, 4) == pytest.approx(1500.0)
    assert fabric.busbw(1000, 1.0, 2) == pytest.approx(1000.0)
    assert fabric.busbw(1000, 1.0, 1) == 0.0


def test_a_healthy_cluster_passes_with_every_node_figured():
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.011), _pair(1, 2, 0.01), _pair(3, 0, 0.012)]
    result = fabric.figures(_report(pairs, _full()), HOSTS)
    assert result.ok and result.bad_hosts == ()
    assert [n.state for n in result.nodes] == ["ok"] * 4
    node = result.nodes[0]
    assert node.busbw == pytest.approx(MB8 / 0.02 * 1.5)
    assert node.latency_s == pytest.approx(0.001)
    assert "median pair bus bw" in fabric.render_table(result)


def test_the_node_common_to_the_slow_pairs_is_named_with_its_figure_against_the_median():
    # worker-2 is in pairs (1,2) and (2,3): both slow; its neighbours keep one fast pair each.
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.5), _pair(1, 2, 0.5), _pair(3, 0, 0.01)]
    result = fabric.figures(_report(pairs, _full(0.5)), HOSTS)
    assert result.bad_hosts == ("worker-2",)
    (line,) = result.problems
    assert line.startswith("host worker-2 is slow: 16.8 MB/s against a median of 0.84 GB/s")
    assert "--exclude worker-2" in line


def test_a_node_whose_every_pair_timed_out_is_named_as_silent():
    error = "Timed out waiting 20000ms for recv operation to complete"
    pairs = [_pair(0, 1, 0.01), {"ranks": [2, 3], "error": error}, {"ranks": [1, 2], "error": error}]
    pairs.append(_pair(3, 0, 0.01))
    result = fabric.figures(_report(pairs), HOSTS)
    assert result.bad_hosts == ("worker-2",)
    assert result.problems == (
        "no answer from host worker-2 within 20 s; fix: drop it with --exclude worker-2 "
        "(or repair its link and rerun with --fabric-check)",
    )
    assert any("worker-2 - worker-3" in d for d in result.details)


def test_a_node_that_never_checked_in_is_named():
    silent = {"stage": "rendezvous", "ranks": [3]}
    report = {"world": 4, "backend": "gloo", "timeout_s": 5, "no_answer": silent}
    result = fabric.figures(report, HOSTS)
    assert result.bad_hosts == ("worker-3",)
    assert result.problems[0].startswith("no answer from host worker-3 within 5 s")


def test_no_report_names_no_node_but_stops():
    result = fabric.no_report(["a", "b"], 10, "exit code 1")
    assert not result.ok and result.bad_hosts == ()


def test_the_result_crosses_as_json():
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.5), _pair(1, 2, 0.5), _pair(3, 0, 0.01)]
    result = fabric.figures(_report(pairs, _full()), HOSTS)
    assert fabric.FabricResult.from_json(result.to_json()) == result


def test_the_report_is_read_from_rank_0s_lines():
    lines = ["[master rank 0] starting", "[master rank 0] GC_FABRIC " + json.dumps({"world": 1})]
    assert fabric.report_line(lines) == {"world": 1}
    assert fabric.report_line(["nothing"]) is None


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_ring_rounds_cover_every_neighbour_pair_with_no_rank_twice_in_a_round(world):
    rounds = ring_rounds(world)
    pairs = [p for r in rounds for p in r]
    expected = {frozenset((i, (i + 1) % world)) for i in range(world)} if world > 1 else set()
    assert {frozenset(p) for p in pairs} == expected
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))


def test_the_fix_names_the_hostfile_host_that_exclude_takes():
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.5), _pair(1, 2, 0.5), _pair(3, 0, 0.01)]
    result = fabric.figures(_report(pairs, _full()), HOSTS, {"worker-2": "10.0.0.3"})
    assert result.problems[0].startswith("host worker-2 is slow")
    assert "--exclude 10.0.0.3 " in result.problems[0]


def test_master_with_fabric_check_stops_the_launch_with_one_line_naming_the_node(monkeypatch):
    import io

    from gaudi_cluster import master
    from gaudi_cluster.settings.config import ClusterConfig

    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.5), _pair(1, 2, 0.5), _pair(3, 0, 0.01)]
    slow = fabric.figures(_report(pairs, _full()), HOSTS)
    monkeypatch.setattr(master.fabric_check, "run_check", lambda *a, **k: slow)
    launched = []
    monkeypatch.setattr(master, "prepare_attempt", lambda *a, **k: launched.append(a))
    out = io.StringIO()
    code = master.run_master(ClusterConfig(fabric_check=True), ["-m", "x"], {}, out)
    assert code == 3 and launched == []
    (line,) = out.getvalue().splitlines()
    assert line.startswith("gaudi-cluster: fabric check failed: host worker-2 is slow: ")
    assert "--exclude worker-2" in line


def test_hl_smi_link_text_gives_each_cards_port_states():
    from train.node_facts import port_states

    text = "port 0:\tUP\nport 1:\tDOWN\nport 0:\tUP\nport 1:\tUP\n"
    assert port_states(text) == {"0/0": "up", "0/1": "down", "1/0": "up", "1/1": "up"}


def test_hpu_facts_a_port_down_or_a_missing_gaudinet_stops_and_efa_is_counted():
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.011), _pair(1, 2, 0.01), _pair(3, 0, 0.012)]
    facts = {
        "0": {"efa_devices": 4, "ports": {"0/0": "up"}},
        "1": {"efa_devices": 4, "ports": {"0/0": "up", "0/1": "down"}},
        "2": {"efa_devices": 4, "gaudinet": {"path": "/etc/gaudinet.json", "present": False}},
        "3": {"efa_devices": 4},
    }
    result = fabric.figures(_report(pairs, _full(), facts=facts), HOSTS)
    assert result.bad_hosts == ("worker-1", "worker-2")
    assert result.problems[0].startswith("host worker-1: Gaudi NIC port(s) 0/1 down")
    second = result.problems[1]
    assert "/etc/gaudinet.json is missing" in second and "--exclude worker-2" in second
    assert result.nodes[0].efa_devices == 4
    assert "efa" in fabric.render_table(result).splitlines()[0]
    assert fabric.FabricResult.from_json(result.to_json()) == result


def test_a_failed_pair_carries_the_hccl_log_tail_into_the_details():
    error = {"error": "timeout", "log_tail": ["hccl.log: link 3 down"]}
    pairs = [_pair(0, 1, 0.01), {"ranks": [2, 3], **error}, {"ranks": [1, 2], **error}, _pair(3, 0, 0.01)]
    result = fabric.figures(_report(pairs), HOSTS)
    assert "  hccl.log: link 3 down" in result.details


def _failed(a: int, b: int, kind: str = "timeout", **sides: str) -> dict:
    both = {str(a): kind, str(b): kind, **sides}
    return {"ranks": [a, b], "error": "Operation timed out!", "kind": kind, "sides": both}


def test_the_held_node_is_named_not_the_neighbour_a_stalled_round_made_late():
    # worker-3 held: its two pairs time out; worker-2, still held by round 0, fails its next pair late.
    pairs = [_pair(0, 1, 0.01), _failed(2, 3), {**_failed(1, 2), "late": [2]}, _failed(3, 0)]
    result = fabric.figures(_report(pairs), HOSTS)
    assert result.bad_hosts == ("worker-3",)
    assert result.problems[0].startswith("no answer from host worker-3 within 20 s")
    assert "pair worker-2 - worker-3 (timeout): Operation timed out!" in result.details


def test_without_the_late_mark_the_silent_side_is_named_first():
    # worker-2 and worker-3 both lost both pairs; worker-3's own side never answered one of them.
    pairs = [_pair(0, 1, 0.01), _failed(2, 3, **{"3": "silent"}), _failed(1, 2), _failed(3, 0)]
    named, links = fabric.localise(pairs, HOSTS)
    assert named == ["worker-3", "worker-2"] and links == []  # worker-2's link to worker-1 failed too
    # A peer that saw the other side close blames it: worker-2 and worker-3 lost both, worker-2 closed.
    pairs = [_pair(0, 1, 0.01), _failed(2, 3), _failed(1, 2, "closed", **{"2": "timeout"}), _failed(3, 0)]
    assert fabric.localise(pairs, HOSTS)[0][0] == "worker-2"


def test_a_link_no_host_explains_names_both_ends_and_the_pairs_inside_a_host_do_not_count():
    # Two ranks per node: (0,1) and (2,3) are inside a node; the links are (1,2) and (3,0).
    two = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    pairs = [_pair(0, 1, 0.01), _pair(2, 3, 0.01), _pair(4, 5, 0.01)]
    pairs += [_failed(1, 2), _pair(3, 4, 0.01), _pair(5, 0, 0.01)]
    report = {"world": 6, "backend": "gloo", "timeout_s": 10.0, "pairs": pairs}
    result = fabric.figures(report, two)
    assert result.bad_hosts == ("a", "b")
    assert result.problems[0].startswith("no answer between hosts a and b within 10 s")
    # A held node with two ranks: both of its links fail, its inner pair does not clear it.
    pairs[4] = _failed(3, 4)
    assert fabric.figures(report, two).bad_hosts == ("b",)


def test_error_kinds_and_the_pair_merged_from_its_two_sides():
    from train.fabric_rounds import kind_of, merge_sides

    assert kind_of(RuntimeError("Operation timed out!")) == "timeout"
    assert kind_of(TimeoutError()) == "timeout"
    assert kind_of(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer")) == "closed"
    assert kind_of(RuntimeError("Connection reset by peer")) == "closed"
    assert kind_of(ValueError("bad size")) == "error"
    ok = {"kind": "ok", "bytes": MB8, "seconds": 0.02}
    assert merge_sides((0, 1), {0: ok, 1: {**ok, "seconds": 0.03}}, 10)["seconds"] == 0.03
    merged = merge_sides((0, 1), {0: {"kind": "timeout", "error": "Operation timed out!"}, 1: None}, 10)
    assert merged["kind"] == "silent" and merged["sides"] == {"0": "timeout", "1": "silent"}
    assert merged["error"] == "Operation timed out!"
    late = merge_sides((2, 3), {2: {"kind": "closed", "error": "x", "late": 9.5}, 3: ok}, 10)
    assert late["late"] == [2] and late["kind"] == "closed"


def test_rounds_stop_once_the_pairs_so_far_name_a_node():
    from train.fabric_rounds import settled

    rounds = ring_rounds(5)  # [(0,1),(2,3)], [(1,2),(3,4)], [(4,0)]
    one_host_each = {r: f"h{r}" for r in range(5)}
    assert not settled([], rounds, one_host_each)
    first = [_failed(0, 1), _pair(2, 3, 0.01)]
    assert not settled(first, rounds, one_host_each)  # 0 or 1: the next round tells
    assert settled([*first, _failed(1, 2), _pair(3, 4, 0.01)], rounds, one_host_each)  # h1 lost both
    healthy = [_pair(0, 1, 0.01), _pair(2, 3, 0.01), _pair(1, 2, 0.01), _pair(3, 4, 0.01)]
    assert not settled(healthy, rounds, one_host_each)


def test_a_neighbour_of_a_held_node_is_not_called_slow_on_its_one_pair():
    # Seen on 2 shared cores: master's one good pair at half the others' while worker-3 was held.
    pairs = [_pair(0, 1, 0.05), _failed(2, 3), _pair(1, 2, 0.02), _failed(3, 0, **{"3": "silent"})]
    result = fabric.figures(_report(pairs), HOSTS)
    assert result.bad_hosts == ("worker-3",)
    assert len(result.problems) == 1 and result.problems[0].startswith("no answer from host worker-3")
