"""Runs in the master and the user's machine: what a host name may be, pure. The one rule for the
names a user writes (hostfiles, peer lists: `settings.host_names`) and for the name a node reports of
itself (`node_report`), before either reaches a command line, a log line or a metric label."""

from __future__ import annotations

import re

from gaudi_cluster.wire.fields import shown as quoted

# Hostnames, IPv4 and (unbracketed) IPv6 literals; anything else would be mangled by pdsh -w or
# by the world_info keys DeepSpeed builds from the host column.
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]+")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a hostfile/peer name, or None when it can."""
    if not host:
        return "empty host name"
    if "@" in host:
        return (
            f"{quoted(host)} names an ssh user; the user comes from the ssh config, "
            f"so write only {quoted(host.split('@', 1)[1])}"
        )
    if host.startswith("-"):  # ssh, pdsh and mpirun would read it as an option (-oProxyCommand=...)
        return f"{quoted(host)} starts with '-', which no host name does"
    if not _HOST_RE.fullmatch(host):
        return f"{quoted(host)} is not a valid host name or IP address"
    return None
