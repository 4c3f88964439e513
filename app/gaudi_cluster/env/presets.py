"""The .deepspeed_env presets: what each scale-out path needs on every rank. Pure tables.

  efa       first-gen Gaudi on AWS DL1: HCCL over libfabric's EFA provider (the dl1 profile).
  gaudinic  Gaudi 2/3 scaling out over their own NIC ports: Habana's runtime paths only.
  hostnic   Gaudi 2/3 over host IB/RoCE NICs through libfabric verbs with Gaudi Direct (Habana's
            "Scale-out via Host NIC"): HCCL_OVER_OFI=1, HCCL_GAUDI_DIRECT=1, libfabric's lib first.
Every HPU preset carries Habana's runtime paths (a rank without GC_KERNEL_PATH fails its first graph
compile). FI_PROVIDER is left alone: HCCL picks the provider itself (verbs before tcp).

Where libfabric and Open MPI live is a fact of the image's profile (settings/profiles.json), which the
gaudi build hands to every process as LIBFABRIC_ROOT and MPI_ROOT (the ssh sessions get them too): the
OFI presets read those, never a path of their own. An image that sets neither gets neither directory.

HCCL_SOCKET_IFNAME (the interface of HCCL's own sockets) is written only when given or derived from the
route to the master (`hccl_socket_ifname`); unset, HCCL takes the first IPv4 interface whose name does
not start with lo, docker or tunl and that is not a Gaudi NIC. The seed's rule, `default_socket_ifname`
(first interface not starting with lo or docker), only picks the master's own address and gloo's socket.

Which preset `auto` picks, and how presets, the master's environment and the user's own variables
are merged, is decided in `jobenv`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from gaudi_cluster.wire.kinds import EnvPreset
from gaudi_cluster.wire.node_report import HABANA_DRIVER, Interface

OFI_WRAPPER_DIR = "/usr/lib/habanalabs"


def _prepend_paths(first: Sequence[str], existing: str | None) -> str:
    parts = list(first)
    for p in (existing or "").split(":"):
        if p and p not in parts:
            parts.append(p)
    return ":".join(parts)


def libfabric_root(environ: Mapping[str, str]) -> str | None:
    """The image's one libfabric (the gaudi build sets LIBFABRIC_ROOT from its profile), or None."""
    return environ.get("LIBFABRIC_ROOT") or None


def fabric_ld_library_path(environ: Mapping[str, str]) -> str:
    """The ranks' LD_LIBRARY_PATH on the OFI paths: libfabric's lib first (hccl_ofi_wrapper has no
    RPATH), then the wrapper and Open MPI's; the probe runs fi_info with the same value."""
    root, mpi_root = libfabric_root(environ), environ.get("MPI_ROOT")
    first = [*([f"{root}/lib"] if root else []), OFI_WRAPPER_DIR, *([f"{mpi_root}/lib"] if mpi_root else [])]
    return _prepend_paths(first, environ.get("LD_LIBRARY_PATH"))


def _habana_runtime(environ: Mapping[str, str]) -> dict[str, str]:
    # The image's own values win: the defaults only cover an environment that lacks them.
    return {k: environ.get(k) or v for k, v in GAUDINIC_DEFAULTS.items()}


def preset_efa(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    out = {
        **_habana_runtime(environ),
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": fabric_ld_library_path(environ),
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "RDMAV_FORK_SAFE": "1",
    }
    if socket_ifname:
        out["HCCL_SOCKET_IFNAME"] = socket_ifname
    return out


def preset_hostnic(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    # Gaudi Direct over verbs also wants MLX5_SCATTER_TO_CQE=0 and fork safety (Habana's host-NIC page);
    # HCL sets both itself when unset, they are written here so that the env file says what runs.
    out = {
        **_habana_runtime(environ),
        "HCCL_OVER_OFI": "1",
        "HCCL_GAUDI_DIRECT": "1",
        "LD_LIBRARY_PATH": fabric_ld_library_path(environ),
        "RDMAV_FORK_SAFE": "1",
        "MLX5_SCATTER_TO_CQE": "0",
    }
    if socket_ifname:
        out["HCCL_SOCKET_IFNAME"] = socket_ifname
    return out


GAUDINIC_DEFAULTS: dict[str, str] = {
    "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
    "HABANA_LOGS": "/var/log/habana_logs/",
    "HABANA_SCAL_BIN_PATH": "/opt/habanalabs/engines_fw",
    "HABANA_PLUGINS_LIB_PATH": "/opt/habanalabs/habana_plugins",
    "DATA_LOADER_AEON_LIB_PATH": "/usr/lib/habanalabs/libaeon.so",
}


def preset_gaudinic(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    out = _habana_runtime(environ)
    if socket_ifname:
        out["HCCL_SOCKET_IFNAME"] = socket_ifname
    return out


def preset_cpu(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    out = {"DS_ACCELERATOR": "cpu"}
    if socket_ifname:
        out["GLOO_SOCKET_IFNAME"] = socket_ifname
    return out


def preset_none(environ: Mapping[str, str], socket_ifname: str | None) -> dict[str, str]:
    return {}


PRESETS: dict[EnvPreset, Callable[[Mapping[str, str], str | None], dict[str, str]]] = {
    EnvPreset.EFA: preset_efa,
    EnvPreset.GAUDINIC: preset_gaudinic,
    EnvPreset.HOSTNIC: preset_hostnic,
    EnvPreset.CPU: preset_cpu,
    EnvPreset.NONE: preset_none,
}


def default_socket_ifname(ifnames: Sequence[str]) -> str | None:
    """First interface that is neither loopback nor a docker bridge, in the given (ifindex) order."""
    for name in ifnames:
        if not name.startswith(("lo", "docker")):
            return name
    return None


def route_ifname(route_json: str, address: str, interfaces: Sequence[Interface]) -> str | None:
    """The interface of `ip -j route get ADDRESS`; for an address of this host (routed through lo),
    the interface that holds it, which is the one the other nodes reach it on."""
    try:
        routes = json.loads(route_json or "[]")
        dev = str(routes[0]["dev"]) if routes else None
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if dev is None or not dev.startswith("lo"):
        return dev
    for interface in interfaces:
        if address in interface.addresses and not interface.name.startswith("lo"):
            return interface.name
    return None


def hccl_socket_ifname(route_dev: str | None, interfaces: Sequence[Interface]) -> str | None:
    """HCCL_SOCKET_IFNAME when none is given: the interface that routes to the master, unless it is
    loopback, has no IPv4 address, or is a Gaudi NIC (bound to habanalabs, whose L3 mode gives it an
    IPv4 address). None leaves HCCL its own choice."""
    if not route_dev or route_dev.startswith("lo"):
        return None
    for interface in interfaces:
        if interface.name == route_dev:
            if interface.driver == HABANA_DRIVER or not interface.addresses:
                return None
            return route_dev
    return None


def wanted_provider(env: Mapping[str, str]) -> str | None:
    """The libfabric provider the ranks' HCCL will need, judged from their variables (None: not OFI)."""
    if env.get("HCCL_OVER_OFI") != "1":
        return None
    if env.get("FI_PROVIDER"):
        return env["FI_PROVIDER"].split(";")[0].split(",")[0]
    if "FI_EFA_USE_DEVICE_RDMA" in env or env.get("HCCL_GAUDI_DIRECT") != "1":
        return "efa"
    return "verbs"
