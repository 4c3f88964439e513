"""What a Slurm job step tells a node: its hosts, its size, this node's place, a port. Pure.

Host lists are expanded exactly as Slurm 22.05's src/common/hostlist.c does (what `scontrol show
hostnames` prints), quirks included, so that the master and `srun` agree on every node list Slurm can
hand out: tokens separated by comma, space or tab; `prefix[ranges]` with ranges `a`, `a-b`, comma
separated, zero padded to the width of the low bound as written; several brackets in one name
expand with the last bracket varying fastest, then the one before it, and so on (the order of
Slurm's recursion); text after the last `]` is an error; backwards ranges, negative bounds and
ranges of more than 65536 hosts are errors. The one deliberate difference: a range whose size
wraps around 2**64 in C (`n[0-18446744073709551615]`) is refused here instead of expanding forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gaudi_cluster.errors import ConfigError

SEPARATORS = "\t, "
# hostlist.c's limits (MAX_RANGE, MAX_RANGES, and MAX_PREFIX_CNT from hostlist.h), all 64 * 1024
# hosts except the number of ranges inside one bracket.
MAX_RANGE = 64 * 1024
MAX_RANGES = 256 * 1024
MAX_PREFIX_CNT = 64 * 1024
ULONG_MAX = 2**64 - 1

# Where the step's node list and size live, most specific first: srun sets the step's, the batch
# script only sees the job's (SLURM_NODELIST and SLURM_NNODES are the older names of the job's).
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
NODE_COUNT_VARIABLES = {
    "SLURM_STEP_NODELIST": ("SLURM_STEP_NUM_NODES",),
    "SLURM_JOB_NODELIST": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "SLURM_NODELIST": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
}

# The rendezvous port of a job: enroot's PyTorch hook (pyxis) uses 61000 + job id % 4536, i.e. the
# ports 61000-65535 just above Linux's default ephemeral range (32768-60999), so no outgoing
# connection holds it. Two jobs sharing a node get different ports unless their ids differ by a
# multiple of 4536, and a site that runs enroot's hook already keeps that range free. Our other
# fixed ports (ssh 3022, control 29400) lie outside the range.
MASTER_PORT_BASE = 61000
MASTER_PORT_SPAN = 65536 - MASTER_PORT_BASE


class HostlistError(ValueError):
    """A host list Slurm would refuse; the message says which part."""


@dataclass(frozen=True)
class _Range:
    lo: int
    hi: int
    width: int


def _strtoul(text: str) -> tuple[int, int]:
    """C strtoul(text, &end, 10): (value, characters consumed); (0, 0) when no digits were found."""
    match = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", text)
    if not match:
        return 0, 0
    value = min(int(match.group(2)), ULONG_MAX)
    if match.group(1) == "-" and value:
        value = ULONG_MAX + 1 - value
    return value, match.end()


def _parse_single_range(text: str) -> _Range:
    """One `lo`, `lo-hi` or `lo-` of a bracket, as _parse_single_range() reads it."""
    if "x" in text:  # multi-dimensional box syntax, refused on ordinary clusters
        raise HostlistError(f"invalid range '{text}'")
    low_text, dash, high_text = text.partition("-")
    if dash and high_text.startswith("-"):
        raise HostlistError(f"invalid range '{text}' (negative bound)")
    low, low_end = _strtoul(low_text)
    if low_end == 0:
        raise HostlistError(f"invalid range '{text}'")
    if dash and high_text:
        # Slurm checks only the upper bound for trailing characters ("1a-3" passes, "1-3a" does not).
        high, high_end = _strtoul(high_text)
        if high_end == 0 or high_end != len(high_text):
            raise HostlistError(f"invalid range '{text}'")
    else:
        high = low
        if low_end != len(low_text):
            raise HostlistError(f"invalid range '{text}'")
    if low > high:
        raise HostlistError(f"range '{text}' runs backwards")
    count = (high - low + 1) % (ULONG_MAX + 1)
    if count == 0 or count > MAX_RANGE:
        raise HostlistError(f"range '{text}' has more than {MAX_RANGE} hosts")
    return _Range(low, high, len(low_text))


def _parse_range_list(text: str) -> list[_Range]:
    pieces = text.split(",")
    if len(pieces) > MAX_RANGES:
        raise HostlistError(f"more than {MAX_RANGES} ranges in one bracket")
    return [_parse_single_range(piece) for piece in pieces]


def _is_count(value: str) -> bool:
    return re.fullmatch(r"[0-9]+", value) is not None


def _number(value: int, width: int) -> str:
    return str(value).zfill(width)


def _plain_host(name: str) -> str:
    """A name without brackets as Slurm stores it: its numeric suffix re-printed at the same width."""
    digits = re.search(r"[0-9]+$", name)
    if not digits:
        return name
    return name[: digits.start()] + _number(min(int(digits.group()), ULONG_MAX), len(digits.group()))


def _push_ranges(out: list[str], prefix: str, ranges: list[_Range]) -> bool:
    """_push_range_list(): expand the last bracket left in `prefix`, recursing for earlier ones.

    False is Slurm's -1 (a bad bracket in the prefix). As in hostlist.c, a failure below the first
    level of recursion is dropped (MAX(rc, rc1) with rc = 0), so a bad third-from-last bracket only
    loses its hosts.
    """
    open_at = prefix.rfind("[")
    close_at = prefix.rfind("]", open_at + 1) if open_at != -1 else -1
    if open_at == -1 or close_at == -1:
        for r in ranges:
            out.extend(prefix + _number(n, r.width) for n in range(r.lo, r.hi + 1))
        return True
    head, body, tail = prefix[:open_at], prefix[open_at + 1 : close_at], prefix[close_at + 1 :]
    recurse = "[" in head
    try:
        prefix_ranges = _parse_range_list(body)
    except HostlistError:
        return False
    hosts_in_prefix = 0
    for r in prefix_ranges:
        hosts_in_prefix += r.hi - r.lo + 1
        if hosts_in_prefix > MAX_PREFIX_CNT:
            return False
        for n in range(r.lo, r.hi + 1):
            new_prefix = head + _number(n, r.width) + tail
            if recurse:
                _push_ranges(out, new_prefix, ranges)
            else:
                for inner in ranges:
                    out.extend(new_prefix + _number(m, inner.width) for m in range(inner.lo, inner.hi + 1))
    return True


def _tokens(text: str) -> list[str]:
    """_next_tok(): split on separators, except inside a bracket pair that spans one."""
    tokens: list[str] = []
    pos, size = 0, len(text)
    while True:
        while pos < size and text[pos] in SEPARATORS:
            pos += 1
        if pos >= size:
            return tokens
        start = parse = pos
        while True:
            while pos < size and text[pos] not in SEPARATORS:
                pos += 1
            moved = False
            while True:
                open_at = text.find("[", parse)
                if open_at == -1 or open_at > pos:
                    break
                close_at = text.find("]", parse)
                if close_at == -1 or close_at < open_at:
                    break
                if close_at < pos:
                    parse = close_at + 1
                    continue
                pos, moved = close_at, True
                break
            if not moved:
                break
        tokens.append(text[start:pos])


def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm host list, in Slurm's order, duplicates kept; HostlistError if invalid."""
    hosts: list[str] = []
    for token in _tokens(text):
        open_at = token.rfind("[")
        if open_at == -1:
            hosts.append(_plain_host(token))
            continue
        prefix, rest = token[:open_at], token[open_at + 1 :]
        close_at = rest.find("]")
        if close_at == -1:
            # hostlist.c keeps such a token as one odd host name rather than refusing it.
            hosts.append(_plain_host(prefix + "]" if prefix else rest))
            continue
        after = rest[close_at + 1 :]
        if after and not after.startswith(","):
            raise HostlistError(f"'{after}' follows the last ']' in '{token}'")
        ranges = _parse_range_list(rest[:close_at])
        if not _push_ranges(hosts, prefix, ranges):
            raise HostlistError(f"invalid bracket before the last one in '{token}'")
    return hosts


# --- the job step's environment ------------------------------------------------------------------


def in_slurm_step(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in NODELIST_VARIABLES)


def nodelist_variable(env: Mapping[str, str]) -> str | None:
    return next((name for name in NODELIST_VARIABLES if env.get(name)), None)


def step_hosts(env: Mapping[str, str]) -> list[str]:
    """The step's hosts (else the job's), checked against the node count Slurm gives with them."""
    variable = nodelist_variable(env)
    if variable is None:
        raise ConfigError(
            "no Slurm node list (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST); "
            "fix: start the node with srun inside an allocation (slurm/gaudi-cluster.sbatch)"
        )
    value = env[variable]
    try:
        hosts = expand_hostlist(value)
    except HostlistError as error:
        raise ConfigError(
            f"{variable}='{value}' is not a Slurm host list: {error}; fix: pass Slurm's value unchanged"
        ) from None
    if not hosts:
        raise ConfigError(f"{variable}='{value}' names no host; fix: pass Slurm's value unchanged")
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise ConfigError(
            f"{variable}='{value}' lists {', '.join(duplicates)} twice; fix: pass Slurm's value unchanged"
        )
    for count_variable in NODE_COUNT_VARIABLES[variable]:
        stated = env.get(count_variable, "").strip()
        if not stated:
            continue
        if not _is_count(stated) or int(stated) != len(hosts):
            raise ConfigError(
                f"{variable}='{value}' has {len(hosts)} hosts but {count_variable}={stated}; "
                "fix: pass both from the same Slurm step (srun exports them together)"
            )
        break
    return hosts


def first_host(env: Mapping[str, str]) -> str:
    """The step's first node: where the master runs (SLURM_NODEID 0)."""
    return step_hosts(env)[0]


def node_id(env: Mapping[str, str]) -> int | None:
    """This node's index in the step (SLURM_NODEID), None outside a task."""
    value = env.get("SLURM_NODEID", "").strip()
    if not value:
        return None
    if not _is_count(value):
        raise ConfigError(f"SLURM_NODEID='{value}' is not a node index; fix: pass Slurm's value unchanged")
    return int(value)


def job_id(env: Mapping[str, str]) -> int | None:
    value = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    if not value:
        return None
    if not _is_count(value):
        raise ConfigError(f"SLURM_JOB_ID='{value}' is not a job id; fix: pass Slurm's value unchanged")
    return int(value)


def master_port(env: Mapping[str, str]) -> int | None:
    """The job's rendezvous port (see MASTER_PORT_BASE), None outside Slurm."""
    job = job_id(env)
    return None if job is None else MASTER_PORT_BASE + job % MASTER_PORT_SPAN


def run_key(env: Mapping[str, str]) -> str | None:
    """`<job>.<step>`: names this run's files on a node that outlives it (a Slurm node container)."""
    job = job_id(env)
    if job is None:
        return None
    step = env.get("SLURM_STEP_ID", "").strip() or env.get("SLURM_STEPID", "").strip() or "0"
    if not _is_count(step):
        raise ConfigError(f"SLURM_STEP_ID='{step}' is not a step id; fix: pass Slurm's value unchanged")
    return f"{job}.{int(step)}"


def gpus_on_node(env: Mapping[str, str]) -> int | None:
    """SLURM_GPUS_ON_NODE: the step's GRES gpu on this node (Habana documents Gaudi as GRES gpu)."""
    value = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if not value:
        return None
    if not _is_count(value):
        raise ConfigError(f"SLURM_GPUS_ON_NODE='{value}' is not a count; fix: pass Slurm's value unchanged")
    return int(value)
