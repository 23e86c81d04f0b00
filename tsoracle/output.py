"""One output layer for `tsoracle` and `kubectl tsoracle`: `-o text|json|yaml` and aligned tables.

Every command builds one plain value (dicts, lists, numbers, strings) and hands it to `emit`
with a function that renders it as text; json and yaml come from the same value, so the three
formats never disagree. Neutral: no floor of tsoracle and nothing of Kubernetes is imported here,
so the core command keeps working without extras.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("text", "json", "yaml")


def plain(value: Any) -> Any:
    """Dataclasses, tuples and mappings as plain dicts and lists (what json and yaml accept)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: int = 0) -> str:
    """Columns aligned on the widest cell, two spaces apart; None shows as `-`."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    pad = " " * indent
    return "\n".join(pad + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def fields(pairs: Sequence[tuple[str, Any]], indent: int = 0) -> str:
    """`name  value` lines with the values aligned (a resource's summary)."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{' ' * indent}{k.ljust(width)}  {'-' if v is None else v}".rstrip()
                     for k, v in pairs)


def render(data: Any, fmt: str, text: Callable[[Any], str] | None = None) -> str:
    """`data` in format `fmt`; `text` renders the text format (default: yaml-like)."""
    value = plain(data)
    if fmt == "json":
        return json.dumps(value, indent=2)
    if fmt == "yaml" or text is None:
        return yaml.safe_dump(value, sort_keys=False, default_flow_style=False,
                              allow_unicode=True).rstrip("\n")
    if fmt != "text":
        raise ValueError(f"unknown output format {fmt!r}")
    return text(value)


def emit(data: Any, fmt: str, text: Callable[[Any], str] | None = None,
         file: TextIO | None = None) -> None:
    """Print `data` in format `fmt` (see `render`)."""
    print(render(data, fmt, text), file=file or sys.stdout, flush=True)


def add_output_flag(parser: argparse.ArgumentParser, *, json_alias: bool = False,
                    help_text: str = "output format") -> None:
    """`-o text|json|yaml`, and `--json` as a shorter `-o json` where older scripts use it."""
    parser.add_argument("-o", "--output", choices=FORMATS, default="text", help=help_text)
    if json_alias:
        parser.add_argument("--json", action="store_const", const="json", dest="output",
                            help="same as -o json")
