"""The command-line flags of the settings (ClusterConfig's fields), as argparse sees them."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from gaudi_cluster.settings.config import SETTINGS, Setting, parse_setting

# How --help groups the settings, in this order; every setting is in exactly one group.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("discovery (which nodes)", ("peers", "peers_dns", "hostfile", "nodes", "wait_timeout")),
    ("ssh", ("ssh_port", "ssh_dir")),
    (
        "launch",
        (
            "accelerator",
            "slots",
            "launcher",
            "include",
            "exclude",
            "master_addr",
            "master_port",
            "control_port",
            "skip_doctor",
            "min_free_disk",
            "fabric_check",
            "fabric_timeout",
            "preimport",
            "preimport_keep",
            "dry_run",
            "hold",
            "job_root",
        ),
    ),
    ("environment (of every rank)", ("env_preset", "env", "env_pass", "socket_ifname")),
    (
        "elastic (supervision, restarts, spares)",
        (
            "heartbeat_timeout",
            "start_timeout",
            "stuck_timeout",
            "stop_grace",
            "max_restarts",
            "spares",
            "min_nodes",
            "take_back",
        ),
    ),
    ("observability", ("status_interval", "tee", "metrics_port", "metrics_addr")),
)


def shown_default(value: Any) -> str:
    """A setting's default as a user writes it: sizes in K/M/G, switches off, nothing as a dash."""
    if value is None or value in ((), ""):
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        for unit, shift in (("G", 30), ("M", 20)):
            if value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def help_text(s: Setting) -> str:
    choices = getattr(s.parse, "choices", None)
    shown = f"; one of {', '.join(choices)}" if choices else ""
    default = "" if s.default in (None, (), "") or s.switch else f"; default {shown_default(s.default)}"
    # argparse formats help with %: a literal percent sign must be doubled.
    return f"{s.help}{shown} (env {s.env}{default})".replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, names: Iterable[str] | None = None) -> None:
    """One flag per setting, in the groups of GROUPS; flags default to None so that the env layer
    can tell 'not given'.

    The underscore spelling of a flag is accepted too and left out of --help.
    """
    wanted = None if names is None else set(names)
    by_name = {s.name: s for s in SETTINGS}
    for title, members in GROUPS:
        chosen = [by_name[name] for name in members if wanted is None or name in wanted]
        if not chosen:
            continue
        group = parser.add_argument_group(title)
        for s in chosen:
            _add_flag(group, s)


def _add_flag(group: Any, s: Setting) -> None:
    choices = getattr(s.parse, "choices", None)
    if s.switch:
        const = "0" if s.default is True else "1"
        group.add_argument(s.flag, dest=s.name, action="store_const", const=const, help=help_text(s))
    else:
        metavar = "{" + ",".join(choices) + "}" if choices else s.name.upper()
        action = "append" if s.repeatable else "store"
        group.add_argument(s.flag, dest=s.name, metavar=metavar, action=action, help=help_text(s))
    for alias in s.aliases:
        kwargs: dict[str, Any] = (
            {"action": "store_const", "const": "1"}
            if s.switch
            else {"action": "append" if s.repeatable else "store"}
        )
        group.add_argument(alias, dest=s.name, help=argparse.SUPPRESS, **kwargs)


def resolve_setting(name: str, flag_value: str | None, environ: Mapping[str, str]) -> Any:
    """One setting alone, flag > variable > default (status, reap and probe read only --job-root)."""
    s = next(s for s in SETTINGS if s.name == name)
    if flag_value is not None:
        return parse_setting(s, flag_value, s.flag)
    raw = environ.get(s.env) or None
    return s.default if raw is None else parse_setting(s, raw, s.env)
