"""The probe's node report: one typed value, parsed once where it arrives, refused when it is not ours."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.wire.node_report import (
    SCHEMA_VERSION,
    Interface,
    NodeReport,
    NodeReportError,
    placeholder_reports,
    report_from_last_line,
)

FULL = NodeReport(
    accelerator="hpu",
    slots=8,
    hostname="gaudi-7",
    python="/usr/bin/python3",
    versions={"torch": "2.11.0", "deepspeed": None},
    build_id="0.1.0-abc-123",
    interfaces=(Interface("eth0", ("10.0.0.7",)), Interface("hl0", ("192.168.1.7",), "habanalabs")),
    paths={"/workspace": True, "/w/run.py": False},
    output_dir="/workspace/output",
    free_disk_bytes=1 << 40,
    free_shm_bytes=1 << 30,
    uverbs_devices=("/dev/infiniband/uverbs0",),
    hccl_ofi_wrapper="/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
    profile="gaudi",
    cpus=160,
    boot_id="b-1",
    driver_version="1.24.1-482",
    fi_providers={"efa": None, "verbs": True},
)


def test_a_report_survives_the_wire_unchanged():
    text = FULL.to_json()
    assert json.loads(text)["schema"] == SCHEMA_VERSION
    assert NodeReport.from_json(text) == FULL


def test_typed_reads_replace_keys():
    assert FULL.interface("hl0") == Interface("hl0", ("192.168.1.7",), "habanalabs")
    assert FULL.interface("eth9") is None
    assert FULL.efa_provider is None
    assert FULL.name_or("10.0.0.7") == "gaudi-7"
    assert NodeReport(accelerator="cpu", slots=1).name_or("10.0.0.7") == "10.0.0.7"


def test_another_schema_is_refused_with_the_fix():
    data = json.loads(FULL.to_json())
    for schema in (None, SCHEMA_VERSION + 1):
        data["schema"] = schema
        with pytest.raises(NodeReportError, match="another gaudi-cluster image; fix: run the same image"):
            NodeReport.from_dict(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slots": "8"}, "'slots' must be an integer"),
        ({"slots": True}, "'slots' must be an integer"),
        ({"accelerator": None}, "'accelerator' must be a string"),
        ({"interfaces": [{"addresses": []}]}, "without 'name'"),
        ({"interfaces": "eth0"}, "'interfaces' must be a list"),
        ({"paths": {"/w": "yes"}}, "'paths' must be an object of bool"),
        ({"uverbs_devices": [1]}, "'uverbs_devices' must be a list of strings"),
        ({"cpus": 2.5}, "'cpus' must be an integer"),
    ],
)
def test_a_malformed_field_is_named(change, message):
    data = {**json.loads(FULL.to_json()), **change}
    with pytest.raises(NodeReportError, match=message):
        NodeReport.from_dict(data)


@pytest.mark.parametrize("text", ["", "not json", "[" * 2000, "[1, 2]", "null"])
def test_what_is_not_a_report_object_is_refused(text):
    with pytest.raises(NodeReportError):
        NodeReport.from_json(text)


def test_a_missing_required_field_is_named():
    data = json.loads(FULL.to_json())
    del data["accelerator"]
    with pytest.raises(NodeReportError, match="without 'accelerator'"):
        NodeReport.from_dict(data)


def test_a_dry_run_assumes_one_slot_of_the_asked_accelerator():
    assert placeholder_reports(["a", "b"], "hpu") == {
        "a": NodeReport(accelerator="hpu", slots=1),
        "b": NodeReport(accelerator="hpu", slots=1),
    }


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("bad\x1b[31mname", r"'bad\x1b[31mname'"),
        ("-oProxyCommand=x", "'-oProxyCommand=x'"),
        ("x y", "'x y'"),
        ("é.example", "'é.example'"),
        ("a" * 300, "(300 characters)"),
        ("", "empty host name"),
    ],
)
def test_a_node_reporting_a_host_name_no_host_has_is_refused_naming_it_quoted(name, shown):
    line = json.dumps({"schema": SCHEMA_VERSION, "accelerator": "cpu", "slots": 1, "hostname": name})
    why = report_from_last_line([line])
    assert isinstance(why, str) and "host name the node reports is refused" in why and shown in why, why
    assert "\n" not in why and "\x1b" not in why and "fix:" in why
    ok = json.dumps({"schema": SCHEMA_VERSION, "accelerator": "cpu", "slots": 1, "hostname": "gaudi-7.lan"})
    assert report_from_last_line([ok]).hostname == "gaudi-7.lan"
