"""Node reports for tests, written as the probe's JSON fields (the schema number added)."""

from __future__ import annotations

from typing import Any

from gaudi_cluster.wire.node_report import SCHEMA_VERSION, NodeReport


def as_report(fields: dict[str, Any]) -> NodeReport:
    """A NodeReport from probe-style fields (accelerator and slots default to one cpu slot)."""
    fields = dict(fields)
    if "efa_provider" in fields:  # the probe's older spelling of fi_providers["efa"]
        fields["fi_providers"] = {"efa": fields.pop("efa_provider"), **fields.get("fi_providers", {})}
    return NodeReport.from_dict({"schema": SCHEMA_VERSION, "accelerator": "cpu", "slots": 1, **fields})


def as_reports(by_host: dict[str, dict[str, Any]]) -> dict[str, NodeReport]:
    return {host: as_report(fields) for host, fields in by_host.items()}
