"""The hostfile as a value: parsed strictly, built deterministically, rendered for DeepSpeed and mpirun.

DeepSpeed matches `^(\\S+)\\s+slots=(\\d+)` and silently runs locally when the file is missing, so
everything it would accept by accident (user@host, junk after the slots, an absent file) is
refused here, before anything is launched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.errors import ConfigError

# Hostnames, IPv4 and (unbracketed) IPv6 literals; anything else would be mangled by pdsh -w or
# by the world_info keys DeepSpeed builds from the host column.
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]+")
_FIX_LINE = "write one 'host slots=N' per line"


@dataclass(frozen=True)
class HostEntry:
    host: str
    slots: int


@dataclass(frozen=True)
class Hostfile:
    entries: tuple[HostEntry, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(e.host for e in self.entries)

    @property
    def world_size(self) -> int:
        return sum(e.slots for e in self.entries)


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a hostfile/peer name, or None when it can."""
    if not host:
        return "empty host name"
    if "@" in host:
        return (
            f"'{host}' names an ssh user; the user comes from the ssh config, "
            f"so write only '{host.split('@', 1)[1]}'"
        )
    if not _HOST_RE.fullmatch(host):
        return f"'{host}' is not a valid host name or IP address"
    return None


def _parse_count(value: str) -> int | None:
    # str.isdigit() accepts superscripts that int() rejects, hence the ASCII pattern.
    if not re.fullmatch(r"[0-9]+", value):
        return None
    n = int(value)
    return n if n > 0 else None


def parse_hostfile(text: str, source: str = "<hostfile>") -> Hostfile:
    entries: list[HostEntry] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        host, *tokens = line.split()
        if "=" in host:
            raise ConfigError(f"{where}: line starts with '{host}' instead of a host name; fix: {_FIX_LINE}")
        problem = host_problem(host)
        if problem:
            raise ConfigError(f"{where}: {problem}; fix: {_FIX_LINE}")
        slots: int | None = None
        max_slots: int | None = None
        for tok in tokens:
            key, eq, value = tok.partition("=")
            if not eq or key not in ("slots", "max_slots"):
                raise ConfigError(
                    f"{where}: unknown token '{tok}' after host '{host}' (only slots= and max_slots= "
                    f"are understood); fix: {_FIX_LINE}"
                )
            count = _parse_count(value)
            if count is None:
                raise ConfigError(
                    f"{where}: {key}='{value}' for host '{host}' is not a positive integer; "
                    f"fix: write {key}=N with N >= 1"
                )
            if (key == "slots" and slots is not None) or (key == "max_slots" and max_slots is not None):
                raise ConfigError(f"{where}: {key}= given twice for host '{host}'; fix: keep one")
            if key == "slots":
                slots = count
            else:
                max_slots = count
        if slots is None:
            raise ConfigError(f"{where}: host '{host}' has no slots=N; fix: {_FIX_LINE}")
        if max_slots is not None and max_slots < slots:
            raise ConfigError(
                f"{where}: max_slots={max_slots} is below slots={slots} for host '{host}'; "
                "fix: raise max_slots or lower slots"
            )
        if host in first_line:
            raise ConfigError(
                f"{where}: host '{host}' already listed on line {first_line[host]}; "
                "fix: list each host once with its total slots"
            )
        first_line[host] = lineno
        entries.append(HostEntry(host, slots))
    if not entries:
        raise ConfigError(f"{source}:1: hostfile has no host entries; fix: {_FIX_LINE}")
    return Hostfile(tuple(entries))


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


def make_hostfile(entries: Iterable[HostEntry], master: str | None = None) -> Hostfile:
    """Validated Hostfile with `master` first (pdsh node rank 0 = rank 0), others in given order."""
    items = list(entries)
    seen: set[str] = set()
    for e in items:
        problem = host_problem(e.host)
        if problem:
            raise ConfigError(f"host list: {problem}; fix: use plain host names or IP addresses")
        if isinstance(e.slots, bool) or not isinstance(e.slots, int) or e.slots < 1:
            raise ConfigError(
                f"host list: host '{e.host}' has slots={e.slots!r}; fix: give every host at least 1 slot"
            )
        if e.host in seen:
            raise ConfigError(f"host list: host '{e.host}' appears twice; fix: list each host once")
        seen.add(e.host)
    if not items:
        raise ConfigError("host list is empty; fix: configure at least one peer")
    if master is not None:
        if master not in seen:
            raise ConfigError(
                f"host list: master '{master}' is not among the hosts {', '.join(e.host for e in items)}; "
                "fix: name the master exactly as it appears in the peer list"
            )
        items.sort(key=lambda e: e.host != master)
    return Hostfile(tuple(items))


def render_hostfile(hf: Hostfile) -> str:
    return "".join(f"{e.host} slots={e.slots}\n" for e in hf.entries)


def render_mpi_hosts(hf: Hostfile) -> str:
    return ",".join(f"{e.host}:{e.slots}" for e in hf.entries)
