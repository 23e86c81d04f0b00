"""`kubectl tsoracle fencing NAME MODE`: set spec.fencing; the operator applies it."""

from __future__ import annotations

import argparse

from tsoracle.fencing import MODES
from tsoracle.kubectl.api import Api, PluginError
from tsoracle.kubectl.printer import note, print_

# on/off: the plugin's first spelling, kept for the scripts that use it.
ALIASES = {"on": "Always", "off": "Disabled"}
SPELLINGS = {**{m: m for m in MODES}, **ALIASES}


def _either(words: list[str]) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}"


_EQUALS = ", ".join(f"{alias} = {mode}" for alias, mode in ALIASES.items())
HELP = f"set spec.fencing: {_either(list(MODES))} ({_EQUALS})"
WARNINGS = {
    "Disabled": "warning: with fencing off a superseded legacy leader can serve stale reads "
                "for up to a second (timestamps stay unique)",
    "Rollout": "note: after each flip, processes on the old epoch are fenced only for "
               "spec.rolloutWindowSeconds",
}


def flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("first", metavar="NAME", help="the resource")
    c.add_argument("second", metavar="MODE",
                   help=f"{_either(list(SPELLINGS))} (`fencing on|off NAME` works too)")


def run(api: Api, args: argparse.Namespace) -> int:
    name, mode = fencing_args(args.first, args.second)
    return fencing(api, name, mode, args.output)


def fencing_args(first: str, second: str) -> tuple[str, str]:
    """(name, mode) from `fencing NAME MODE`, or the older `fencing on|off NAME`."""
    if second in SPELLINGS:
        return first, SPELLINGS[second]
    if first in SPELLINGS:
        return second, SPELLINGS[first]
    raise PluginError(f"fencing takes a resource and a mode: kubectl tsoracle fencing NAME "
                      f"{'|'.join(MODES)} ({_EQUALS}); got {first!r} and {second!r}")


def fencing(api: Api, name: str, mode: str, output: str) -> int:
    api.get(name)
    api.patch_spec(name, {"fencing": mode})
    print_({"name": name, "namespace": api.namespace, "fencing": mode}, output,
           lambda d: f"{name}: spec.fencing set to {mode}; the operator applies it")
    if mode in WARNINGS:
        note(WARNINGS[mode])
    return 0
