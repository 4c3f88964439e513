"""The command-line flags of the settings (ClusterConfig's fields), as argparse sees them."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from gaudi_cluster.settings.config import SETTINGS


def add_config_flags(parser: argparse.ArgumentParser, names: Iterable[str] | None = None) -> None:
    """One flag per setting; flags default to None so that the env layer can tell 'not given'.

    The underscore spelling of a flag is accepted too and left out of --help.
    """
    wanted = None if names is None else set(names)
    for s in SETTINGS:
        if wanted is not None and s.name not in wanted:
            continue
        choices = getattr(s.parse, "choices", None)
        shown = f"; one of {', '.join(choices)}" if choices else ""
        default = "" if s.default in (None, ()) else f"; default {s.default}"
        help_text = f"{s.help}{shown} (env {s.env}{default})"
        if s.switch:
            parser.add_argument(s.flag, dest=s.name, action="store_const", const="1", help=help_text)
        else:
            metavar = "{" + ",".join(choices) + "}" if choices else s.name.upper()
            action = "append" if s.repeatable else "store"
            parser.add_argument(s.flag, dest=s.name, metavar=metavar, action=action, help=help_text)
        for alias in s.aliases:
            kwargs: dict[str, Any] = (
                {"action": "store_const", "const": "1"}
                if s.switch
                else {"action": "append" if s.repeatable else "store"}
            )
            parser.add_argument(alias, dest=s.name, help=argparse.SUPPRESS, **kwargs)
