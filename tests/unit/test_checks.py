"""The doctor's pure checks over probe reports: one table-driven case per finding."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.nodes.checks import Finding, blocking, check_nodes, render_json, render_table

from tests.support.reports import as_report, as_reports

GIB = 1 << 30


def report(**over) -> dict:
    base = {
        "hostname": "node",
        "python": "/opt/venv/bin/python",
        "accelerator": "hpu",
        "slots": 8,
        "versions": {"torch": "2.7.1", "deepspeed": "0.16.1", "transformers": "4.51.3"},
        "build_id": "0.1.0-abc-123",
        "interfaces": [{"name": "eth0", "addresses": ["10.0.0.1"]}],
        "paths": {"/workspace": True, "/w/run.py": True},
        "free_disk_bytes": 100 * GIB,
        "free_shm_bytes": 8 * GIB,
        "uverbs_devices": ["/dev/infiniband/uverbs0"],
        "efa_provider": True,
        "hccl_ofi_wrapper": "/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
    }
    base.update(over)
    return base


def findings_for(
    one: dict, *, requested: int | None = None, env: dict | None = None, ifname: str | None = "eth0"
) -> list[Finding]:
    paths = ("/workspace", "/w/run.py")
    return check_nodes(
        {"a": as_report(one)}, {}, {"a": requested}, ifname, env or {}, paths, min_free_disk=64 << 20
    )


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def test_a_healthy_node_passes_every_check():
    found = findings_for(report(), env={"HCCL_OVER_OFI": "1"})
    assert not [f for f in found if not f.ok], found
    assert {f.check for f in found} == {"ssh", "slots", "interface", "efa", "workload", "disk"}


@pytest.mark.parametrize(
    ("over", "requested", "blocks", "detail"),
    [
        ({"slots": 4}, 8, True, "8 requested, 4 hpu devices detected"),
        ({"slots": 0}, None, True, "no hpu device detected"),
        ({"slots": 0, "accelerator": "cpu"}, 4, False, None),  # cpu slots are a choice, not a device count
        ({"slots": 8}, 8, False, None),
    ],
)
def test_slots(over, requested, blocks, detail):
    (finding,) = by_check(findings_for(report(**over), requested=requested), "slots")
    assert finding.ok is not blocks
    if detail:
        assert finding.detail == detail and finding.fix


def test_interface_missing_or_without_address_blocks():
    no_addr = report(
        interfaces=[{"name": "eth0", "addresses": []}, {"name": "ib0", "addresses": ["1.2.3.4"]}]
    )
    (finding,) = by_check(findings_for(no_addr), "interface")
    assert (
        not finding.ok and finding.blocking and "eth0 missing" in finding.detail and "ib0" in finding.detail
    )
    assert not by_check(findings_for(report(), ifname=None), "interface")


@pytest.mark.parametrize(
    ("over", "detail"),
    [
        ({"uverbs_devices": []}, "no /dev/infiniband/uverbs* device"),
        ({"efa_provider": False}, "finds no EFA provider"),
        ({"hccl_ofi_wrapper": None}, "libhccl_ofi_wrapper.so not found"),
    ],
)
def test_efa_checks_only_when_hccl_goes_over_ofi(over, detail):
    efa = by_check(findings_for(report(**over), env={"HCCL_OVER_OFI": "1"}), "efa")
    assert [f.detail for f in efa if not f.ok] == [next(f.detail for f in efa if detail in f.detail)]
    assert not by_check(findings_for(report(**over)), "efa")


def test_missing_workload_path_blocks():
    (finding,) = by_check(findings_for(report(paths={"/workspace": True, "/w/run.py": False})), "workload")
    assert not finding.ok and finding.blocking and finding.detail == "/w/run.py is missing"


@pytest.mark.parametrize(
    ("over", "check"), [({"free_disk_bytes": 10 << 20}, "disk"), ({"free_shm_bytes": 64 << 20}, "shm")]
)
def test_low_disk_and_shm_warn_without_blocking(over, check):
    (finding,) = by_check(findings_for(report(**over)), check)
    assert not finding.ok and not finding.blocking
    assert not blocking(findings_for(report(**over)))


def test_low_disk_names_the_directory_and_the_threshold():
    low = report(output_dir="/workspace/output", free_disk_bytes=8 << 20)
    (finding,) = by_check(findings_for(low), "disk")
    assert finding.detail == "/workspace/output: 8 MiB free, below --min-free-disk 64 MiB"
    assert "--output_dir" in finding.fix and not finding.blocking


def test_unreachable_nodes_block():
    found = check_nodes({}, {"b": "nothing listens on port 3022"}, {}, None, {}, (), min_free_disk=1)
    assert [(f.host, f.check, f.ok) for f in found] == [("b", "ssh", False)]
    assert blocking(found) == found


@pytest.mark.parametrize(
    ("key", "value", "label", "detail"),
    [
        (
            "versions",
            {"torch": "2.6.0", "deepspeed": "0.16.1", "transformers": "4.51.3"},
            "versions",
            "torch 2.6.0",
        ),
        ("build_id", "0.1.0-def-456", "image", "0.1.0-def-456 (others 0.1.0-abc-123)"),
        ("python", "/usr/bin/python3", "python", "/usr/bin/python3"),
    ],
)
def test_the_odd_node_out_is_named(key, value, label, detail):
    reports = {"a": report(), "b": report(), "c": report(**{key: value})}
    found = check_nodes(as_reports(reports), {}, {}, None, {}, (), min_free_disk=1)
    odd = [f for f in found if f.check == label]
    assert [(f.host, f.ok) for f in odd] == [("c", False)]
    assert detail in odd[0].detail


def test_table_and_json_render_every_finding():
    found = findings_for(report(slots=0))
    table = render_table(found).splitlines()
    assert table[0].split() == ["HOST", "CHECK", "RESULT", "DETAIL", "FIX"]
    assert any(line.split()[:3] == ["a", "slots", "FAIL"] for line in table[1:])
    assert len(json.loads(render_json(found))) == len(found)
