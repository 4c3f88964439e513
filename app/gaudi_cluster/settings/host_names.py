"""What a host name and a slot count may be, for hostfiles, peer lists and the settings that name
nodes (--peers, --peers-dns, --include, --exclude), so that each is refused when it is read (the
host name rule itself is `wire.host_name`'s: a node's own report is checked with it too). Pure."""

from __future__ import annotations

import re

from gaudi_cluster.errors import quoted
from gaudi_cluster.wire.host_name import host_problem

__all__ = ["MAX_SLOTS", "host_problem", "parse_slots", "peer_list_problem"]

# Ranks on one node: far above any server's devices, far below what range() or a C int overflows on.
MAX_SLOTS = 1024


def parse_slots(value: str) -> int | None:
    """A slot count from 1 to MAX_SLOTS, else None."""
    # str.isdigit() accepts superscripts that int() rejects, hence the ASCII pattern (and its length
    # bound, which keeps int() from a 5,000-digit number).
    if not re.fullmatch(r"[0-9]{1,6}", value):
        return None
    n = int(value)
    return n if 0 < n <= MAX_SLOTS else None


def peer_list_problem(spec: str) -> tuple[str, str] | None:
    """(why, fix) when `spec` is not host[:slots],... ([v6addr]:N and bare IPv6 too), else None;
    nodes.discovery reads the list itself, with the same rules."""
    fix = "write host or host:N, separated by commas"
    for token in filter(None, re.split(r"[\s,]+", spec)):
        host, slots = token, None
        if token.startswith("["):
            m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", token)
            if not m:
                return f"{quoted(token)} has an unclosed '['", "write [ipv6]:N"
            host, slots = m.group(1), m.group(2)
        elif token.count(":") == 1:
            host, slots = token.split(":")
        problem = host_problem(host)
        if problem:
            return problem, fix
        if slots is not None and parse_slots(slots) is None:
            return (
                f"{quoted(token)} has slots {quoted(slots)}, not a whole number from 1 to {MAX_SLOTS}",
                f"write host or host:N with 1 <= N <= {MAX_SLOTS}",
            )
    return None
