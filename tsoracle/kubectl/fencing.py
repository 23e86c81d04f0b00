"""`kubectl tsoracle fencing NAME MODE`: set spec.fencing; the operator applies it."""

from __future__ import annotations

import argparse

from tsoracle.fencing import MODE_ALIASES, MODE_WARNINGS, MODES, parse_mode
from tsoracle.kubectl.api import Api, PluginError
from tsoracle.kubectl.printer import note, print_


def _either(words: list[str]) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}"


_EQUALS = ", ".join(f"{alias} = {mode}" for alias, mode in MODE_ALIASES.items())
HELP = f"set spec.fencing: {_either(list(MODES))}, in any case ({_EQUALS})"


def flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("first", metavar="NAME", help="the resource")
    c.add_argument("second", metavar="MODE",
                   help=f"{_either([*MODES, *MODE_ALIASES])}, in any case (`fencing on|off "
                        "NAME` works too)")


def run(api: Api, args: argparse.Namespace) -> int:
    name, mode = fencing_args(args.first, args.second)
    return fencing(api, name, mode, args.output)


def fencing_args(first: str, second: str) -> tuple[str, str]:
    """(name, mode) from `fencing NAME MODE`, or the older `fencing on|off NAME`."""
    if (mode := parse_mode(second)) is not None:
        return first, mode
    if (mode := parse_mode(first)) is not None:
        return second, mode
    raise PluginError(f"fencing takes a resource and a mode: kubectl tsoracle fencing NAME "
                      f"{'|'.join(MODES)} ({_EQUALS}); got {first!r} and {second!r}")


def fencing(api: Api, name: str, mode: str, output: str) -> int:
    api.get(name)
    api.patch_spec(name, {"fencing": mode})
    print_({"name": name, "namespace": api.namespace, "fencing": mode}, output,
           lambda d: f"{name}: spec.fencing set to {mode}; the operator applies it")
    if mode in MODE_WARNINGS:
        note(MODE_WARNINGS[mode])
    return 0
