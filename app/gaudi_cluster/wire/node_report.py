"""What a node says about itself: the probe's report, parsed once where it arrives.

`gaudi-cluster probe --json` prints one `NodeReport` as a JSON line on each node; the master reads it
back with `NodeReport.from_json` and every phase after the survey reads typed fields, never keys.
The schema number changes whenever a field changes meaning, so that a node running another image
is named at once instead of being misread field by field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gaudi_cluster.wire.fields import shown as quoted
from gaudi_cluster.wire.host_name import host_problem

SCHEMA_VERSION = 1
MAX_HOST_NAME = 255
# The kernel driver of Gaudi devices, their NIC ports included.
HABANA_DRIVER = "habanalabs"


class NodeReportError(ValueError):
    """A probe's output that is not a node report of this schema."""


@dataclass(frozen=True)
class Interface:
    """A network interface in kernel order, its IPv4 addresses, and its kernel driver when a device
    backs it (a Gaudi NIC port's is habanalabs)."""

    name: str
    addresses: tuple[str, ...] = ()
    driver: str | None = None


@dataclass(frozen=True)
class NodeReport:
    accelerator: str  # hpu | cuda | cpu, as detected (or as requested)
    slots: int  # devices detected (the cpu slot count asked for on cpu)
    hostname: str | None = None
    python: str | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    build_id: str | None = None
    interfaces: tuple[Interface, ...] = ()
    paths: Mapping[str, bool] = field(default_factory=dict)  # each required path: does it exist here
    output_dir: str | None = None
    free_disk_bytes: int | None = None  # under output_dir (its nearest existing parent)
    free_shm_bytes: int | None = None
    uverbs_devices: tuple[str, ...] = ()
    hccl_ofi_wrapper: str | None = None
    profile: str | None = None  # the image's Gaudi software profile, None on the cpu flavor
    cpus: int | None = None  # usable: affinity mask capped by the cgroup quota
    boot_id: str | None = None  # nodes with one boot id are containers of one server
    driver_version: str | None = None  # the habanalabs driver, HPU nodes only
    fi_providers: Mapping[str, bool | None] = field(default_factory=dict)  # libfabric providers looked for
    device_name: str | None = None  # hl-smi's name of the cards (HL-205, HL-225, HL-325L), HPU nodes only
    # The image profile's paths (Open MPI, libfabric, EFA): does each exist on this node.
    profile_paths: Mapping[str, bool] = field(default_factory=dict)
    openmpi_version: str | None = None  # what the profile's mpirun (else the one on PATH) reports

    @property
    def efa_provider(self) -> bool | None:
        return self.fi_providers.get("efa")

    def interface(self, name: str | None) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def name_or(self, host: str) -> str:
        """The node's own host name (what its ranks report), else the name the master reached it by."""
        return self.hostname or host

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeReport:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise NodeReportError(f"not JSON: {text[:200]!r}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> NodeReport:
        if not isinstance(data, dict):
            raise NodeReportError(f"a node report is a JSON object, not {type(data).__name__}")
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise NodeReportError(
                f"node report schema {schema!r}, this master reads {SCHEMA_VERSION}: the node runs another "
                "gaudi-cluster image; fix: run the same image on every node"
            )
        try:
            fields = cls._optional_fields(data)
            report = cls(accelerator=_str(data, "accelerator"), slots=_int(data, "slots"), **fields)
        except KeyError as missing:
            raise NodeReportError(f"node report without {missing}") from None
        if (name := report.hostname) is None:
            return report
        # What the node calls itself reaches log lines and metric labels: the rule of host names.
        too_long = f"{quoted(name)} is over {MAX_HOST_NAME} characters"
        problem = host_problem(name) if len(name) <= MAX_HOST_NAME else too_long
        if problem is not None:
            raise NodeReportError(
                f"the host name the node reports is refused: {problem}; fix: give the node a host name "
                "of letters, digits, '.', '-' and '_' (or its IP address)"
            )
        return report

    @staticmethod
    def _optional_fields(data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "hostname": _opt_str(data, "hostname"),
            "python": _opt_str(data, "python"),
            "versions": _mapping(data, "versions", (str, type(None))),
            "build_id": _opt_str(data, "build_id"),
            "interfaces": tuple(_interface(item) for item in _list(data, "interfaces")),
            "paths": _mapping(data, "paths", (bool,)),
            "output_dir": _opt_str(data, "output_dir"),
            "free_disk_bytes": _opt_int(data, "free_disk_bytes"),
            "free_shm_bytes": _opt_int(data, "free_shm_bytes"),
            "uverbs_devices": tuple(_strings(data, "uverbs_devices")),
            "hccl_ofi_wrapper": _opt_str(data, "hccl_ofi_wrapper"),
            "profile": _opt_str(data, "profile"),
            "cpus": _opt_int(data, "cpus"),
            "boot_id": _opt_str(data, "boot_id"),
            "driver_version": _opt_str(data, "driver_version"),
            "fi_providers": _mapping(data, "fi_providers", (bool, type(None))),
            "device_name": _opt_str(data, "device_name"),
            "profile_paths": _mapping(data, "profile_paths", (bool,)),
            "openmpi_version": _opt_str(data, "openmpi_version"),
        }


def placeholder_reports(hosts: Sequence[str], accelerator: str) -> dict[str, NodeReport]:
    """What a dry run assumes of nodes it never contacts: the accelerator asked for, one slot each."""
    return {host: NodeReport(accelerator=accelerator, slots=1) for host in hosts}


def _wrong(key: str, want: str, value: object) -> NodeReportError:
    return NodeReportError(f"node report field {key!r} must be {want}, not {value!r:.80}")


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise _wrong(key, "a string", value)
    return value


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(key, "an integer", value)
    return value


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    return None if data.get(key) is None else _str(data, key)


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else _int(data, key)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise _wrong(key, "a list", value)
    return value


def _strings(data: Mapping[str, Any], key: str) -> list[str]:
    items = _list(data, key)
    if not all(isinstance(item, str) for item in items):
        raise _wrong(key, "a list of strings", items)
    return items


def _mapping(data: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, kinds) for k, v in value.items()
    ):
        raise _wrong(key, "an object of " + "/".join(k.__name__ for k in kinds), value)
    return dict(value)


def _interface(item: object) -> Interface:
    if not isinstance(item, dict):
        raise _wrong("interfaces", "a list of objects", item)
    return Interface(
        name=_str(item, "name"), addresses=tuple(_strings(item, "addresses")), driver=_opt_str(item, "driver")
    )


def report_from_last_line(lines: list[str]) -> NodeReport | str:
    """A probe's report, the last line it printed (over ssh or srun); or why it cannot be read."""
    try:
        return NodeReport.from_json(lines[-1])
    except NodeReportError as error:
        return f"probe report unreadable: {error}"
