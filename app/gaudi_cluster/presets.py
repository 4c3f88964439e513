"""The .deepspeed_env presets: what each scale-out path needs on every rank. Pure tables.

Which preset `auto` picks, and how presets, the master's environment and the user's own variables
are merged, is decided in `envfile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


def _prepend_paths(first: Sequence[str], existing: str | None) -> str:
    parts = list(first)
    for p in (existing or "").split(":"):
        if p and p not in parts:
            parts.append(p)
    return ":".join(parts)


def preset_efa(
    environ: Mapping[str, str], socket_ifname: str | None, *, ofi_wrapper_dir: str = "/usr/lib/habanalabs"
) -> dict[str, str]:
    out = {
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": _prepend_paths(
            [ofi_wrapper_dir, "/opt/amazon/openmpi/lib", "/opt/amazon/efa/lib"],
            environ.get("LD_LIBRARY_PATH"),
        ),
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "RDMAV_FORK_SAFE": "1",
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
    # The image's own values win: the defaults only cover an environment that lacks them.
    out = {k: environ.get(k) or v for k, v in GAUDINIC_DEFAULTS.items()}
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


PRESETS: dict[str, Callable[[Mapping[str, str], str | None], dict[str, str]]] = {
    "efa": preset_efa,
    "gaudinic": preset_gaudinic,
    "cpu": preset_cpu,
    "none": preset_none,
}


def default_socket_ifname(ifnames: Sequence[str]) -> str | None:
    """First interface that is neither loopback nor a docker bridge, in the given (ifindex) order."""
    for name in ifnames:
        if not name.startswith(("lo", "docker")):
            return name
    return None
