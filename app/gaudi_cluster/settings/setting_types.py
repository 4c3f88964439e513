"""The value types of settings: how each one is parsed, and what it refuses. Pure.

Every parser takes the raw text (a flag's value or an environment variable) and raises ValueError
with the reason, or SettingError when the fix is more specific than the setting's example.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from gaudi_cluster.env.envfile import (
    LAUNCHER_OWNED,
    check_name,
    is_secret_value,
    split_assignments,
    value_problem,
)
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.host_names import MAX_SLOTS, host_problem, peer_list_problem

# The one set of words that mean yes/no, for every switch read from the environment.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def integer(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError("must be an integer") from None


# Upper bounds, checked when a value is read so that nothing later (range(), a C call, a deadline)
# meets a number it cannot hold: far above any real cluster, far below what would overflow.
MAX_NODES = 100_000
MAX_COUNT = 10_000  # restarts, spares
MAX_SECONDS = 30 * 86400.0


def _at_most(number: int, high: int) -> int:
    if number > high:
        raise ValueError(f"must be at most {high}")
    return number


def _positive(value: str) -> int:
    number = integer(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def positive_int(value: str) -> int:
    return _at_most(_positive(value), MAX_COUNT)


def slot_count(value: str) -> int:
    return _at_most(_positive(value), MAX_SLOTS)


def node_count(value: str) -> int:
    return _at_most(_positive(value), MAX_NODES)


def non_negative_int(value: str) -> int:
    number = integer(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return _at_most(number, MAX_COUNT)


def port(value: str) -> int:
    number = integer(value)
    if not 1 <= number <= 65535:
        raise ValueError("must be a port number between 1 and 65535")
    return number


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError("must be a positive, finite number of seconds")
    if number > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS:.0f} seconds (30 days)")
    return number


def seconds_or_zero(value: str) -> float:
    """A number of seconds where 0 means none (e.g. no wait)."""
    try:
        zero = float(value) == 0
    except ValueError:
        raise ValueError("must be 0 or a number of seconds") from None
    return 0.0 if zero else seconds(value)


def text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def host_name(value: str) -> str:
    """A DNS name or address (--peers-dns), refused at once rather than looked up until the deadline."""
    name = text(value)
    problem = host_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def peer_list(value: str) -> str:
    """host[:slots],... (--peers), checked when read so that its error names the flag or variable set."""
    spec = text(value)
    problem = peer_list_problem(spec)
    if problem:
        raise SettingError(*problem)
    return spec


def node_filter(value: str) -> str:
    """DeepSpeed's NODE[:SLOT,SLOT][@NODE...] (--include, --exclude); the hosts and slots are checked
    against the hostfile once it is known."""
    spec = text(value)
    for part in spec.split("@"):
        host, colon, slots = part.partition(":")
        problem = host_problem(host)
        if problem:
            raise SettingError(problem, "write NODE[:SLOT,SLOT][@NODE...], e.g. worker-2 or worker-2:0,1")
        words = slots.split(",") if colon else []
        if colon and not all(re.fullmatch(r"[0-9]{1,4}", word) for word in words):
            raise SettingError(
                f"the slots of {host!r} must be numbers separated by commas",
                f"write {host}:0,1 (or {host} for the whole node)",
            )
    return spec


class SettingError(ValueError):
    """A bad value whose fix is more specific than the setting's example."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def assignments(value: str) -> tuple[tuple[str, str], ...]:
    """`K=V;K=V` for every rank (explicit, so refused outright when it cannot be delivered)."""
    try:
        pairs = split_assignments([value], "value")
    except ConfigError as error:
        raise SettingError(
            str(error).split("; fix:")[0].removeprefix("value: "), "write NAME=value"
        ) from None
    for name, text in pairs.items():
        if is_secret_value(name, text):
            raise SettingError(
                f"{name} looks like a secret and would be visible on command lines and in logs",
                f"export {name} on the master and pass --env-pass {name} instead",
            )
        if name in LAUNCHER_OWNED:
            raise SettingError(
                f"{name} is set by the launcher for every rank",
                "drop it (--master-addr/--master-port set it)",
            )
        problem = value_problem(text)
        if problem:
            raise SettingError(
                f"the value of {name} {problem}", f"remove those characters from {name}'s value"
            )
    return tuple(pairs.items())


def variable_names(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in value.replace(";", ",").split(",") if n.strip()))
    if not names:
        raise ValueError("names no variable")
    for name in names:
        try:
            check_name(name, "value")
        except ConfigError:
            raise ValueError(f"'{name}' is not a variable name") from None
    return names


def choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    parse.choices = choices  # type: ignore[attr-defined]
    return parse


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(value: str) -> int:
    """Bytes from `64M`, `2G`, `1.5G` or a plain number of bytes (binary units)."""
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        number = float(text[: len(text) - len(unit)] if unit else text)
    except ValueError:
        raise ValueError("must be a size such as 64M, 2G or a number of bytes") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError("must be a size of 0 or more")
    return int(number * _UNITS[unit])
