"""Preflight checks over every node's probe report (pure), rendered as a table and as JSON.

A blocking finding stops the launch with its fix named; the others are warnings. The master runs
these before every launch unless --skip-doctor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

MIN_FREE_SHM = 256 << 20
COMPARED_PACKAGES = ("torch", "deepspeed", "transformers", "optimum-habana")


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = True


def _majority(values: Mapping[str, Any]) -> Any:
    counts: dict[str, int] = {}
    for value in values.values():
        counts[json.dumps(value)] = counts.get(json.dumps(value), 0) + 1
    return json.loads(max(counts, key=lambda key: counts[key]))


def check_nodes(
    reports: Mapping[str, Mapping[str, Any]],
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
        findings.append(Finding(host, "ssh", True, f"reachable as {report.get('hostname')}"))
        findings += _node_findings(
            host, report, requested_slots.get(host), socket_ifname, env, required_paths, min_free_disk
        )
    findings += _consistency_findings(reports)
    return findings


def _node_findings(
    host: str,
    report: Mapping[str, Any],
    requested: int | None,
    socket_ifname: str | None,
    env: Mapping[str, str],
    required_paths: Sequence[str],
    min_free_disk: int,
) -> list[Finding]:
    found: list[Finding] = []
    detected = int(report.get("slots") or 0)
    kind = report.get("accelerator", "cpu")
    if requested is not None and kind != "cpu" and requested > detected:
        found.append(
            Finding(
                host,
                "slots",
                False,
                f"{requested} requested, {detected} {kind} devices detected",
                "lower slots for this host or check HABANA_VISIBLE_MODULES / the device runtime",
            )
        )
    elif detected == 0 and kind != "cpu":
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
        addresses = {i["name"]: i.get("addresses", []) for i in report.get("interfaces", [])}
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
    if env.get("HCCL_OVER_OFI") == "1":
        found += _efa_findings(host, report)
    for path, exists in (report.get("paths") or {}).items():
        if path in required_paths and not exists:
            found.append(
                Finding(
                    host,
                    "workload",
                    False,
                    f"{path} is missing",
                    "use the same image (or shared storage) on every node",
                )
            )
    if required_paths and all((report.get("paths") or {}).get(p) for p in required_paths):
        found.append(Finding(host, "workload", True, "present"))
    disk = report.get("free_disk_bytes")
    where = report.get("output_dir", "the output directory")
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
    shm = report.get("free_shm_bytes")
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


def _efa_findings(host: str, report: Mapping[str, Any]) -> list[Finding]:
    found = []
    if not report.get("uverbs_devices"):
        found.append(
            Finding(
                host,
                "efa",
                False,
                "HCCL_OVER_OFI=1 but no /dev/infiniband/uverbs* device",
                "run the container with --privileged (or --device /dev/infiniband/uverbsN)",
            )
        )
    if report.get("efa_provider") is False:
        found.append(
            Finding(
                host,
                "efa",
                False,
                "`fi_info -p efa` finds no EFA provider",
                "check the EFA driver on the host and the security group",
            )
        )
    if not report.get("hccl_ofi_wrapper"):
        found.append(
            Finding(
                host,
                "efa",
                False,
                "libhccl_ofi_wrapper.so not found",
                "use the gaudi image (it builds hccl_ofi_wrapper) or add its dir to LD_LIBRARY_PATH",
            )
        )
    if not found:
        found.append(
            Finding(host, "efa", True, f"{len(report['uverbs_devices'])} uverbs devices, wrapper present")
        )
    return found


def _consistency_findings(reports: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    if len(reports) < 2:
        return []
    found = []
    for key, label in (("versions", "versions"), ("build_id", "image"), ("python", "python")):
        values = {host: report.get(key) for host, report in reports.items()}
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
