"""The commands an error's "fix:" prints, and whether the real parsers take them as printed.

A fix names flags the user is to add or change (`fix: --job-root /tmp/gaudi-jobs`), sometimes a whole
command (`fix: see 'gaudi-cluster doctor --help'`, `run gaudi-cluster aws down gaudi again`). Each flag
with its value is fed to the parser of the command the error came from (or the one the fix names): a
flag that command does not take, or a value its setting refuses, is advice that fails as printed.
"""

from __future__ import annotations

import re

from gaudi_cluster import cli
from gaudi_cluster.aws import cli as aws_cli
from gaudi_cluster.compat.translate import spawn_parser
from gaudi_cluster.errors import GaudiClusterError
from gaudi_cluster.settings.config import SETTINGS, parse_setting

# `--flag`, then maybe its value: after = or a space, quoted, or one word (paths and lists included).
FLAG_USE = re.compile(r"(?<![\w/-])(--[a-z][\w-]*)(?:(?:=|[ ]+)('[^']*'|(?:[^\s,;()']|,(?=\S))+))?")
NAMED_COMMAND = re.compile(r"gaudi-cluster (aws \w+|\w+)")
# Words a fix puts after a flag that are prose, not its value ("--tee alone", "raise --spares or ...").
PROSE = frozenset(
    {"or", "and", "alone", "instead", "to", "set", "is", "the", "a", "with", "of", "for", "in", "on"}
    | {"first", "again", "if", "that", "any", "then"}
)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_.]*$|…|\.\.\.|^<|YOUR")
SETTING_OF_FLAG = {flag: s for s in SETTINGS for flag in (s.flag, *s.aliases)}


def fix_of(line: str) -> str:
    return line.partition("fix:")[2]


def flag_uses(fix: str) -> list[tuple[str, str | None]]:
    """(flag, value or None) for every flag the fix names, values unquoted, prose and placeholders
    dropped (a placeholder is a value to fill in, not one to try)."""
    uses = []
    for flag, raw in FLAG_USE.findall(fix):
        value = raw.strip("'").removesuffix(".") or None
        if value is not None and (value in PROSE or value.startswith("-")):
            value = None
        if value is not None and PLACEHOLDER.search(value):
            continue
        uses.append((flag, value))
    return uses


def problems(fix: str, command: str) -> list[str]:
    """Why the fix's flags fail on `command` (master, doctor, status, probe, reap, spawn, aws plan…),
    or on the command the fix itself names; [] when every one parses."""
    named = NAMED_COMMAND.search(fix)
    if named and named.group(1).split()[0] in (*cli._parsers()[1], "spawn", "aws", "profiles"):
        command = named.group(1)
        fix = fix[named.end() :]
    known = (*cli._parsers()[1], "spawn")
    if command == "profiles" or (command not in known and not command.startswith("aws")):
        return []  # the top-level parser's advice is its --help; profiles has its own tool
    found = []
    for flag, value in flag_uses(fix):
        if flag == "--help":  # every command takes it
            continue
        if value is None:  # a flag named without a value ("lower --nodes"): it must exist
            if flag not in _options(command):
                found.append(f"{command} {flag}: no such flag")
            continue
        why = _refused(command, [flag, value])
        if why:
            found.append(f"{command} {flag} {value}: {why}")
    return found


def _options(command: str) -> set[str]:
    if command == "spawn":
        return set(spawn_parser()._option_string_actions)
    if command.startswith("aws"):
        return set(_aws_subparser(command.split()[1:])._option_string_actions)
    return set(cli._parsers()[1][command]._option_string_actions)


def _refused(command: str, words: list[str]) -> str | None:
    """The parser's complaint about `command WORDS`, or None when it takes them."""
    try:
        if command == "spawn":
            spawn_parser("gaudi-cluster spawn").parse_args([*words, "run.py"])
        elif command.startswith("aws"):
            _aws_parse(command.split()[1:], words)
        else:
            parser, _ = cli._parsers()
            extra = ["x"] if command == "hostfile" else []
            _, unknown = parser.parse_known_args([command, *words, *extra])
            if unknown:
                return f"unrecognized {unknown}"
            setting = SETTING_OF_FLAG.get(words[0])
            if setting is not None and command in ("master", "doctor"):
                parse_setting(setting, words[1], words[0])
    except GaudiClusterError as error:
        return str(error)
    return None


AWS_NEEDS = {"plan": ["--nodes", "2"], "up": ["--nodes", "2"], "down": ["gaudi"], "status": ["gaudi"]}


def _aws_subparser(sub: list[str]):
    choices = next(a for a in aws_cli._parser()._actions if a.choices and "plan" in a.choices).choices
    return choices[sub[0] if sub else "plan"]


def _aws_parse(sub: list[str], words: list[str]) -> None:
    name = sub[0] if sub else "plan"
    aws_cli._parser().parse_args([name, *AWS_NEEDS.get(name, []), *words])
