"""How many ranks a node can run (slots) and which accelerator it has; the vendor tools' answers.

The /dev listing, the sysfs driver links and the vendor tools are injected, so detection is testable
without devices. A zero count is returned as 0: whether that is fatal is the caller's (doctor's) decision.

Gaudi cards are the /dev/accel/accelN nodes whose sysfs device is bound to the habanalabs driver:
/dev/accel also holds other accelerators (Intel NPU, AMD XDNA), and with HABANA_VISIBLE_DEVICES=2,3 the
container runtime mounts accel2 and accel3 only, so neither "accel0 exists" nor "any accelN" is a Gaudi.
sysfs is read under $GAUDI_CLUSTER_SYSFS_ROOT (default /sys), which tests point at a fake tree.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import slurm
from gaudi_cluster.wire.kinds import Accelerator
from gaudi_cluster.wire.node_report import HABANA_DRIVER, NodeReport

ACCELERATORS = tuple(Accelerator)
ACCEL_DIR = "/dev/accel"
# accel_controlD* are the control nodes of the same cards; counting them would double the slots.
_ACCEL_RE = re.compile(r"accel[0-9]+")
HL_SMI_INDEX = ("hl-smi", "-Q", "index", "-f", "csv,noheader")
HL_SMI_DRIVER_VERSION = ("hl-smi", "-Q", "driver_version", "-f", "csv,noheader")
NVIDIA_SMI_LIST = ("nvidia-smi", "-L")
SYSFS_ROOT_ENV = "GAUDI_CLUSTER_SYSFS_ROOT"
# hl-smi's driver version: the Synapse release and a build hash, e.g. 1.22.1-97ec1a4.
_DRIVER_VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?")

ListDir = Callable[[str], list[str]]
Runner = Callable[[Sequence[str]], "str | None"]
# The kernel driver bound to a sysfs device ("class/accel/accel0", "class/net/eth0"), or None.
DriverOf = Callable[[str], "str | None"]


def sysfs_driver(root: str) -> DriverOf:
    """Reads <root>/<device>/device/driver, the link to the bound driver's directory."""

    def driver_of(device: str) -> str | None:
        link = os.path.join(root, device, "device", "driver")
        if not os.path.islink(link) and not os.path.isdir(link):
            return None
        return os.path.basename(os.path.realpath(link)) or None

    return driver_of


def sysfs_root(env: Mapping[str, str]) -> str:
    return env.get(SYSFS_ROOT_ENV) or "/sys"


def default_run(argv: Sequence[str], timeout_s: float = 15.0) -> str | None:
    """stdout of `argv`, or None when the tool is absent, fails or hangs."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _accel_nodes(list_dir: ListDir) -> list[str]:
    try:
        names = list_dir(ACCEL_DIR)
    except OSError:
        return []
    return sorted(n for n in names if _ACCEL_RE.fullmatch(n))


def habana_nodes(list_dir: ListDir, driver_of: DriverOf) -> list[str]:
    """The /dev/accel/accelN nodes of this container that are Gaudi cards."""
    return [n for n in _accel_nodes(list_dir) if driver_of(f"class/accel/{n}") == HABANA_DRIVER]


def driver_version(run: Runner) -> str | None:
    """The host driver's version as hl-smi reports it (one row per card, all equal), or None."""
    out = run(HL_SMI_DRIVER_VERSION)
    for line in (out or "").splitlines():
        if _DRIVER_VERSION_RE.fullmatch(line.strip()):
            return line.strip()
    return None


def fi_info_has_provider(stdout: str, provider: str) -> bool:
    """Whether `fi_info -p PROVIDER` output lists that provider (`provider: efa` lines)."""
    return any(
        line.strip().lower() == f"provider: {provider}".lower()
        or line.strip().lower().startswith(f"provider: {provider};".lower())
        for line in stdout.splitlines()
    )


def _hl_smi_count(run: Runner) -> int:
    out = run(HL_SMI_INDEX)
    if not out:
        return 0
    return sum(1 for line in out.splitlines() if line.strip().isdigit())


def _nvidia_smi_count(run: Runner) -> int:
    out = run(NVIDIA_SMI_LIST)
    if not out:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def parse_habana_visible_modules(value: str) -> list[int]:
    items = [v.strip() for v in value.split(",")]
    modules: list[int] = []
    for item in items:
        if not re.fullmatch(r"[0-9]+", item):
            raise ConfigError(
                f"HABANA_VISIBLE_MODULES='{value}': '{item}' is not a module id; "
                "fix: write a comma list of module ids such as 0,1,2,3"
            )
        if int(item) in modules:
            raise ConfigError(
                f"HABANA_VISIBLE_MODULES='{value}': module {item} is listed twice; fix: list each id once"
            )
        modules.append(int(item))
    return modules


def cuda_visible_count(value: str) -> int:
    """Devices CUDA exposes for a CUDA_VISIBLE_DEVICES value (the list stops at the first -1)."""
    value = value.strip()
    if value in ("", "NoDevFiles"):
        return 0
    count = 0
    for raw in value.split(","):
        item = raw.strip()
        if not item or item.startswith("-"):
            break
        count += 1
    return count


def habana_visible_count(value: str) -> int | None:
    """Cards a HABANA_VISIBLE_DEVICES list names (`0,1,2,3`); None for `all` or anything not a list.

    The Habana container runtime reads it to choose the cards it mounts; where no runtime did (an
    engine that starts the image directly), the list is still what this node was given.
    """
    items = [item.strip() for item in value.split(",")]
    if not value.strip() or not all(re.fullmatch(r"[0-9]+", item) for item in items):
        return None
    return len(set(items))


def detect_slots(
    accelerator: str,
    env: Mapping[str, str],
    *,
    cpu_slots: int | None = None,
    list_dir: ListDir = os.listdir,
    run: Runner = default_run,
    driver_of: DriverOf | None = None,
) -> int:
    if accelerator == Accelerator.HPU:
        visible = env.get("HABANA_VISIBLE_MODULES", "").strip()
        if visible:
            return len(parse_habana_visible_modules(visible))
        # What an engine gave this node beats what /dev shows: without the Habana runtime (pyxis, a
        # Slurm node running the image directly) /dev/accel lists every card of the server.
        # SLURM_GPUS_ON_NODE=0 (no GRES asked for) says nothing about the cards: detect them.
        given = habana_visible_count(env.get("HABANA_VISIBLE_DEVICES", "")) or slurm.gpus_on_node(env)
        if given:
            return given
        return len(habana_nodes(list_dir, driver_of or sysfs_driver(sysfs_root(env)))) or _hl_smi_count(run)
    if accelerator == Accelerator.CUDA:
        if "CUDA_VISIBLE_DEVICES" in env:
            return cuda_visible_count(env["CUDA_VISIBLE_DEVICES"])
        return _nvidia_smi_count(run)
    if accelerator == Accelerator.CPU:
        if cpu_slots is None:
            return 1
        if isinstance(cpu_slots, bool) or cpu_slots < 1:
            raise ConfigError(f"GAUDI_CLUSTER_SLOTS={cpu_slots} is not >= 1; fix: set the ranks per node")
        return cpu_slots
    raise ConfigError(f"accelerator '{accelerator}' is unknown; fix: use one of {', '.join(ACCELERATORS)}")


def detect_accelerator(
    env: Mapping[str, str],
    list_dir: ListDir = os.listdir,
    run: Runner = default_run,
    driver_of: DriverOf | None = None,
) -> str:
    """GAUDI_CLUSTER_ACCELERATOR, then DS_ACCELERATOR, then what the node has (hpu > cuda > cpu)."""
    for var in ("GAUDI_CLUSTER_ACCELERATOR", "DS_ACCELERATOR"):
        value = env.get(var, "").strip().lower()
        if value in ("", "auto"):
            continue
        if value not in ACCELERATORS:
            raise ConfigError(
                f"{var}='{env[var]}' is not supported; fix: use one of {', '.join(ACCELERATORS)} or auto"
            )
        return value
    if habana_nodes(list_dir, driver_of or sysfs_driver(sysfs_root(env))) or _hl_smi_count(run) > 0:
        return Accelerator.HPU
    if _nvidia_smi_count(run) > 0:
        return Accelerator.CUDA
    return Accelerator.CPU


def resolve_accelerator(
    requested: str, environ: Mapping[str, str], master_report: NodeReport | None = None
) -> str:
    """The device kind of the job: the setting, else what the master reported, else DS_ACCELERATOR.

    Before the master has probed itself (dry runs, the default job's arguments) the image's
    DS_ACCELERATOR is the best guess; afterwards the probe's answer wins.
    """
    if requested != "auto":
        return requested
    if master_report is not None:
        return master_report.accelerator
    return environ.get("DS_ACCELERATOR") or Accelerator.CPU
