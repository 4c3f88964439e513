"""The hostfile as a value: parsed strictly, built deterministically, rendered for DeepSpeed and mpirun.

DeepSpeed matches `^(\\S+)\\s+slots=(\\d+)` and silently runs locally when the file is missing, so
everything it would accept by accident (user@host, junk after the slots, an absent file) is
refused here, before anything is launched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gaudi_cluster.errors import ConfigError, quoted
from gaudi_cluster.settings.host_names import MAX_SLOTS, host_problem, parse_slots

__all__ = ["MAX_SLOTS", "HostEntry", "Hostfile", "host_problem", "parse_slots"]

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


def _invisible_problem(text: str, source: str) -> None:
    """A BOM or NUL byte (editors and `echo -e` leave them) named where it is, not as a bad host."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        for column, char in enumerate(line, start=1):
            if char in ("\ufeff", "\x00"):
                name = "a UTF-8 byte order mark" if char == "\ufeff" else "a NUL byte"
                raise ConfigError(
                    f"{source}: U+{ord(char):04X} at line {lineno}, column {column} ({name}); "
                    "fix: save the hostfile as plain UTF-8 text without it"
                )


def parse_hostfile(text: str, source: str = "<hostfile>") -> Hostfile:
    _invisible_problem(text, source)
    entries: list[HostEntry] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        host, *tokens = line.split()
        if "=" in host:
            raise ConfigError(
                f"{where}: line starts with {quoted(host)} instead of a host name; fix: {_FIX_LINE}"
            )
        problem = host_problem(host)
        if problem:
            raise ConfigError(f"{where}: {problem}; fix: {_FIX_LINE}")
        slots: int | None = None
        max_slots: int | None = None
        for tok in tokens:
            key, eq, value = tok.partition("=")
            if not eq or key not in ("slots", "max_slots"):
                raise ConfigError(
                    f"{where}: unknown token {quoted(tok)} after host '{host}' (only slots= and "
                    f"max_slots= are understood); fix: {_FIX_LINE}"
                )
            count = parse_slots(value)
            if count is None:
                raise ConfigError(
                    f"{where}: {key}={quoted(value)} for host '{host}' is not a whole number from 1 to "
                    f"{MAX_SLOTS}; fix: write {key}=N with 1 <= N <= {MAX_SLOTS}"
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


def _node_specs(text: str, flag: str) -> dict[str, list[int]]:
    """DeepSpeed's NODE[:SLOT,SLOT...][@NODE...] (slots sorted, duplicates dropped)."""
    specs: dict[str, list[int]] = {}
    for spec in text.split("@"):
        host, _, slots_text = spec.partition(":")
        if not host:
            raise ConfigError(f"{flag} '{text}' has an empty host; fix: write host[:0,1][@host2...]")
        slots: list[int] = []
        for word in filter(None, slots_text.split(",")):
            if not re.fullmatch(r"[0-9]+", word):
                raise ConfigError(f"{flag} '{text}': slot '{word}' is not a number; fix: write host:0,1")
            slots.append(int(word))
        specs[host] = sorted(set(specs.get(host, []) + slots))
    return specs


def active_resources(
    hostfile: Hostfile,
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
) -> dict[str, list[int]]:
    """The slots a DeepSpeed launch uses, host by host in hostfile order, as its runner computes them
    (parse_inclusion_exclusion, then apply_num_nodes_and_gpus)."""
    pool = {e.host: list(range(e.slots)) for e in hostfile.entries}
    flag, text = ("--include", include) if include else ("--exclude", exclude)
    chosen = {host: list(slots) for host, slots in pool.items()} if not include else {}
    for host, slots in (_node_specs(text, flag) if text else {}).items():
        if host not in pool:
            raise ConfigError(
                f"{flag}: host '{host}' is not in the hostfile; fix: use one of {', '.join(pool)}"
            )
        missing = [s for s in slots if s not in pool[host]]
        if missing:
            raise ConfigError(
                f"{flag}: host '{host}' has no slot {missing[0]} (it has {len(pool[host])}); "
                f"fix: use slots 0-{len(pool[host]) - 1}"
            )
        if include:
            chosen[host] = slots or pool[host]
        else:
            chosen[host] = [s for s in chosen[host] if slots and s not in slots]
    active = {host: chosen[host] for host in pool if chosen.get(host)}
    if num_nodes:
        active = dict(list(active.items())[:num_nodes])
    if num_gpus:
        active = {host: list(range(num_gpus)) for host in active}
    if not active:
        raise ConfigError(f"{flag} '{text}' leaves no slot to run on; fix: select at least one")
    return active
