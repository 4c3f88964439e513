"""What a node reports about itself: run locally by `gaudi-cluster probe --json`, over ssh by the master.

Only cheap, read-only checks (no torch import: versions come from package metadata) so that
probing 32 nodes in parallel costs about one ssh round trip.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gaudi_cluster import devices, jobdir
from gaudi_cluster.errors import ConfigError

PACKAGES = ("torch", "deepspeed", "transformers", "optimum-habana", "habana-torch-plugin")
BUILD_ID_FILE = Path("/opt/gaudi-cluster/BUILD_ID")
HCCL_OFI_WRAPPER = "libhccl_ofi_wrapper.so"


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def interfaces() -> list[dict[str, Any]]:
    """Interfaces in kernel (ifindex) order with their IPv4 addresses."""
    try:
        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        return [
            {"name": entry["ifname"], "addresses": [a["local"] for a in entry.get("addr_info", [])]}
            for entry in sorted(json.loads(out), key=lambda e: e.get("ifindex", 0))
        ]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
        return [{"name": name, "addresses": []} for name in names]


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _hccl_ofi_wrapper() -> str | None:
    dirs = [*os.environ.get("LD_LIBRARY_PATH", "").split(":"), "/usr/lib/habanalabs"]
    for directory in filter(None, dirs):
        candidate = Path(directory) / HCCL_OFI_WRAPPER
        if candidate.exists():
            return str(candidate)
    return None


def _efa_provider_ok() -> bool | None:
    fi_info = shutil.which("fi_info") or next(iter(glob.glob("/opt/amazon/efa/bin/fi_info")), None)
    if not fi_info:
        return None
    try:
        return (
            subprocess.run([fi_info, "-p", "efa"], capture_output=True, timeout=10, check=False).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _existing_ancestor(path: str) -> str:
    """The output directory may not exist yet: its disk is the one of its nearest existing parent."""
    current = Path(path)
    while not current.exists() and current != current.parent:
        current = current.parent
    return str(current)


def probe(
    paths: Sequence[str],
    accelerator: str,
    cpu_slots: int | None,
    check_efa: bool,
    output_dir: str | None = None,
) -> dict[str, Any]:
    environ = dict(os.environ)
    kind = devices.detect_accelerator(environ) if accelerator == "auto" else accelerator
    report: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "accelerator": kind,
        "slots": devices.detect_slots(kind, environ, cpu_slots=cpu_slots),
        "versions": package_versions(),
        "build_id": BUILD_ID_FILE.read_text().strip() if BUILD_ID_FILE.exists() else None,
        "interfaces": interfaces(),
        "paths": {path: os.path.exists(path) for path in paths},
        "output_dir": output_dir or os.getcwd(),
        "free_disk_bytes": _free_bytes(_existing_ancestor(output_dir or os.getcwd())),
        "free_shm_bytes": _free_bytes("/dev/shm"),
        "uverbs_devices": sorted(glob.glob("/dev/infiniband/uverbs*")),
        "hccl_ofi_wrapper": _hccl_ofi_wrapper(),
    }
    if check_efa:
        report["efa_provider"] = _efa_provider_ok()
    return report


def run(
    paths: Sequence[str],
    accelerator: str,
    cpu_slots: int | None,
    check_efa: bool,
    stage_job: str | None,
    job_root: str,
    output_dir: str | None = None,
) -> int:
    """`gaudi-cluster probe`: stage the job's directory (private payload on stdin) if asked, then report."""
    if stage_job:
        try:
            payload = json.loads(sys.stdin.read() or "{}")
        except ValueError:
            raise ConfigError(
                "probe --stage: stdin is not the master's JSON payload; fix: let the master run it"
            ) from None
        jobdir.stage(job_root, stage_job, payload)
    print(json.dumps(probe(paths, accelerator, cpu_slots, check_efa, output_dir), sort_keys=True))
    return 0
