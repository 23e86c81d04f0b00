"""SQL templates and how each backend's dialect renders them.

Statements are written once, PostgreSQL-flavoured, as templates with one substitution scheme:

- `{name}` is one of the deployment's tables (`TABLES`: `{timestamps}`, `{iceberg_objects}`);
  any other name is an error, never a table that does not exist;
- `{u64:column}` in DDL is the column type of an unsigned 64-bit timestamp;
- `%(name)s` names a parameter; `GREATEST`, `::numeric` and `FOR UPDATE` are allowed.

A module that repeats a piece of SQL in many statements writes it in with `expand` where it
defines them (fencing's `{guard}` and `{row}`: fencing/tables.py `fenced`), so each statement
still reads whole where it is defined and the dialect sees only tables.

Each backend module holds its `Dialect` subclass (store/postgres.py, store/sqlite.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

U64_MAX = 2**64 - 1
_FIELD_RE = re.compile(r"\{(\w+)(?::(\w+))?\}")

# Every table a deployment's schema holds: fencing/tables.py creates the first two,
# catalog/state.py the rest (oracle/provision.py drops them all; tests/test_sql_templates.py
# checks that the lists agree). A new table is added here too.
TABLES = frozenset({"timestamps", "deployment",
                    "iceberg_namespaces", "iceberg_objects", "iceberg_uppers",
                    "iceberg_commits", "iceberg_locations", "iceberg_idempotency"})
# Tables of earlier releases (the Parquet changelog's catalog, replaced by Iceberg): nothing
# creates or reads them any more; deleting a deployment drops them if they are there.
RETIRED_TABLES = frozenset({"table_catalog", "table_commits", "timeline_uppers", "table_tags",
                            "table_since"})


def expand(template: str, fragments: Mapping[str, str]) -> str:
    """`template` with the `fragments` it names (`{name}`) written in; every other field must be
    a table or `{u64:column}`, checked here so that a typo fails where the statement is defined.
    A fragment may hold parameters, not fields."""
    text = _FIELD_RE.sub(lambda m: fragments[m[1]] if m[2] is None and m[1] in fragments
                         else m[0], template)
    substitute(text, table=str, u64=str)  # only to check what is left
    return text


def substitute(template: str, table: Callable[[str], str], u64: Callable[[str], str]) -> str:
    """`template` with its tables and timestamp columns written the way a dialect writes them
    (`table(name)`, `u64(column)`); ValueError names a field that is neither."""
    def field(m: re.Match[str]) -> str:
        name, spec = m[1], m[2]
        if spec is not None:
            if name != "u64":
                raise ValueError(f"unknown SQL template field {{{name}:{spec}}}")
            return u64(spec)
        if name not in TABLES | RETIRED_TABLES:
            raise ValueError(
                f"unknown SQL template field {{{name}}}: neither a table of the schema "
                "(store/dialect.py TABLES) nor a fragment written in where the statement is "
                "defined (dialect.expand)")
        return table(name)

    return _FIELD_RE.sub(field, template)


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
