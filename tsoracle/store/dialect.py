"""SQL dialect differences, all in one place.

Statements are written once, PostgreSQL-flavoured, as templates: `{timestamps}` and
`{deployment}` name tables, `%(name)s` names parameters, `GREATEST`, `::numeric` and
`FOR UPDATE` are allowed. `render` turns a template into what the driver runs.

Timestamps are unsigned 64-bit. PostgreSQL/CockroachDB keep them in NUMERIC(20,0), which
cannot overflow on `+ 1`. SQLite has only signed 64-bit integers, so there a timestamp `t` is
stored as `t - 2**63`: order and `+ 1` are preserved and the whole unsigned range fits.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

from psycopg import sql

U64_MAX = 2**64 - 1
_BIAS = 2**63
ORACLE_TABLES = ("timestamps", "deployment")
# Spark tables' catalog
CATALOG_TABLES = ("table_catalog", "table_commits", "timeline_uppers", "table_tags",
                  "table_since")
TABLES = ORACLE_TABLES + CATALOG_TABLES


class Dialect:
    name = "abstract"
    ts_type = "NUMERIC(20, 0)"  # column type of an unsigned 64-bit timestamp

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def render(self, template: str) -> Any:
        raise NotImplementedError

    def encode_ts(self, ts: int) -> Any:
        return ts

    def decode_ts(self, value: Any) -> int:
        return int(value)

    def ddl(self) -> list[Any]:
        raise NotImplementedError

    def drop_ddl(self) -> list[Any]:
        """Statements that remove tsoracle's own tables (nothing else, and no CASCADE)."""
        return [self.render("DROP TABLE IF EXISTS {" + t + "}") for t in TABLES]

    def drop_schema_ddl(self) -> Any | None:
        """A statement that drops the schema if it is empty, or None (no schemas here)."""
        return None

    def lock_rows(self, table: str) -> list[str]:
        """Statements that make writers of `table` wait until this transaction ends, run before
        the transaction reads anything; none where row locks do it (see
        fencing.lock_deployment). SQLite's write transactions already exclude each other."""
        return []

    def table_options(self) -> list[tuple[str, Any]]:
        """(what it is, statement): options a hot single-row table wants on this server."""
        return []

    def skipped_options(self) -> str | None:
        """Why this server gets none of CockroachDB's table options, or None if it gets them."""
        return None

    def migrations(self) -> list[Any]:
        """Statements that bring tables from older releases up to date; each may fail only
        because it was already applied (SQLite has no ADD COLUMN IF NOT EXISTS)."""
        return [self.render(f"ALTER TABLE {{{t}}} ADD COLUMN {c} {ty}")
                for t, c, ty in ADDED_COLUMNS]


_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS {deployment} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    implementation TEXT NOT NULL CHECK (implementation IN ('legacy', 'distributed')),
    fence TEXT NOT NULL CHECK (fence IN ('Always', 'Rollout', 'Disabled')),
    rollout BOOLEAN NOT NULL,
    incarnation TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    generation BIGINT NOT NULL DEFAULT 0
)
"""
_STATE_DDL = """
CREATE TABLE IF NOT EXISTS {timestamps} (
    timeline TEXT NOT NULL,
    implementation TEXT NOT NULL CHECK (implementation IN ('legacy', 'distributed')),
    read_ts TSTYPE NOT NULL,
    write_ts TSTYPE NOT NULL,
    leader_epoch BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    active BOOLEAN NOT NULL,
    fence TEXT NOT NULL,
    rollout BOOLEAN NOT NULL,
    incarnation TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (timeline, implementation)
)
"""
SEED_DEPLOYMENT = """
INSERT INTO {deployment} (id, epoch, implementation, fence, rollout, incarnation, owner)
VALUES (1, 1, %(implementation)s, %(fence)s, %(rollout)s, %(incarnation)s, %(owner)s)
ON CONFLICT (id) DO NOTHING
"""
# Columns added after the first release, with what older rows get: the empty incarnation (their
# clients keep working; a later drop and re-provision still gets a fresh one), no owner (the
# first operator resource to reconcile adopts it), generation 0.
ADDED_COLUMNS = (
    ("deployment", "incarnation", "TEXT NOT NULL DEFAULT ''"),
    ("deployment", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("deployment", "generation", "BIGINT NOT NULL DEFAULT 0"),
    ("timestamps", "incarnation", "TEXT NOT NULL DEFAULT ''"),
)


COCKROACH_GC_TTL_S = 600
# How long a deployment change waits for its table lock before it backs off and tries again.
LOCK_WAIT_MS = 200


def is_cockroach(version: str) -> bool:
    """Whether `SELECT version()` came from CockroachDB (it speaks PostgreSQL's protocol)."""
    return version.startswith("CockroachDB") or " CockroachDB " in f" {version} "


class PostgresDialect(Dialect):
    """PostgreSQL and CockroachDB share this shape; `cockroach` toggles the extras."""

    name = "postgresql"

    def __init__(self, schema: str, cockroach: bool = False) -> None:
        super().__init__(schema)
        self.cockroach = cockroach

    def render(self, template: str) -> str:
        return _pg_render(template, self.schema)

    def decode_ts(self, value: Any) -> int:
        return int(value) if not isinstance(value, Decimal) else int(value.to_integral_value())

    def ddl(self) -> list[Any]:
        ts_type = f"NUMERIC(20, 0) CHECK (VALUE_COL >= 0 AND VALUE_COL <= {U64_MAX})"
        state = _STATE_DDL.replace(
            "read_ts TSTYPE", "read_ts " + ts_type.replace("VALUE_COL", "read_ts")
        ).replace("write_ts TSTYPE", "write_ts " + ts_type.replace("VALUE_COL", "write_ts"))
        return [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            .as_string(None),
            self.render(_TABLE_DDL),
            self.render(state),
        ]

    def drop_ddl(self) -> list[Any]:
        # tsoracle's own tables only, never CASCADE: a schema may hold the user's tables too
        # (a resource may even name `public`). The schema itself goes in drop_schema_ddl.
        return super().drop_ddl()

    def drop_schema_ddl(self) -> Any | None:
        """Drop the schema if nothing is left in it (PostgreSQL refuses otherwise)."""
        if self.schema == "public":
            return None  # a database's default schema is never ours to drop
        return sql.SQL("DROP SCHEMA IF EXISTS {}").format(
            sql.Identifier(self.schema)).as_string(None)

    def lock_rows(self, table: str) -> list[str]:
        # SHARE ROW EXCLUSIVE waits for and blocks writers (and other lockers like us), not
        # plain readers. It also waits for VACUUM and ANALYZE, and writers queue behind a
        # waiting lock: the short lock_timeout gives up (55P03, retried with backoff) rather
        # than stall every writer behind a long maintenance run. CockroachDB has no LOCK
        # TABLE: its first-statement retry covers it.
        if self.cockroach:
            return []
        return [f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'",
                "LOCK TABLE {" + table + "} IN SHARE ROW EXCLUSIVE MODE"]

    def migrations(self) -> list[Any]:
        return [self.render(f"ALTER TABLE {{{t}}} ADD COLUMN IF NOT EXISTS {c} {ty}")
                for t, c, ty in ADDED_COLUMNS]

    def table_options(self) -> list[tuple[str, Any]]:
        if not self.cockroach:
            return []
        # Every timestamp leaves an MVCC version of its row behind on CockroachDB until GC: a
        # short TTL keeps reads of the hot rows from scanning a day of them (the default is
        # 4 h or 25 h by version). Automatic statistics on a table of a few rows only add
        # background scans that contend with the writers.
        return [
            (f"zone gc.ttlseconds = {COCKROACH_GC_TTL_S}",
             self.render("ALTER TABLE {timestamps} CONFIGURE ZONE USING gc.ttlseconds = "
                         f"{COCKROACH_GC_TTL_S}")),
            ("sql_stats_automatic_collection_enabled = false",
             self.render("ALTER TABLE {timestamps} SET"
                         " (sql_stats_automatic_collection_enabled = false)")),
        ]

    def skipped_options(self) -> str | None:
        if self.cockroach:
            return None
        return ("the server is PostgreSQL, which has no zone configurations or per-table "
                "automatic statistics switch; CockroachDB's table options "
                f"(gc.ttlseconds = {COCKROACH_GC_TTL_S}, automatic statistics off) are skipped")


@lru_cache(maxsize=512)
def _pg_render(template: str, schema: str) -> str:
    # Identifiers are quoted by psycopg.sql; the result is kept as text because psycopg caches
    # the parsing of text queries but re-composes a Composed object on every execute.
    composed = sql.SQL(template).format(**{t: sql.Identifier(schema, t) for t in TABLES})  # type: ignore[arg-type]
    return composed.as_string(None)


_PARAM_RE = re.compile(r"%\((\w+)\)s")


class SqliteDialect(Dialect):
    """One file, no schemas: the schema name prefixes the table names instead."""

    name = "sqlite"
    ts_type = "INTEGER"  # biased by 2**63, see the module docstring

    def render(self, template: str) -> str:
        return _sqlite_render(template, self.schema)

    def encode_ts(self, ts: int) -> int:
        return ts - _BIAS

    def decode_ts(self, value: Any) -> int:
        return int(value) + _BIAS

    def ddl(self) -> list[Any]:
        return [
            self.render(_TABLE_DDL),
            self.render(_STATE_DDL.replace("TSTYPE", "INTEGER")),
        ]


@lru_cache(maxsize=512)
def _sqlite_render(template: str, schema: str) -> str:
    names = {t: '"' + f"{schema}_{t}".replace('"', '""') + '"' for t in TABLES}
    text = template.format(**names)
    text = _PARAM_RE.sub(r":\1", text)
    text = text.replace("GREATEST(", "MAX(").replace("::numeric", "")
    return text.replace(" FOR UPDATE", "")
