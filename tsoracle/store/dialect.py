"""SQL templates and how each backend's dialect renders them.

Statements are written once, PostgreSQL-flavoured, as templates with one substitution scheme:

- `{name}` is a table in the deployment's schema (`{timestamps}`, `{table_catalog}`);
- `{name}` is a named fragment instead when an upper floor defined one (`define_fragment`):
  fencing's `{guard}` and `{row}` are written once and used in every statement on the
  oracle's rows, so each statement reads whole in the module that owns it;
- `{u64:column}` in DDL is the column type of an unsigned 64-bit timestamp;
- `%(name)s` names a parameter; `GREATEST`, `::numeric` and `FOR UPDATE` are allowed.

Each backend module holds its `Dialect` subclass (store/postgres.py, store/sqlite.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

U64_MAX = 2**64 - 1
_FIELD_RE = re.compile(r"\{(\w+)(?::(\w+))?\}")
_FRAGMENTS: dict[str, str] = {}


def define_fragment(name: str, text: str) -> None:
    """Name a piece of SQL that templates use as `{name}` (it may hold parameters, no fields)."""
    if _FRAGMENTS.get(name, text) != text:
        raise ValueError(f"SQL fragment {{{name}}} is defined twice, differently")
    _FRAGMENTS[name] = text


def substitute(template: str, table: Callable[[str], str], u64: Callable[[str], str]) -> str:
    """`template` with its fragments expanded, and its tables and timestamp columns written
    the way a dialect writes them (`table(name)`, `u64(column)`)."""
    def field(m: re.Match[str]) -> str:
        name, spec = m[1], m[2]
        if spec is not None:
            if name != "u64":
                raise ValueError(f"unknown SQL template field {{{name}:{spec}}}")
            return u64(spec)
        return table(name)

    expanded = _FIELD_RE.sub(lambda m: _FRAGMENTS.get(m[1], m[0]) if m[2] is None else m[0],
                             template)
    return _FIELD_RE.sub(field, expanded)


class Dialect:
    name = "abstract"

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def render(self, template: str) -> Any:
        """What the driver runs for `template` in this schema."""
        raise NotImplementedError

    def encode_ts(self, ts: int) -> Any:
        return ts

    def decode_ts(self, value: Any) -> int:
        return int(value)

    def create_schema(self) -> list[Any]:
        """Statements that create the schema itself (none where there are no schemas)."""
        return []

    def drop_schema(self) -> Any | None:
        """A statement that drops the schema if it is empty, or None (no schemas here)."""
        return None

    def add_column(self, table: str, column: str, definition: str) -> Any:
        """A statement adding a column; it may fail only because the column exists."""
        return self.render(f"ALTER TABLE {{{table}}} ADD COLUMN {column} {definition}")

    def lock_rows(self, table: str) -> list[str]:
        """Statements that make writers of `table` wait until this transaction ends, run before
        the transaction reads anything; none where row locks do it (see
        fencing.lock_deployment). SQLite's write transactions already exclude each other."""
        return []

    def hot_table_options(self, table: str) -> list[tuple[str, Any]]:
        """(what it is, statement): options a hot table of a few rows wants on this server."""
        return []

    def skipped_options(self) -> str | None:
        """Why this server gets none of CockroachDB's table options, or None if it gets them."""
        return None
