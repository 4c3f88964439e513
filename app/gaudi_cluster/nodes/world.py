"""This machine as the pure node code sees it: its names, its DNS and the files users name.

Discovery, the hostfile parser and the survey's node finding are pure; this is the one place their
world is real (tests hand them a fake one).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import discovery
from gaudi_cluster.nodes.discovery import LOOPBACK
from gaudi_cluster.nodes.hostfile import Hostfile, parse_hostfile
from gaudi_cluster.wire.node_report import Interface


def read_hostfile(path: str | Path) -> Hostfile:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"hostfile {p} does not exist (DeepSpeed would silently train on this node alone); "
            "fix: pass the path of an existing hostfile"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"hostfile {p} cannot be read ({exc}); fix: make it a readable text file") from None
    return parse_hostfile(text, str(p))


def self_names(local_interfaces: Sequence[Interface]) -> set[str]:
    names = {socket.gethostname(), "localhost", LOOPBACK, "::1"}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    for interface in local_interfaces:
        names.update(interface.addresses)
    return names


# This machine's DNS and files, as discovery reads them.
REAL_WORLD = discovery.World(
    resolve=lambda name: [str(i[4][0]) for i in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)],
    read_text=lambda path: Path(path).read_text(encoding="utf-8"),
    load_hostfile=read_hostfile,
    exists=os.path.exists,
)


def addresses_of(name: str) -> list[str]:
    """What a node's name resolves to here (nothing when it does not)."""
    try:
        return REAL_WORLD.resolve(name)
    except OSError:
        return []
