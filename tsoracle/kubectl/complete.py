"""Shell completion for `kubectl tsoracle`: commands, flags, flag values and resource names.

kubectl (1.26 and later) completes a plugin's arguments by running `kubectl_complete-tsoracle`
with them, the word being typed last, and reads Cobra's answer: one candidate per line, then
`:DIRECTIVE`. That executable runs `kubectl tsoracle __complete ARGS…`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from tsoracle.fencing import IMPLEMENTATIONS, MODE_ALIASES, MODES, parse_mode

COMMAND = "__complete"
NO_FILES, FILES = 4, 0  # Cobra's ShellCompDirectiveNoFileComp and ShellCompDirectiveDefault
OUTPUTS = ("text", "json", "yaml")
FILE_FLAGS = {"--kubeconfig", "-f", "--file", "--operator-log"}
# The positionals of each command that name a resource, and fencing's mode.
NAME_AT = {"status": 0, "flip": 0, "report": 0, "fencing": 0}
SAME = {"-n": "--namespace", "-o": "--output", "-f": "--file"}  # one key, the later wins
LOOKUP_TIMEOUT_S = 5.0  # a TAB that waits on an unreachable API server gives up by then


def _value_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.nargs != 0 for s in a.option_strings}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def read_words(parser: argparse.ArgumentParser, words: list[str]
               ) -> tuple[str | None, list[str], dict[str, str]]:
    """The command, its positionals and the flags given, from the words before the one being
    typed (never failing: a half-typed line is normal here)."""
    commands = _subparsers(parser)
    takes_value = _value_flags(parser) | {f for c in commands.values() for f in _value_flags(c)}
    command, positionals, flags = None, [], {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and "=" in word:
            flag, value = word.split("=", 1)
            flags[SAME.get(flag, flag)] = value
        elif word in takes_value:
            flags[SAME.get(word, word)] = words[i + 1] if i + 1 < len(words) else ""
            i += 1
        elif word[:2] in SAME and len(word) > 2 and not word.startswith("--"):
            flags[SAME[word[:2]]] = word[2:]  # -nprod, as kubectl takes it
        elif word.startswith("-"):
            flags[word] = ""
        elif command is None and word in commands:
            command = word
        elif command is not None:
            positionals.append(word)
        i += 1
    return command, positionals, flags


def candidates(parser: argparse.ArgumentParser, args: list[str], *,
               names: Callable[[dict[str, str]], list[str]],
               kubeconfig: Callable[[dict[str, str], str], list[str]]) -> tuple[list[str], int]:
    """What may follow `args[:-1]`, starting with `args[-1]`; and Cobra's directive.
    `names(flags)` lists the resources, `kubeconfig(flags, kind)` the kubeconfig's contexts,
    clusters or users: both may touch the cluster and the files, so they come from outside."""
    typed = args[-1] if args else ""
    before = args[:-1]
    command, positionals, flags = read_words(parser, before)
    commands = _subparsers(parser)
    own = commands.get(command, parser) if command else parser
    if before and before[-1] in _value_flags(own) | _value_flags(parser):
        flag = before[-1]
        if flag in FILE_FLAGS:
            return [], FILES
        values: list[str] = {
            "-o": list(OUTPUTS), "--output": list(OUTPUTS), "--to": list(IMPLEMENTATIONS),
        }.get(flag, [])
        if flag in ("--context", "--cluster", "--user"):
            values = kubeconfig(flags, flag.lstrip("-") + "s")
        return [v for v in values if v.startswith(typed)], NO_FILES
    if typed.startswith("-"):
        offered = sorted({s for a in own._actions for s in a.option_strings if s.startswith("--")})
        return [f for f in offered if f.startswith(typed)], NO_FILES
    if command is None:
        return [c for c in commands if c.startswith(typed)], NO_FILES
    values = []
    if len(positionals) == NAME_AT.get(command):
        values = names(flags)
        if command == "fencing":  # `fencing on|off NAME` is accepted too
            values += list(MODE_ALIASES)
    elif command == "fencing" and len(positionals) == 1:
        # `fencing NAME MODE`, or a mode first (`fencing on NAME`): then a name.
        values = names(flags) if parse_mode(positionals[0]) else [*MODES, *MODE_ALIASES]
    return [v for v in values if v.startswith(typed)], NO_FILES


def run(parser: argparse.ArgumentParser, args: list[str]) -> int:
    """Print the candidates as Cobra does; a cluster that cannot be asked offers nothing."""
    from tsoracle.kubectl.api import Api, kubeconfig_entries
    from tsoracle.kubectl.connection import Connection

    def connection(flags: dict[str, str]) -> Connection:
        def given(*spellings: str) -> str | None:
            return next((flags[s] for s in spellings if flags.get(s)), None)
        return Connection(kubeconfig=given("--kubeconfig"), context=given("--context"),
                          cluster=given("--cluster"), user=given("--user"),
                          namespace=given("--namespace"))

    def names(flags: dict[str, str]) -> list[str]:
        api = Api(None, None, connection=connection(flags))
        found: list[dict[str, Any]] = api.list(False, timeout_s=LOOKUP_TIMEOUT_S)
        return [o["metadata"]["name"] for o in found]

    def kubeconfig(flags: dict[str, str], kind: str) -> list[str]:
        return kubeconfig_entries(connection(flags), kind)

    try:
        found, directive = candidates(parser, args, names=names, kubeconfig=kubeconfig)
    except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
        found, directive = [], NO_FILES
    for value in found:
        print(value)
    print(f":{directive}")
    sys.stdout.flush()
    return 0
