"""SQLite backend: the embedded default for one machine.

Several processes may share the file: WAL journaling lets readers run beside the writer, every
write is one atomic statement or a `BEGIN IMMEDIATE` transaction, and `synchronous=FULL`
makes a reserved timestamp survive power loss, not only a crash.

SQLite has only signed 64-bit integers, so a timestamp `t` is stored as `t - 2**63`: order and
`+ 1` are preserved and the whole unsigned range fits. One file holds every schema: the schema
name prefixes the table names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar

from tsoracle.errors import (
    NotInitialized,
    OracleClosed,
    OracleError,
    OracleUnavailable,
    Refused,
)
from tsoracle.store.backend import DEFAULT_POOL_SIZE, Backend, Rows, Tx
from tsoracle.store.dialect import Dialect, substitute
from tsoracle.store.retry import GaveUp, RetryPolicy
from tsoracle.store.url import BackendURL

T = TypeVar("T")
_BUSY_MS = 5000
log = logging.getLogger("tsoracle.store")


_BIAS = 2**63
_PARAM_RE = re.compile(r"%\((\w+)\)s")


class SqliteDialect(Dialect):
    name = "sqlite"

    def render(self, template: str) -> str:
        return _render(template, self.schema)

    def encode_ts(self, ts: int) -> int:
        return ts - _BIAS

    def decode_ts(self, value: Any) -> int:
        return int(value) + _BIAS


@lru_cache(maxsize=1024)
def _render(template: str, schema: str) -> str:
    text = substitute(template,
                      table=lambda name: '"' + f"{schema}_{name}".replace('"', '""') + '"',
                      u64=lambda column: "INTEGER")
    text = _PARAM_RE.sub(r":\1", text)
    text = text.replace("GREATEST(", "MAX(").replace("::numeric", "")
    return text.replace(" FOR UPDATE", "")


class _SqliteTx(Tx):
    def __init__(self, backend: SqliteBackend) -> None:
        self.backend = backend
        self.dialect = backend.dialect

    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        try:
            return await self.backend._call(self.backend._execute, template, params)
        except sqlite3.Error as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            raise refused from None


class SqliteBackend(Backend):
    dialect: SqliteDialect

    def __init__(
        self,
        url: BackendURL,
        *,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[str], None] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,  # one connection whatever the size
        create: bool = False,
    ) -> None:
        super().__init__(url, retry=retry, on_retry=on_retry, pool_size=pool_size, create=create)
        self.dialect = SqliteDialect(self.url.schema)
        # One connection, one thread: sqlite3 objects must not be used from two threads at once.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tsoracle-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def open(self) -> None:
        folder = os.path.dirname(self.url.dsn) or "."
        if not os.path.isdir(folder):
            raise OracleUnavailable(
                f"cannot open {self.url.safe}: folder {folder!r} does not exist; create it first"
            )
        if not self.create and not os.path.exists(self.url.dsn):
            raise NotInitialized(f"there is no oracle database at {self.url.safe}; create it "
                                 "with `tsoracle init`")
        try:
            self._conn = await self._call(self._connect)
        except sqlite3.Error as exc:
            raise OracleUnavailable(f"cannot open {self.url.safe}: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.url.dsn, timeout=_BUSY_MS / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    async def _close_connections(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._call(conn.close)
        self._closed = True
        self._thread.shutdown(wait=False)

    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        async def once() -> Rows:
            async with self._lock:
                return await self._call(self._execute, template, params)

        return await self.retried(once)

    async def transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        async def once() -> T:
            async with self._lock:
                try:
                    await self._call(self._raw, "BEGIN IMMEDIATE")
                    result = await body(_SqliteTx(self))
                    await self._call(self._raw, "COMMIT")
                except BaseException as exc:
                    # A cancelled call's statement still runs on the thread (a BEGIN waiting
                    # for another process's lock gets it later), and a busy COMMIT leaves the
                    # transaction open: either way the connection may be inside a transaction
                    # that every later statement would join, uncommitted. The rollback is
                    # queued before anything else can be. A cancelled call does not wait for
                    # it (that BEGIN may wait for the lock for seconds); a failed one does,
                    # and the retry of a busy COMMIT starts over in a new transaction.
                    ending = self._end_transaction()
                    if ending is not None and isinstance(exc, asyncio.CancelledError):
                        ending.add_done_callback(self._report_failed_rollback)
                    elif ending is not None:
                        await asyncio.shield(ending)  # cancelled meanwhile: still queued
                    raise
                return result

        return await self.retried(once)

    def _end_transaction(self) -> asyncio.Future[None] | None:
        """Queue a rollback of the transaction the connection is in, if any, after every
        statement queued before it (the thread runs them in order)."""
        if self._closed:
            return None  # the connection's close, queued after any statement, rolls back
        return asyncio.get_running_loop().run_in_executor(self._thread, self._roll_back_open)

    def _report_failed_rollback(self, ending: asyncio.Future[None]) -> None:
        # The cancelled caller is gone: nobody else would see this error.
        failed = None if ending.cancelled() else ending.exception()
        if failed is not None:
            log.warning("%s: rolling back the transaction a cancelled call left open failed: "
                        "%s", self.url.safe, failed)

    def _roll_back_open(self) -> None:
        conn = self._conn
        if conn is None or not conn.in_transaction:
            return  # none began (BEGIN gave up), or its COMMIT went through
        try:
            self._raw("ROLLBACK")
        except sqlite3.Error:
            # Never go on inside a transaction: closing the connection ends it, a new one
            # takes its place (unless the backend is being closed meanwhile).
            conn.close()
            if self._conn is conn:
                self._conn = self._connect()

    async def execute_ddl(self, statement: Any) -> None:
        await self.fetch(statement)

    async def table_exists(self, table: str) -> bool:
        rows = await self.fetch(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %(n)s",
            {"n": f"{self.url.schema}_{table}"},
        )
        return bool(rows)

    def _execute(self, template: str, params: Mapping[str, Any] | None) -> Rows:
        conn = self._connection()
        cur = conn.execute(self.dialect.render(template), params or {})
        return cur.fetchall()

    def _raw(self, statement: str) -> None:
        self._connection().execute(statement)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise OracleClosed()
        return self._conn

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:  # say so plainly instead of the executor's RuntimeError
            raise OracleClosed()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, fn, *args)

    def transient_reason(self, exc: BaseException) -> str | None:
        if isinstance(exc, sqlite3.OperationalError):
            text = str(exc)
            if "locked" in text or "busy" in text:
                return "busy"
        return None

    def gave_up(self, exc: GaveUp) -> OracleError:
        return OracleUnavailable(
            f"{self.url.safe} stayed locked for {exc.elapsed:.1f}s ({exc.last}); "
            "another process holds a long write transaction"
        )

    def translate(self, exc: Exception) -> OracleError | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        refused = refusal(exc)
        if refused is not None:
            return refused
        if "no such table" in str(exc):
            return NotInitialized(f"{self.url.safe} is not provisioned; run `tsoracle init`")
        return OracleUnavailable(f"SQLite error in {self.url.safe}: {exc}")


def refusal(exc: BaseException) -> Refused | None:
    """The `Refused` a driver error amounts to (a constraint, a value too large), or None."""
    if isinstance(exc, sqlite3.IntegrityError):
        if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
            return Refused("duplicate", "a key this change adds is taken (by a concurrent "
                           "change)")
        return Refused("invalid", "the database refused the change's data (a constraint)")
    if isinstance(exc, sqlite3.DataError) or "too big" in str(exc):
        return Refused("invalid", "the database refused the change's data (too large)")
    return None


BACKEND = SqliteBackend  # see store/kinds.py
