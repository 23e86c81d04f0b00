"""Creating, upgrading and dropping tables, for whichever floor owns them."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

from tsoracle.errors import OracleUnavailable
from tsoracle.store.backend import Backend

log = logging.getLogger(__name__)


async def create(backend: Backend, templates: Iterable[str], *, schema: bool = True) -> None:
    """Create the schema (unless `schema` is false: PostgreSQL checks the right to create
    schemas even when it exists) and then the tables of `templates` (CREATE … IF NOT EXISTS)."""
    statements = [*(backend.dialect.create_schema() if schema else []),
                  *(backend.dialect.render(t) for t in templates)]
    for statement in statements:
        # Two processes racing on CREATE ... IF NOT EXISTS can still collide in the catalog;
        # the loser's second attempt finds the object and does nothing.
        for attempt in range(3):
            try:
                await backend.execute_ddl(statement)
                break
            except OracleUnavailable:
                if attempt == 2:
                    raise


async def add_columns(backend: Backend, columns: Sequence[tuple[str, str, str]]) -> None:
    """Add the (table, column, definition) columns that tables from older releases lack."""
    # Probe first: ALTER TABLE takes the strongest table lock even when it has nothing to do,
    # and the operator provisions on every reconcile.
    try:
        for table in dict.fromkeys(t for t, _, _ in columns):
            names = ", ".join(c for t, c, _ in columns if t == table)
            await backend.fetch(f"SELECT {names} FROM {{{table}}} WHERE 1 = 0")
        return
    except OracleUnavailable:
        pass
    for table, column, definition in columns:
        try:
            await backend.execute_ddl(backend.dialect.add_column(table, column, definition))
        except OracleUnavailable:
            log.debug("column %s.%s already there", table, column)


_explained: set[str] = set()  # reasons already logged by this process


def _once(key: str, level: int, message: str, *args: object) -> None:
    if key not in _explained:
        _explained.add(key)
        log.log(level, message, *args)


async def tune_hot_table(backend: Backend, table: str) -> None:
    """Set the options a hot table of a few rows wants on this server; one that is refused (a
    role without the ZONECONFIG privilege, an older version) is skipped: they tune, they do
    not decide."""
    skipped = backend.dialect.skipped_options()
    if skipped:
        _once(skipped, logging.INFO, skipped)
    for what, statement in backend.dialect.hot_table_options(table):
        try:
            await backend.execute_ddl(statement)
        except OracleUnavailable as exc:
            # Once per table and option: the operator provisions many schemas in one process.
            # The operator's log must not say where the database is: name what was refused.
            _once(f"{backend.url.safe} {statement}", logging.WARNING,
                  "table option %s not set on table %s of schema %s for role %s (%s); "
                  "provisioning goes on without it; a database admin can run: %s",
                  what, table, backend.url.schema, backend.url.user or "(libpq's default)",
                  _unplaced(backend, str(exc)), statement)


def _unplaced(backend: Backend, text: str) -> str:
    """`text` without the database's location (our errors name it, a driver may too)."""
    text = text.replace(backend.url.safe, "the database")
    for host in sorted(filter(None, backend.url.host.split(",")), key=len, reverse=True):
        text = re.sub(re.escape(host), "<host>", text, flags=re.IGNORECASE)
    return text


async def tables_exist(backend: Backend, tables: Iterable[str]) -> bool:
    for table in tables:
        if not await backend.table_exists(table):
            return False
    return True


async def drop(backend: Backend, tables: Iterable[str]) -> bool:
    """Drop `tables`, then the schema if nothing else is in it. Never CASCADE: a schema may
    hold the user's tables too (a resource may even name `public`). Returns whether the schema
    itself was dropped; other objects are never touched."""
    for table in tables:
        await backend.execute_ddl(backend.dialect.render("DROP TABLE IF EXISTS {" + table + "}"))
    statement = backend.dialect.drop_schema()
    if statement is None:
        return False
    try:
        await backend.execute_ddl(statement)
    except OracleUnavailable:
        log.info("schema %s still holds other objects; kept", backend.url.schema)
        return False
    return True
