"""The plugin's one printer: each command builds one plain value and prints it with `print_`
in the format `-o` names. json and yaml come from that value, text from the command's own
view of it, so the three never disagree. Messages about the run (progress, warnings) stay off
stdout whenever stdout carries json or yaml."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from tsoracle.output import FORMATS, fields, render, table

__all__ = ["add_output_flag", "fields", "note", "print_", "progress", "render", "table"]

TextView = Callable[[Any], str]


def _format(text: str) -> str:
    """-o's type: a format; an older `--output FILE.zip` gets pointed at -f."""
    if text in FORMATS:
        return text
    hint = "; name the report's zip file with -f/--file" if text.endswith(".zip") else ""
    raise argparse.ArgumentTypeError(f"-o/--output is the format: text, json or yaml{hint}")


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", type=_format, default="text",
                        help="text, json or yaml (default: text)")


def print_(obj: Any, fmt: str, text: TextView | None = None) -> None:
    """Print `obj` as json, yaml, or through `text` for the text format."""
    print(render(obj, fmt, text), flush=True)


def progress(fmt: str) -> TextIO:
    """Where progress lines go: stdout in text, stderr when stdout carries json or yaml."""
    return sys.stdout if fmt == "text" else sys.stderr


def note(message: str) -> None:
    """A warning beside the result, never part of it."""
    print(message, file=sys.stderr)
