"""Preflight checks over every node's probe report (pure), rendered as a table and as JSON.

A blocking finding stops the launch with its fix named; the others are warnings. The master runs
these before every launch unless --skip-doctor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from gaudi_cluster.env import presets
from gaudi_cluster.nodes.image_checks import Finding, driver_findings, profile_path_findings
from gaudi_cluster.wire.kinds import Accelerator
from gaudi_cluster.wire.node_report import HABANA_DRIVER, NodeReport

__all__ = ["Finding", "blocking", "check_nodes", "render_json", "render_table"]

MIN_FREE_SHM = 256 << 20
COMPARED_PACKAGES = ("torch", "deepspeed", "transformers", "optimum-habana")


def _majority(values: Mapping[str, Any]) -> Any:
    counts: dict[str, int] = {}
    for value in values.values():
        counts[json.dumps(value)] = counts.get(json.dumps(value), 0) + 1
    return json.loads(max(counts, key=lambda key: counts[key]))


def check_nodes(
    reports: Mapping[str, NodeReport],
    unreachable: Mapping[str, str],
    requested_slots: Mapping[str, int | None],
    socket_ifname: str | None,
    env: Mapping[str, str],
    required_paths: Sequence[str],
    min_free_disk: int,
) -> list[Finding]:
    findings: list[Finding] = []
    for host, why in unreachable.items():
        findings.append(Finding(host, "ssh", False, why, "see the cause above"))
    for host, report in reports.items():
        findings.append(Finding(host, "ssh", True, f"reachable as {report.hostname}"))
        findings += _node_findings(
            host, report, requested_slots.get(host), socket_ifname, env, required_paths, min_free_disk
        )
    findings += _consistency_findings(reports)
    return findings


def _node_findings(
    host: str,
    report: NodeReport,
    requested: int | None,
    socket_ifname: str | None,
    env: Mapping[str, str],
    required_paths: Sequence[str],
    min_free_disk: int,
) -> list[Finding]:
    found: list[Finding] = []
    detected, kind = report.slots, report.accelerator
    if requested is not None and kind != Accelerator.CPU and requested > detected:
        found.append(
            Finding(
                host,
                "slots",
                False,
                f"{requested} requested, {detected} {kind} devices detected",
                "lower slots for this host or check HABANA_VISIBLE_MODULES / the device runtime",
            )
        )
    elif detected == 0 and kind != Accelerator.CPU:
        found.append(
            Finding(
                host,
                "slots",
                False,
                f"no {kind} device detected",
                "run the container with the device runtime (--runtime=habana)",
            )
        )
    else:
        found.append(
            Finding(host, "slots", True, f"{requested or detected} used, {detected} {kind} detected")
        )
    if socket_ifname:
        addresses = {i.name: i.addresses for i in report.interfaces}
        if not addresses.get(socket_ifname):
            found.append(
                Finding(
                    host,
                    "interface",
                    False,
                    f"{socket_ifname} missing or without an IPv4 address (has: {', '.join(addresses)})",
                    "set GAUDI_CLUSTER_SOCKET_IFNAME to an interface present on every node",
                )
            )
        else:
            found.append(Finding(host, "interface", True, f"{socket_ifname} {addresses[socket_ifname][0]}"))
    found += _hccl_interface_findings(host, report, env.get("HCCL_SOCKET_IFNAME"), socket_ifname)
    if kind == Accelerator.HPU:
        found += driver_findings(host, report)
    found += profile_path_findings(host, report)
    if env.get("HCCL_OVER_OFI") == "1":
        found += _ofi_findings(host, report, presets.wanted_provider(env) or "efa")
    for path, exists in report.paths.items():
        if path in required_paths and not exists:
            found.append(
                Finding(
                    host,
                    "workload",
                    False,
                    f"{path} is missing",
                    f"put {path} on {host} (the same image, a mount or shared storage on every node)",
                )
            )
    if required_paths and all(report.paths.get(p) for p in required_paths):
        found.append(Finding(host, "workload", True, "present"))
    disk = report.free_disk_bytes
    where = report.output_dir or "the output directory"
    if disk is not None and disk < min_free_disk:
        found.append(
            Finding(
                host,
                "disk",
                False,
                f"{where}: {disk >> 20} MiB free, below --min-free-disk {min_free_disk >> 20} MiB",
                "free space there (checkpoints land on every node) or use --output_dir on a larger volume",
                blocking=False,
            )
        )
    elif disk is not None:
        found.append(Finding(host, "disk", True, f"{where}: {disk >> 20} MiB free"))
    shm = report.free_shm_bytes
    if shm is not None and shm < MIN_FREE_SHM:
        found.append(
            Finding(
                host,
                "shm",
                False,
                f"/dev/shm has {shm >> 20} MiB free",
                "run the container with --ipc=host or --shm-size 1g",
                blocking=False,
            )
        )
    return found


def _hccl_interface_findings(
    host: str, report: NodeReport, hccl_ifname: str | None, checked: str | None
) -> list[Finding]:
    """HCCL_SOCKET_IFNAME must name an IPv4 interface on every node, and never a Gaudi NIC's netdev."""
    if not hccl_ifname:
        return []
    interface = report.interface(hccl_ifname)
    fix = "set --socket-ifname (GAUDI_CLUSTER_SOCKET_IFNAME) to a host interface present on every node"
    if interface is not None and interface.driver == HABANA_DRIVER:
        detail = f"HCCL_SOCKET_IFNAME={hccl_ifname} is a Gaudi NIC (habanalabs driver)"
        return [Finding(host, "hccl interface", False, detail, fix)]
    if hccl_ifname == checked:
        return []  # the interface row above already covers it
    if interface is None or not interface.addresses:
        detail = f"HCCL_SOCKET_IFNAME={hccl_ifname} missing or without an IPv4 address"
        return [Finding(host, "hccl interface", False, detail, fix)]
    return [Finding(host, "hccl interface", True, f"{hccl_ifname} {interface.addresses[0]}")]


def _ofi_findings(host: str, report: NodeReport, provider: str) -> list[Finding]:
    """HCCL over libfabric: uverbs devices, the provider the ranks need, and hccl_ofi_wrapper."""
    found = []
    check = "efa" if provider == "efa" else "ofi"
    if not report.uverbs_devices:
        found.append(
            Finding(
                host,
                check,
                False,
                "HCCL_OVER_OFI=1 but no /dev/infiniband/uverbs* device",
                "run the container with --privileged (or --device /dev/infiniband/uverbsN)",
            )
        )
    available = report.fi_providers.get(provider)
    if available is False:
        fix = (
            "check the EFA driver on the host and the security group"
            if provider == "efa"
            else f"use a libfabric with the {provider} provider (LIBFABRIC_ROOT); check the host NIC's driver"
        )
        found.append(
            Finding(
                host,
                check,
                False,
                f"`fi_info -p {provider}` finds no {'EFA' if provider == 'efa' else provider} provider",
                fix,
            )
        )
    if not report.hccl_ofi_wrapper:
        found.append(
            Finding(
                host,
                check,
                False,
                "libhccl_ofi_wrapper.so not found",
                "use the gaudi image (it builds hccl_ofi_wrapper) or add its dir to LD_LIBRARY_PATH",
            )
        )
    if not found:
        detail = f"{len(report.uverbs_devices)} uverbs devices, {provider} provider, wrapper present"
        found.append(Finding(host, check, True, detail))
    return found


def _consistency_findings(reports: Mapping[str, NodeReport]) -> list[Finding]:
    if len(reports) < 2:
        return []
    found = []
    for key, label in (
        ("versions", "versions"),
        ("build_id", "image"),
        ("python", "python"),
        ("profile", "profile"),
    ):
        values = {host: getattr(report, key) for host, report in reports.items()}
        expected = _majority(values)
        for host, value in values.items():
            if value != expected:
                if key == "versions":
                    diff = ", ".join(
                        f"{name} {value.get(name)} (others {expected.get(name)})"
                        for name in COMPARED_PACKAGES
                        if value.get(name) != expected.get(name)
                    )
                else:
                    diff = f"{value} (others {expected})"
                found.append(
                    Finding(
                        host,
                        label,
                        False,
                        f"differs: {diff}",
                        "run the same image on every node (make image, then docker pull/load everywhere)",
                    )
                )
    return found


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok and f.blocking]


def render_table(findings: Sequence[Finding]) -> str:
    rows = [("HOST", "CHECK", "RESULT", "DETAIL", "FIX")]
    for f in findings:
        status = "ok" if f.ok else ("FAIL" if f.blocking else "warn")
        rows.append((f.host, f.check, status, f.detail, f.fix))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def render_json(findings: Sequence[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2)
