"""PostgreSQL / CockroachDB backend: psycopg 3 async, a connection pool, prepared statements."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from functools import cached_property, lru_cache
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pgerr
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from tsoracle.errors import (
    Contended,
    NotInitialized,
    OracleClosed,
    OracleError,
    OracleUnavailable,
    Refused,
)
from tsoracle.store.backend import Backend, Pinned, Rows, Statement, Tx
from tsoracle.store.dialect import U64_MAX, Dialect, substitute
from tsoracle.store.retry import GaveUp, RetryPolicy, retrying

T = TypeVar("T")
COCKROACH_GC_TTL_S = 600
CONNECT_TIMEOUT_S = 5.0  # unless the URL sets connect_timeout
# How long a deployment change waits for its table lock before it backs off and tries again.
LOCK_WAIT_MS = 200
# Seconds of network silence after which a connection counts as lost (see _network_options).
NETWORK_TIMEOUT_S = 10
# psycopg_pool doubles the delay between reconnect attempts without a cap (1, 2, 4, 8, 16 s
# ...), so a server back after an outage, or a run of failed attempts under lost replies,
# could leave every caller waiting many seconds more. Ending each chain of attempts after
# RECONNECT_S, and having waiting callers ask again every POOL_WAIT_S (each ask starts a new
# chain at once), keeps the gap between attempts near a second or two. The caller's retry
# budget still bounds the whole wait.
RECONNECT_S = 2.0
POOL_WAIT_S = 2.0
# Seconds a transaction may sit idle before the server ends its session (see _configure).
IDLE_IN_TRANSACTION_S = NETWORK_TIMEOUT_S


def is_cockroach(version: str) -> bool:
    """Whether `SELECT version()` came from CockroachDB (it speaks PostgreSQL's protocol)."""
    return version.startswith("CockroachDB") or " CockroachDB " in f" {version} "


class PostgresDialect(Dialect):
    """PostgreSQL and CockroachDB share this shape; `cockroach` toggles the differences.

    Timestamps are NUMERIC(20, 0), which cannot overflow on `+ 1`; a CHECK keeps them within
    the unsigned 64-bit range.
    """

    name = "postgresql"

    def __init__(self, schema: str, cockroach: bool = False) -> None:
        super().__init__(schema)
        self.cockroach = cockroach

    def render(self, template: str) -> str:
        return _render(template, self.schema)

    def decode_ts(self, value: Any) -> int:
        return int(value) if not isinstance(value, Decimal) else int(value.to_integral_value())

    def create_schema(self) -> list[Any]:
        return [sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                .as_string(None)]

    def drop_schema(self) -> Any | None:
        """Drop the schema if nothing is left in it (PostgreSQL refuses otherwise)."""
        if self.schema == "public":
            return None  # a database's default schema is never ours to drop
        return sql.SQL("DROP SCHEMA IF EXISTS {}").format(
            sql.Identifier(self.schema)).as_string(None)

    def add_column(self, table: str, column: str, definition: str) -> Any:
        return self.render(f"ALTER TABLE {{{table}}} ADD COLUMN IF NOT EXISTS {column} "
                           f"{definition}")

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

    def hot_table_options(self, table: str) -> list[tuple[str, Any]]:
        if not self.cockroach:
            return []
        # Every write leaves an MVCC version of its row behind on CockroachDB until GC: a
        # short TTL keeps reads of a hot row from stepping over hours of them. Automatic
        # statistics on a table of a few rows only add background scans of the hot rows.
        return [
            (f"zone gc.ttlseconds = {COCKROACH_GC_TTL_S}",
             self.render(f"ALTER TABLE {{{table}}} CONFIGURE ZONE USING gc.ttlseconds = "
                         f"{COCKROACH_GC_TTL_S}")),
            ("sql_stats_automatic_collection_enabled = false",
             self.render(f"ALTER TABLE {{{table}}} SET"
                         " (sql_stats_automatic_collection_enabled = false)")),
        ]

    def skipped_options(self) -> str | None:
        if self.cockroach:
            return None
        return ("the server is PostgreSQL, which has no zone configurations or per-table "
                "automatic statistics switch; CockroachDB's table options "
                f"(gc.ttlseconds = {COCKROACH_GC_TTL_S}, automatic statistics off) are skipped")


@lru_cache(maxsize=1024)
def _render(template: str, schema: str) -> str:
    # Identifiers are quoted by psycopg.sql; the result is kept as text because psycopg caches
    # the parsing of text queries but re-composes a Composed object on every execute.
    return substitute(
        template,
        table=lambda name: sql.Identifier(schema, name).as_string(None),
        u64=lambda column: f"NUMERIC(20, 0) CHECK ({column} >= 0 AND {column} <= {U64_MAX})",
    )


class _CannotConnect(Exception):
    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _PgTx(Tx):
    def __init__(self, conn: psycopg.AsyncConnection, dialect: PostgresDialect) -> None:
        self.conn = conn
        self.dialect = dialect

    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        try:
            cur = await self.conn.execute(self.dialect.render(template), params)
        except psycopg.Error as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            raise refused from None
        return await cur.fetchall() if cur.description else []


class _PgPinned(Pinned):
    def __init__(self, backend: PostgresBackend) -> None:
        self.backend = backend
        self.conn: psycopg.AsyncConnection | None = None
        self.cur: psycopg.AsyncCursor[Any] | None = None

    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        query = self.backend.dialect.render(template)

        async def once() -> Rows:
            if self.conn is None or self.cur is None:
                self.conn = await self.backend.check_out()
                self.cur = self.conn.cursor()
            try:
                await self.cur.execute(query, params, prepare=True)
                return await self.cur.fetchall() if self.cur.description else []
            except BaseException:
                await self.close()  # the pool throws a broken connection away
                raise

        return await self.backend.retried(once)

    async def close(self) -> None:
        if self.conn is not None:
            conn, self.conn, self.cur = self.conn, None, None
            await self.backend.check_in(conn)


class PostgresBackend(Backend):
    dialect: PostgresDialect
    pooled = True

    # `create` does not apply: a database is created by its administrator.
    pool: psycopg_pool.AsyncConnectionPool | None = None  # while open

    @cached_property
    def connect_timeout(self) -> float:
        """Seconds that opening (connect, probe, pool) may take: the URL's own
        connect_timeout (libpq's) if it sets one."""
        given = str(conninfo_to_dict(self.url.dsn).get("connect_timeout") or "")
        return float(given) if given.isdigit() and int(given) > 0 else CONNECT_TIMEOUT_S

    async def open(self) -> None:
        async def probe() -> str:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url.dsn, autocommit=True, **self._network_options())
            except psycopg.Error as exc:
                raise _CannotConnect(exc) from exc  # wrong address or credentials: no retry
            async with conn:
                cur = await conn.execute("SELECT version()")
                row = await cur.fetchone()
            return str(row[0]) if row else ""

        # A connection made and then lost (a reply dropped on the way) is retried briefly.
        try:
            version = await retrying(probe, policy=RetryPolicy(timeout=self.connect_timeout),
                                     transient=transient_reason, on_retry=self.on_retry)
        except _CannotConnect as exc:
            raise OracleUnavailable(
                f"cannot connect to {self.url.safe}: {self._why(exc.cause)}"
            ) from None
        except GaveUp as exc:
            raise OracleUnavailable(
                f"cannot open {self.url.safe}: the connection kept dropping for "
                f"{exc.elapsed:.1f}s ({self._why(exc.last)}); check the network to the server"
            ) from None
        except psycopg.Error as exc:
            raise (self.translate(exc) or OracleUnavailable(self._why(exc))) from None
        self.dialect = PostgresDialect(self.url.schema, cockroach=is_cockroach(version))
        self.pool = psycopg_pool.AsyncConnectionPool(
            self.url.dsn,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "prepare_threshold": 0, **self._network_options()},
            configure=self._configure,
            timeout=min(self.retry.timeout, POOL_WAIT_S),
            reconnect_timeout=RECONNECT_S,
            open=False,
            name="tsoracle",
        )
        try:
            await self.pool.open(wait=True, timeout=self.connect_timeout)
        except psycopg.Error as exc:
            await self.pool.close()
            raise OracleUnavailable(
                f"cannot open a connection pool to {self.url.safe}: {self._why(exc)}"
            ) from None

    def _network_options(self) -> dict[str, Any]:
        """libpq's time limits on a network that goes silent, unless the URL sets its own.

        Without them a statement in flight when the network drops packets (a partition, a
        host that vanished) waits for the kernel's retransmissions, about 15 minutes, and the
        retry budget never gets a say. tcp_user_timeout closes a connection whose data stays
        unacknowledged; keepalives notice a reply that never comes while nothing is unsent.
        """
        wait_s = NETWORK_TIMEOUT_S
        defaults = {
            "connect_timeout": max(1, math.ceil(self.connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": max(1, wait_s // 3),
            "keepalives_interval": max(1, wait_s // 6),
            "keepalives_count": 3,
            "tcp_user_timeout": wait_s * 1000,
        }
        given = conninfo_to_dict(self.url.dsn)
        return {k: v for k, v in defaults.items() if k not in given}

    async def _configure(self, conn: psycopg.AsyncConnection) -> None:
        if self.dialect.cockroach:
            return  # commits through consensus; its session settings are not verified here
        # One statement, so a new connection costs one round trip (each one more is another
        # chance for a lost reply to fail the connection). Both settings are session-wide.
        #
        # A timestamp is handed out only after its row is durable: a server, database or role
        # default of synchronous_commit = off or local (any DBA may set one) would let a crash
        # or a failover roll the row back and hand the same timestamps out again. Stronger
        # settings (remote_write, remote_apply) stay.
        #
        # Our transactions never wait on their client. One left idle means the client is gone
        # without a word reaching the server (a pod killed, a node lost): its row locks would
        # stall every writer and linearized read of the timeline until TCP gave up, hours by
        # default. A shorter limit from the server, the role or the URL's options is kept.
        # current_setting() shows the limit with its unit ("0", "500ms", "1h"), which interval
        # input reads; pg_settings would need a privilege some sites revoke. The limit is our
        # constant, written in as a literal.
        limit_ms = sql.Literal(str(IDLE_IN_TRANSACTION_S * 1000))
        await conn.execute(sql.SQL(
            "SELECT CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')"
            " THEN set_config('synchronous_commit', 'on', false) END,"
            " CASE WHEN NOT current_setting('idle_in_transaction_session_timeout')::interval"
            " BETWEEN interval '1 millisecond' AND ({ms} || ' milliseconds')::interval"
            " THEN set_config('idle_in_transaction_session_timeout', {ms}, false) END"
        ).format(ms=limit_ms))

    def pinned(self) -> Pinned:
        return _PgPinned(self)

    async def check_out(self) -> psycopg.AsyncConnection:
        """A connection of the pool for the caller alone, until it gives it back (`check_in`)."""
        return await self._pool().getconn()

    async def check_in(self, conn: psycopg.AsyncConnection) -> None:
        """Give back a `check_out` connection (the pool throws a broken one away); after
        `close` there is nothing to give it back to."""
        if self.pool is not None:
            await self.pool.putconn(conn)

    async def _close_connections(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    async def fetch(
        self, template: str, params: Mapping[str, Any] | None = None, *, prepare: bool = True
    ) -> Rows:
        query = self.dialect.render(template)
        pool = self._pool()

        async def once() -> Rows:
            async with pool.connection() as conn:
                cur = await conn.execute(query, params, prepare=prepare)
                return await cur.fetchall() if cur.description else []

        return await self.retried(once)

    async def transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        pool = self._pool()

        async def once() -> T:
            async with pool.connection() as conn, conn.transaction():
                return await body(_PgTx(conn, self.dialect))

        return await self.retried(once)

    @property
    def sends_at_once(self) -> bool:  # type: ignore[override]
        # CockroachDB speaks the same protocol, but its handling of these transactions is not
        # tested here: it takes the statement-at-a-time path. So does a libpq older than 14,
        # which has no pipeline mode (psycopg would refuse every group).
        return not self.dialect.cockroach and psycopg.AsyncPipeline.is_supported()

    async def at_once(self, statements: Sequence[Statement]) -> list[Rows]:
        rendered = [(self.dialect.render(s.template), s.params) for s in statements]
        pool = self._pool()

        async def once() -> list[Rows]:
            async with pool.connection() as conn:
                try:
                    # BEGIN and COMMIT as statements of the pipeline (the connection is in
                    # autocommit): psycopg's transaction() would wait for each of them.
                    async with conn.pipeline():
                        await conn.execute("BEGIN")
                        cursors = [await conn.execute(q, p, prepare=True) for q, p in rendered]
                        await conn.execute("COMMIT")
                    return [await c.fetchall() if c.description else [] for c in cursors]
                except BaseException as exc:
                    await _end_failed(conn, exc)
                    raise

        return await self.retried(once)

    async def execute_ddl(self, statement: Any) -> None:
        """Run DDL unprepared (PostgreSQL cannot PREPARE it)."""
        pool = self._pool()

        async def once() -> None:
            async with pool.connection() as conn:
                await conn.execute(statement, prepare=False)

        await self.retried(once)

    async def table_exists(self, table: str) -> bool:
        rows = await self.fetch(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %(s)s"
            " AND table_name = %(t)s",
            {"s": self.url.schema, "t": table},
        )
        return bool(rows)

    def _pool(self) -> psycopg_pool.AsyncConnectionPool:
        if self.pool is None:
            raise OracleClosed()
        return self.pool

    def transient_reason(self, exc: BaseException) -> str | None:
        return transient_reason(exc)

    def gave_up(self, exc: GaveUp) -> OracleError:
        if isinstance(exc.last, psycopg_pool.PoolTimeout) and self._exhausted():
            return OracleUnavailable(
                f"no free connection to {self.url.safe} for {exc.elapsed:.1f}s: all "
                f"{self.pool_size} in the pool stayed busy; open the oracle with a larger "
                "pool_size or make fewer concurrent calls"
            )
        if transient_reason(exc.last) in CONFLICTS:
            return Contended(
                f"gave up after {exc.attempts} attempts in {exc.elapsed:.1f}s: each one "
                f"conflicted with concurrent transactions on the same rows in "
                f"{self.url.safe} ({self._why(exc.last)}); the server is up, the rows are "
                "contended: try again when the load is lower, or give calls a longer retry "
                "budget (retry=RetryPolicy(timeout=...))"
            )
        return OracleUnavailable(
            f"backend {self.url.safe} still failing after {exc.attempts} attempts in "
            f"{exc.elapsed:.1f}s ({self._why(exc.last)}); check that the server is up"
        )

    def _exhausted(self) -> bool:
        """Every connection of a full pool is in use (a pool timeout can also mean that no
        connection could be made, which is the server's problem, not the pool's)."""
        if self.pool is None:
            return False
        stats = self.pool.get_stats()
        return stats.get("pool_size", 0) >= self.pool_size and stats.get("pool_available", 0) == 0

    def translate(self, exc: Exception) -> OracleError | None:
        if not isinstance(exc, psycopg.Error):
            return None
        refused = refusal(exc)
        if refused is not None:
            return refused
        if isinstance(exc, psycopg_pool.PoolClosed):
            return OracleClosed()
        if isinstance(exc, pgerr.UndefinedTable | pgerr.InvalidSchemaName):
            return NotInitialized(
                f"schema {self.url.schema!r} is not provisioned in {self.url.safe}; "
                "run `tsoracle init` (or let the operator provision it)"
            )
        if isinstance(exc, pgerr.InsufficientPrivilege):
            return OracleUnavailable(
                f"permission denied in {self.url.safe}: {self._why(exc)}; grant the oracle's "
                "role access to its schema"
            )
        return OracleUnavailable(f"backend error from {self.url.safe}: {self._why(exc)}")

    def _why(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        first = text[0] if text else type(exc).__name__
        state = getattr(exc, "sqlstate", None)
        first = first.removeprefix("connection failed: ")
        return self.url.scrub(f"{first} [SQLSTATE {state}]" if state else first)


# Failures that say the server is fine but another transaction got there first.
CONFLICTS = ("serialization_failure", "deadlock", "lock_timeout")


# SQLSTATE classes that refuse a statement for its data: 22 (data exception: too long,
# untranslatable character), 23 (integrity constraint), 54 (program limit exceeded: an index
# row too large). The same statement would fail the same way again.
_REFUSING_CLASSES = ("22", "23", "54")


async def _end_failed(conn: psycopg.AsyncConnection, exc: BaseException) -> None:
    """After a transaction sent at once failed: a statement's error left the connection in
    the aborted transaction (roll it back); anything else (a cancelled call, a lost
    connection) leaves it in an unknown state (close it: the pool replaces it)."""
    try:
        if (isinstance(exc, psycopg.Error) and not conn.closed
                and conn.info.transaction_status == TransactionStatus.INERROR):
            await conn.execute("ROLLBACK")
        elif conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.close()
    except psycopg.Error:
        await conn.close()


def refusal(exc: BaseException) -> Refused | None:
    """The `Refused` a driver error amounts to, or None if it is not a refusal of the data."""
    state = getattr(exc, "sqlstate", None) or ""
    if not state.startswith(_REFUSING_CLASSES):
        return None
    if state == "23505":
        return Refused("duplicate", "a key this change adds is taken (by a concurrent change)")
    return Refused("invalid", f"the database refused the change's data [SQLSTATE {state}]")


def transient_reason(exc: BaseException) -> str | None:
    """Name the kind of a retryable failure, or None if retrying cannot help."""
    if isinstance(exc, Refused) or refusal(exc) is not None:
        return None
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, psycopg_pool.PoolClosed):
        return None  # closed on purpose: retrying would only wait out the budget
    if isinstance(exc, pgerr.SerializationFailure):
        return "serialization_failure"
    if isinstance(exc, pgerr.StatementCompletionUnknown):
        return "ambiguous_result"
    if isinstance(exc, pgerr.DeadlockDetected):
        return "deadlock"
    if isinstance(exc, pgerr.LockNotAvailable):
        return "lock_timeout"
    if isinstance(exc, pgerr.IdleInTransactionSessionTimeout):
        # The server ended a session whose transaction sat idle (a client stalled past
        # IDLE_IN_TRANSACTION_S) and rolled it back: nothing landed, so run it again.
        return "connection"
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate or ""
        if state.startswith("28") or state in ("3D000", "42501"):
            return None  # credentials, missing database, privileges: the user must act
        return "connection"
    if isinstance(exc, psycopg.InterfaceError):
        return "connection"
    return None


BACKEND = PostgresBackend  # see store/kinds.py
