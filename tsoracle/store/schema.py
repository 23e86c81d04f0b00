"""Idempotent creation of the schema and tables."""

from __future__ import annotations

import logging
import secrets

from tsoracle.errors import OracleUnavailable
from tsoracle.store.backend import Backend
from tsoracle.store.dialect import ADDED_COLUMNS, ORACLE_TABLES, SEED_DEPLOYMENT

log = logging.getLogger(__name__)


async def ensure_schema(backend: Backend, *, implementation: str, fence: str,
                        owner: str = "") -> None:
    """Create what is missing; seed the deployment row only if it does not exist yet."""
    for statement in backend.dialect.ddl():
        # Two processes racing on CREATE ... IF NOT EXISTS can still collide in the catalog;
        # the loser's second attempt finds the object and does nothing.
        for attempt in range(3):
            try:
                await backend.execute_ddl(statement)
                break
            except OracleUnavailable:
                if attempt == 2:
                    raise
    await _migrate(backend)
    await _table_options(backend)
    await backend.fetch(
        SEED_DEPLOYMENT,
        {"implementation": implementation, "fence": fence, "rollout": False,
         "incarnation": new_incarnation(), "owner": owner},
    )


_explained: set[str] = set()  # reasons already logged by this process


def _once(key: str, level: int, message: str, *args: object) -> None:
    if key not in _explained:
        _explained.add(key)
        log.log(level, message, *args)


async def _table_options(backend: Backend) -> None:
    """Set the options a hot table wants on this server; one that is refused (a role without
    the ZONECONFIG privilege, an older version) is skipped: they tune, they do not decide."""
    skipped = backend.dialect.skipped_options()
    if skipped:
        _once(skipped, logging.INFO, skipped)
    for what, statement in backend.dialect.table_options():
        try:
            await backend.execute_ddl(statement)
        except OracleUnavailable as exc:
            # Once per table and option: the operator provisions many schemas in one process.
            _once(f"{backend.url.safe} {statement}", logging.WARNING,
                  "table option %s not set on %s (%s); a database admin can run: %s",
                  what, backend.url.safe, exc, statement)


def new_incarnation() -> str:
    """A name for one provisioning of a schema, so that a drop and re-create is told apart."""
    return secrets.token_hex(8)


async def _migrate(backend: Backend) -> None:
    # Probe first: ALTER TABLE takes the strongest table lock even when it has nothing to do,
    # and the operator provisions on every reconcile.
    try:
        for table in ORACLE_TABLES:
            columns = ", ".join(c for t, c, _ in ADDED_COLUMNS if t == table)
            await backend.fetch(f"SELECT {columns} FROM {{{table}}} WHERE 1 = 0")
        return
    except OracleUnavailable:
        pass
    for statement in backend.dialect.migrations():
        try:
            await backend.execute_ddl(statement)
        except OracleUnavailable:
            log.debug("migration already applied: %s", statement)


async def schema_exists(backend: Backend) -> bool:
    for table in ORACLE_TABLES:
        if not await backend.table_exists(table):
            return False
    return True


async def drop_schema(backend: Backend) -> bool:
    """Remove tsoracle's tables, then the schema if nothing else is in it (deletionPolicy:
    Delete). Returns whether the schema itself was dropped; other objects are never touched."""
    for statement in backend.dialect.drop_ddl():
        await backend.execute_ddl(statement)
    statement = backend.dialect.drop_schema_ddl()
    if statement is None:
        return False
    try:
        await backend.execute_ddl(statement)
    except OracleUnavailable:
        log.info("schema %s still holds other objects; kept", backend.url.schema)
        return False
    return True
