"""A transaction cancelled at any point (BEGIN, its body, COMMIT) leaves nothing behind.

Issue 34, defect 3: a task cancelled while SQLite's `BEGIN IMMEDIATE` waited for another
process's lock left the connection inside a transaction (the executor thread finished BEGIN
later). Every statement after it on that backend then committed nothing, other processes were
locked out, and after close another process handed out the same timestamps again.

Each test cancels at one point and then checks the same four things: no transaction is left
open, no lock is held (another connection writes at once), the backend still commits what it
is given, and (with the oracle) no timestamp is handed out twice. Where a call is cancelled is
made certain by events (the statement seen starting on the backend's thread, the session seen
waiting for a lock), never by sleeping.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tsoracle
from tsoracle.store import Backend, Tx, open_backend, parse_url
from tsoracle.store import sqlite as sqlite_store
from tsoracle.store.sqlite import SqliteBackend

GUARD_S = 120  # only a hang reaches this

# A separate process that takes SQLite's write lock and holds it until told to let go.
HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=600)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
"""


@asynccontextmanager
async def write_lock_held(path: Path) -> AsyncIterator[None]:
    """Another process holds `path`'s write lock (BEGIN IMMEDIATE) inside the block."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(path),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert await proc.stdout.readline() == b"held\n"
        yield
        proc.stdin.write(b"release\n")
        await proc.stdin.drain()
        assert await proc.stdout.readline() == b"released\n"
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


class Statements:
    """Watches the statements that open and close the backend's transactions (BEGIN, COMMIT,
    ROLLBACK run through `_raw`, on the backend's one thread): each one's start is an event a
    test can wait for; one may be held at a gate, or fail instead of running."""

    def __init__(self, backend: SqliteBackend) -> None:
        self._run = backend._raw
        backend._raw = self._raw  # type: ignore[method-assign]
        self.started = {s: threading.Event() for s in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")}
        self.gates: dict[str, threading.Event] = {}
        self.failures: dict[str, list[BaseException]] = {}
        self.ran: list[str] = []

    def _raw(self, statement: str) -> None:
        self.started[statement].set()
        gate = self.gates.get(statement)
        if gate is not None:
            assert gate.wait(GUARD_S)
        if self.failures.get(statement):
            raise self.failures[statement].pop(0)
        self._run(statement)
        self.ran.append(statement)

    async def reached(self, statement: str) -> None:
        """Wait until `statement` has started on the backend's thread."""
        assert await asyncio.to_thread(self.started[statement].wait, GUARD_S), statement


async def open_sqlite(path: Path) -> SqliteBackend:
    backend = open_backend(parse_url(f"sqlite:///{path}"), create=True)
    assert isinstance(backend, SqliteBackend)
    await backend.open()
    await backend.fetch("CREATE TABLE items (note TEXT NOT NULL)")
    return backend


def writing(statements: list[tuple[str, dict[str, Any]]], note: str,
            reached: asyncio.Event | None = None,
            hold: asyncio.Event | None = None) -> Callable[[Tx], Any]:
    """A transaction body that runs `statements` and returns `note`; it sets `reached` once
    they ran and then waits for `hold` (a body still running)."""
    async def body(tx: Tx) -> str:
        for statement, params in statements:
            await tx.fetch(statement, params)
        if reached is not None:
            reached.set()
        if hold is not None:
            await hold.wait()
        return note

    return body


def insert(note: str, reached: asyncio.Event | None = None,
           hold: asyncio.Event | None = None) -> Callable[[Tx], Any]:
    """A body that inserts `note` (see `writing`)."""
    return writing([("INSERT INTO items (note) VALUES (%(n)s)", {"n": note})], note, reached,
                   hold)


def notes(path: Path) -> list[str]:
    other = sqlite3.connect(path, isolation_level=None)
    try:
        return sorted(row[0] for row in other.execute("SELECT note FROM items"))
    finally:
        other.close()


async def in_transaction(backend: SqliteBackend) -> bool:
    """The connection's state once everything queued on its thread before has run (the thread
    runs jobs in order: a BEGIN still waiting for the lock finishes first)."""
    return await backend._call(lambda: backend._connection().in_transaction)


async def assert_left_clean(backend: SqliteBackend, path: Path) -> None:
    assert not await in_transaction(backend), \
        "the cancelled call left the backend's connection inside a transaction"
    other = sqlite3.connect(path, isolation_level=None, timeout=0)  # no waiting for a lock
    try:
        other.execute("BEGIN IMMEDIATE")  # "database is locked" if a lock was left held
        other.execute("ROLLBACK")
    finally:
        other.close()
    # Still usable, and what it writes is committed (seen by another connection).
    before = notes(path)
    assert await backend.transaction(insert("after, in a transaction")) == \
        "after, in a transaction"
    await backend.fetch("INSERT INTO items (note) VALUES ('after, alone')")
    assert notes(path) == sorted([*before, "after, in a transaction", "after, alone"])


@asynccontextmanager
async def thread_occupied(backend: SqliteBackend) -> AsyncIterator[None]:
    """The backend's one thread busy with another job inside the block: what is queued
    meanwhile waits its turn."""
    started, go = threading.Event(), threading.Event()

    def occupy() -> None:
        started.set()
        assert go.wait(GUARD_S)

    done = backend._thread.submit(occupy)
    assert await asyncio.to_thread(started.wait, GUARD_S)
    try:
        yield
    finally:
        go.set()
        await asyncio.wrap_future(done)


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
async def sqlite_backend(tmp_path: Path, monkeypatch) -> AsyncIterator[SqliteBackend]:
    # The backend waits this long for another process's lock before it gives up: long enough
    # that a BEGIN never gives up while a test holds the lock, however slow the machine.
    monkeypatch.setattr(sqlite_store, "_BUSY_MS", GUARD_S * 1000)
    backend = await open_sqlite(tmp_path / "db.sqlite")
    yield backend
    await backend.close()


# --- SQLite --------------------------------------------------------------------------------


async def test_sqlite_cancelled_at_begin_while_another_process_holds_the_lock(
        sqlite_backend, tmp_path):
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    async with asyncio.timeout(GUARD_S), write_lock_held(path):
        task = asyncio.create_task(sqlite_backend.transaction(insert("cancelled at BEGIN")))
        await statements.reached("BEGIN IMMEDIATE")  # now waiting for the other process
        await cancel(task)
    # The lock is free: the BEGIN still queued on the backend's thread goes through now.
    async with asyncio.timeout(GUARD_S):
        await assert_left_clean(sqlite_backend, path)
    assert "cancelled at BEGIN" not in notes(path)


async def test_sqlite_cancelled_twice_at_begin(sqlite_backend, tmp_path):
    # A second cancellation, while the first one's clean-up waits for the BEGIN, must not
    # skip the clean-up.
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    async with asyncio.timeout(GUARD_S), write_lock_held(path):
        task = asyncio.create_task(sqlite_backend.transaction(insert("cancelled twice")))
        await statements.reached("BEGIN IMMEDIATE")
        task.cancel()
        await asyncio.sleep(0)  # the task takes the first cancellation
        if not task.done():
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with asyncio.timeout(GUARD_S):
        await assert_left_clean(sqlite_backend, path)
    assert "cancelled twice" not in notes(path)


async def test_sqlite_cancelled_in_the_body(sqlite_backend, tmp_path):
    path = tmp_path / "db.sqlite"
    reached, hold = asyncio.Event(), asyncio.Event()
    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(sqlite_backend.transaction(insert("in the body", reached,
                                                                     hold)))
        await reached.wait()  # the row is written, the body still runs
        await cancel(task)
        await assert_left_clean(sqlite_backend, path)
    assert "in the body" not in notes(path)


async def test_sqlite_cancelled_again_while_its_rollback_waits_its_turn(
        sqlite_backend, tmp_path):
    # The first cancellation's ROLLBACK is queued behind another job on the backend's thread;
    # a second cancellation must not take it off the queue.
    path = tmp_path / "db.sqlite"
    reached, hold = asyncio.Event(), asyncio.Event()
    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(sqlite_backend.transaction(insert("cancelled twice", reached,
                                                                     hold)))
        await reached.wait()
        async with thread_occupied(sqlite_backend):
            task.cancel()
            await asyncio.sleep(0)  # the task takes it, and queues its ROLLBACK
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await assert_left_clean(sqlite_backend, path)
    assert "cancelled twice" not in notes(path)


async def test_sqlite_cancelled_while_its_commit_waits_its_turn(sqlite_backend, tmp_path):
    # The COMMIT is queued behind another job when the call is cancelled: it never runs, and
    # the transaction must not stay open.
    path = tmp_path / "db.sqlite"
    returning = asyncio.Event()
    occupied = AsyncExitStack()

    async def body(tx: Tx) -> None:
        await tx.fetch("INSERT INTO items (note) VALUES ('never committed')")
        await occupied.enter_async_context(thread_occupied(sqlite_backend))
        returning.set()  # the COMMIT is queued as the body returns, in the same step

    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(sqlite_backend.transaction(body))
        await returning.wait()
        await cancel(task)
        await occupied.aclose()
        await assert_left_clean(sqlite_backend, path)
    assert "never committed" not in notes(path)


async def test_sqlite_cancelled_at_commit(sqlite_backend, tmp_path):
    # A COMMIT that takes long (a slow disk's fsync, here a gate) is cancelled: the COMMIT still
    # runs on the thread, and what it committed stays, once.
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    statements.gates["COMMIT"] = gate = threading.Event()
    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(sqlite_backend.transaction(insert("at COMMIT")))
        await statements.reached("COMMIT")
        await cancel(task)
        gate.set()
        await assert_left_clean(sqlite_backend, path)
    assert notes(path).count("at COMMIT") == 1


def busy() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database is locked")


async def test_sqlite_cancelled_at_a_commit_that_fails_busy(sqlite_backend, tmp_path):
    # Simulated: SQLite's COMMIT in WAL mode rarely answers BUSY, so the statement is made to
    # fail as it would, leaving the transaction open (what SQLite does on a busy COMMIT).
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    statements.gates["COMMIT"] = gate = threading.Event()
    statements.failures["COMMIT"] = [busy()]
    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(sqlite_backend.transaction(insert("busy COMMIT")))
        await statements.reached("COMMIT")
        await cancel(task)
        gate.set()
        await assert_left_clean(sqlite_backend, path)
    assert "busy COMMIT" not in notes(path)


async def test_sqlite_busy_commit_is_retried_outside_the_transaction(sqlite_backend, tmp_path):
    # Simulated as above. The failed COMMIT leaves its transaction open: the retry must roll it
    # back and run the whole body again in a new one, not BEGIN inside the old one.
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    statements.failures["COMMIT"] = [busy()]
    runs = []

    async def body(tx: Tx) -> int:
        runs.append(1)
        await tx.fetch("INSERT INTO items (note) VALUES ('retried')")
        return len(runs)

    async with asyncio.timeout(GUARD_S):
        assert await sqlite_backend.transaction(body) == 2
        assert statements.ran == ["BEGIN IMMEDIATE", "ROLLBACK", "BEGIN IMMEDIATE", "COMMIT"]
        assert notes(path) == ["retried"]
        await assert_left_clean(sqlite_backend, path)


async def test_sqlite_a_failed_rollback_leaves_no_transaction(sqlite_backend, tmp_path):
    # Simulated: the ROLLBACK after a failed body fails too (an I/O error). The connection is
    # replaced rather than left inside the transaction, and the caller sees its own error.
    path = tmp_path / "db.sqlite"
    statements = Statements(sqlite_backend)
    statements.failures["ROLLBACK"] = [sqlite3.OperationalError("disk I/O error")]

    async def body(tx: Tx) -> None:
        await tx.fetch("INSERT INTO items (note) VALUES ('rolled back')")
        raise ValueError("the body fails")

    async with asyncio.timeout(GUARD_S):
        with pytest.raises(ValueError, match="the body fails"):
            await sqlite_backend.transaction(body)
        await assert_left_clean(sqlite_backend, path)
    assert "rolled back" not in notes(path)


# What another process sees: an oracle opened there after this one closed.
OTHER_ORACLE = """
import asyncio, sys
import tsoracle

async def main():
    async with tsoracle.connect(sys.argv[1], timeline="counter:c",
                                implementation=sys.argv[2]) as oracle:
        print((await oracle.write_ts()).timestamp)

asyncio.run(main())
"""


async def test_no_timestamp_twice_after_a_cancelled_transaction(tmp_path, impl, monkeypatch):
    # The oracle's backend also runs a transaction (as an admin call or a catalog commit on a
    # shared backend does); it is cancelled at BEGIN while another process holds the lock,
    # with write_ts calls waiting behind it. Every timestamp handed out afterwards must stay
    # handed out once this oracle is closed.
    monkeypatch.setattr(sqlite_store, "_BUSY_MS", GUARD_S * 1000)
    path = tmp_path / "oracle.db"
    url = f"sqlite:///{path}"
    await tsoracle.init(url, timelines=["counter:c"], implementation=impl)
    # A small legacy window: the writes below need reservations of their own.
    extra = {"window": 4} if impl == "legacy" else {}
    handed: list[int] = []
    async with asyncio.timeout(GUARD_S), tsoracle.connect(
            url, timeline="counter:c", implementation=impl, **extra) as oracle:
        backend = oracle.backend
        assert isinstance(backend, SqliteBackend)
        handed.append((await oracle.write_ts()).timestamp)
        statements = Statements(backend)

        async def touch(tx: Tx) -> None:
            await tx.fetch("UPDATE {timestamps} SET read_ts = read_ts"
                           " WHERE timeline = 'counter:c'")

        async with write_lock_held(path):
            admin = asyncio.create_task(backend.transaction(touch))
            await statements.reached("BEGIN IMMEDIATE")
            writes = [asyncio.create_task(oracle.write_ts()) for _ in range(5)]
            await asyncio.sleep(0)  # they start, and wait their turn
            for task in (admin, *writes):
                task.cancel()
            ended = await asyncio.gather(admin, *writes, return_exceptions=True)
            assert all(isinstance(e, asyncio.CancelledError) for e in ended), ended
        for _ in range(20):
            handed.append((await oracle.write_ts()).timestamp)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OTHER_ORACLE, url, impl, stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    theirs = int(out)
    assert theirs > max(handed), (
        f"another process was handed {theirs} after this one handed out up to {max(handed)}: "
        "timestamps handed out twice")


# --- PostgreSQL ----------------------------------------------------------------------------
# psycopg cancels the server's statement when its task is cancelled, and the pool rolls back
# (or throws away) a connection given back inside a transaction. These tests hold that to the
# same checks, with the backend's pool at one connection so that every later call meets the
# connection the cancelled one used.

CANCEL_REQUEST = (80877102).to_bytes(4, "big")  # after the 4-byte length


class HoldingRelay:
    """A relay to PostgreSQL, in the test's own event loop, that can hold back the reply to
    the next BEGIN (the statement ran on the server, its answer has not reached the client),
    and tells which side ended each connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.armed = False
        self.begin_sent = asyncio.Event()
        self.release = asyncio.Event()
        self.open_links = 0  # sessions (not cancel requests) still open
        self.ended_by_server = 0  # sessions the server ended while the client still had them
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def hold_next_begin(self) -> None:
        self.armed = True
        self.begin_sent.clear()
        self.release.clear()

    async def one_session_left(self) -> None:
        """Wait until the client has let go of every session but one."""
        while self.open_links > 1:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        held: list[asyncio.Event] = []
        link = {"session": True, "ended": ""}
        self.open_links += 1

        def ended(by: str) -> None:
            if not link["ended"]:
                link["ended"] = by
                self.open_links -= 1
                if by == "server" and link["session"]:
                    self.ended_by_server += 1

        async def upstream() -> None:
            first = True
            while data := await reader.read(65536):
                if first and data[4:8] == CANCEL_REQUEST:
                    link["session"] = False  # psycopg cancelling a statement, not a session
                first = False
                if self.armed and b"BEGIN" in data:  # a simple Query message (no TLS here)
                    self.armed = False
                    held.append(self.release)  # before the server can answer
                    up_w.write(data)
                    await up_w.drain()
                    self.begin_sent.set()
                    continue
                up_w.write(data)
                await up_w.drain()
            ended("client")
            up_w.close()

        async def downstream() -> None:
            while data := await up_r.read(65536):
                if held:
                    await held.pop().wait()
                writer.write(data)
                await writer.drain()
            ended("server")
            writer.close()

        try:
            await asyncio.gather(upstream(), downstream())
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_w):
                w.close()
            ended("relay")
            self._tasks.discard(task)


class PgCase:
    """A backend of one pooled connection on a table of its own, through a `HoldingRelay`, and
    another session (the "other process") that takes locks and looks at the server's views."""

    def __init__(self, url: str, relay: HoldingRelay) -> None:
        self.relay = relay
        self.url = url
        self.app = f"tsoracle_cancel_{uuid.uuid4().hex[:8]}"
        self.schema = parse_url(url).schema
        self.table = f'"{self.schema}".items'
        self.backend: Backend | None = None
        self.other: psycopg.AsyncConnection[Any] | None = None  # takes locks
        self.watch: psycopg.AsyncConnection[Any] | None = None  # autocommit: looks
        self.checks = 0

    async def open(self) -> None:
        host = f"127.0.0.1:{self.relay.target_port}/"
        assert host in self.url
        relayed = self.url.replace(host, f"127.0.0.1:{self.relay.port}/")
        backend = open_backend(parse_url(f"{relayed}&application_name={self.app}"
                                         "&sslmode=disable"), pool_size=1)
        await backend.open()
        self.backend = backend
        await backend.execute_ddl(f'CREATE SCHEMA "{self.schema}"')
        await backend.execute_ddl(f"CREATE TABLE {self.table} (id INTEGER PRIMARY KEY,"
                                  " note TEXT NOT NULL)")
        await backend.fetch(f"INSERT INTO {self.table} VALUES (0, 'the locked row')")
        # A COMMIT waits here while the other session holds advisory lock 34 (a deferred
        # constraint trigger runs inside COMMIT): a COMMIT in flight on the server for as
        # long as a test needs.
        await backend.execute_ddl(
            f'CREATE FUNCTION "{self.schema}".wait_at_commit() RETURNS trigger'
            " LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock(34); RETURN NULL;"
            " END $$")
        await backend.execute_ddl(
            f"CREATE CONSTRAINT TRIGGER wait_at_commit AFTER INSERT ON {self.table}"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            f' EXECUTE FUNCTION "{self.schema}".wait_at_commit()')
        base = self.url.split("?", 1)[0]
        self.other = await psycopg.AsyncConnection.connect(base)
        self.watch = await psycopg.AsyncConnection.connect(base, autocommit=True)

    async def close(self) -> None:
        for conn in (self.other, self.watch):
            if conn is not None:
                await conn.close()
        if self.backend is not None:
            await self.backend.close()

    async def sessions(self) -> list[tuple[Any, ...]]:
        """(pid, state, wait_event_type) of the backend's sessions."""
        cur = await self.watch.execute(
            "SELECT pid, state, wait_event_type FROM pg_stat_activity"
            " WHERE application_name = %s ORDER BY pid", [self.app])
        return list(await cur.fetchall())

    async def pids(self) -> set[int]:
        return {pid for pid, _, _ in await self.sessions()}

    async def waiting_for_a_lock(self) -> None:
        while not any(wait == "Lock" for _, _, wait in await self.sessions()):
            await asyncio.sleep(0.01)

    async def assert_left_clean(self) -> None:
        backend = self.backend
        assert backend is not None
        # The pool hands its one connection out again only once it is idle, or a new one
        # after it closed the old one (psycopg does, when a cancellation is interrupted).
        pid = (await backend.fetch("SELECT pg_backend_pid()"))[0][0]
        await self.relay.one_session_left()
        assert self.relay.ended_by_server == 0, \
            "the server ended a session the client still held (an idle transaction's timeout)"
        while await self.pids() != {pid}:
            await asyncio.sleep(0.01)  # a session the client closed, on its way out
        cur = await self.watch.execute(
            "SELECT a.pid, a.state, a.xact_start IS NULL, count(l.pid)"
            " FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid"
            "  AND l.locktype <> 'virtualxid'"
            " WHERE a.application_name = %s GROUP BY a.pid, a.state, a.xact_start", [self.app])
        assert await cur.fetchall() == [(pid, "idle", True, 0)], \
            "the backend's session is still in a transaction or holds locks"
        # The other session takes each lock at once.
        await self.other.execute(f"SELECT 1 FROM {self.table} WHERE id = 0 FOR UPDATE NOWAIT")
        cur = await self.other.execute("SELECT pg_try_advisory_xact_lock(34)")
        assert await cur.fetchone() == (True,)
        await self.other.rollback()
        # Still usable, and what it writes is committed (seen by the other session).
        before_notes = await self.notes()
        self.checks += 1
        first = f"after, in a transaction ({self.checks})"
        second = f"after, alone ({self.checks})"
        assert await backend.transaction(pg_insert(self.table, -2 * self.checks, first))
        await backend.fetch(f"INSERT INTO {self.table} VALUES (%(k)s, %(n)s)",
                            {"k": -2 * self.checks - 1, "n": second})
        assert await self.notes() == sorted([*before_notes, first, second])

    async def notes(self) -> list[str]:
        cur = await self.watch.execute(f"SELECT note FROM {self.table}")
        return sorted(r[0] for r in await cur.fetchall())


def pg_insert(table: str, key: int, note: str, reached: asyncio.Event | None = None,
              hold: asyncio.Event | None = None, lock_first: bool = False
              ) -> Callable[[Tx], Any]:
    """A body inserting (`key`, `note`), after locking row 0 if `lock_first` (see
    `writing`)."""
    lock = [(f"SELECT note FROM {table} WHERE id = 0 FOR UPDATE", {})] if lock_first else []
    return writing([*lock, (f"INSERT INTO {table} VALUES (%(k)s, %(n)s)",
                            {"k": key, "n": note})], note, reached, hold)


@pytest.fixture
async def pg_case(pg, pg_url) -> AsyncIterator[PgCase]:
    relay = HoldingRelay(pg.port)
    await relay.start()
    case = PgCase(pg_url, relay)
    try:
        async with asyncio.timeout(GUARD_S):
            await case.open()
        yield case
    finally:
        await case.close()
        await relay.close()


@pytest.mark.pg
async def test_pg_cancelled_at_begin(pg_case):
    # The BEGIN ran on the server; its reply is held back until the call is cancelled, so
    # psycopg is left with a connection inside a transaction it never entered.
    case = pg_case
    async with asyncio.timeout(GUARD_S):
        case.relay.hold_next_begin()
        reached = asyncio.Event()
        task = asyncio.create_task(case.backend.transaction(
            pg_insert(case.table, 1, "cancelled at BEGIN", reached)))
        await case.relay.begin_sent.wait()
        task.cancel()
        case.relay.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not reached.is_set()
        await case.assert_left_clean()
    assert "cancelled at BEGIN" not in await case.notes()


@pytest.mark.pg
@pytest.mark.parametrize("times", [1, 2])
async def test_pg_cancelled_waiting_for_a_row_lock(pg_case, times):
    # The body's first statement waits for the row the other session holds (PostgreSQL's
    # BEGIN takes no lock: this is where a transaction waits for another one). A second
    # cancellation lands while psycopg waits for the server to cancel the first.
    case = pg_case
    async with asyncio.timeout(GUARD_S):
        await case.other.execute(f"SELECT 1 FROM {case.table} WHERE id = 0 FOR UPDATE")
        task = asyncio.create_task(case.backend.transaction(
            pg_insert(case.table, 1, "waited for the lock", lock_first=True)))
        await case.waiting_for_a_lock()
        for _ in range(times):
            task.cancel()
            await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await task
        await case.other.rollback()
        await case.assert_left_clean()
    assert "waited for the lock" not in await case.notes()


@pytest.mark.pg
async def test_pg_cancelled_in_the_body(pg_case):
    case = pg_case
    reached, hold = asyncio.Event(), asyncio.Event()
    async with asyncio.timeout(GUARD_S):
        task = asyncio.create_task(case.backend.transaction(
            pg_insert(case.table, 1, "in the body", reached, hold)))
        await reached.wait()
        await cancel(task)
        await case.assert_left_clean()
    assert "in the body" not in await case.notes()


@pytest.mark.pg
async def test_pg_cancelled_at_commit(pg_case):
    # The COMMIT runs on the server and waits there (its deferred trigger wants the advisory
    # lock the other session holds): the cancellation reaches the server, which rolls back.
    case = pg_case
    async with asyncio.timeout(GUARD_S):
        await case.other.execute("SELECT pg_advisory_xact_lock(34)")
        task = asyncio.create_task(case.backend.transaction(
            pg_insert(case.table, 1, "at COMMIT")))
        await case.waiting_for_a_lock()
        await cancel(task)
        await case.other.rollback()
        await case.assert_left_clean()
    assert "at COMMIT" not in await case.notes()
