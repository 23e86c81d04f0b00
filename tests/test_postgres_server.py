"""Behaviour only a real PostgreSQL server shows: server-side statement counts, faults."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

import tsoracle
from tsoracle.fencing import tables_exist
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.provision import drop_deployment
from tsoracle_dev.lincheck.history import check
from tsoracle_dev.localpg import LocalPostgres
from tsoracle_dev.workload import Recorder

pytestmark = pytest.mark.pg  # the session's server and servers of the tests' own

COUNTER = "counter:server"


def calls(pg: LocalPostgres, schema: str, needle: str) -> int:
    """Executions the server itself counted for statements on `schema` containing `needle`."""
    rows = pg.sql("SELECT query, calls FROM pg_stat_statements")
    return sum(int(n) for q, n in rows if schema in str(q) and needle in str(q))


async def test_256_concurrent_reads_need_far_fewer_selects(pg):
    schema = "b_" + uuid.uuid4().hex[:10]
    url = f"{pg.url()}?schema={schema}"
    await tsoracle.init(url, timelines=[COUNTER])
    async with tsoracle.connect(url, timeline=COUNTER) as o:
        await o.apply_write(7)
        pg.sql("SELECT pg_stat_statements_reset()")
        results = await asyncio.gather(*[o.read_ts() for _ in range(256)])
        assert results == [7] * 256
        batched = calls(pg, schema, "SELECT read_ts")
    async with tsoracle.connect(url, timeline=COUNTER, batching=False) as o:
        pg.sql("SELECT pg_stat_statements_reset()")
        await asyncio.gather(*[o.read_ts() for _ in range(256)])
        raw = calls(pg, schema, "SELECT read_ts")
    assert raw == 256  # the server counts what it executed: the method is sound
    assert 1 <= batched <= 16


@pytest.fixture
def own_pg(tmp_path):
    server = LocalPostgres(tmp_path / "pg")
    server.destroy_when_this_process_exits()
    server.start()
    yield server
    server.destroy()


async def _wait_for_ops(rec: Recorder, n: int, work: asyncio.Task[None]) -> None:
    async with asyncio.timeout(300):  # only a hang reaches this
        while len(rec.ops) < n:
            assert not work.done(), "the workload ended early"
            await asyncio.sleep(0.01)


async def _run_with_fault(url: str, fault, impl: str = "distributed"):
    """Fault a running workload; it must go on for 100 more operations afterwards."""
    rec = Recorder(url, COUNTER, impl, "faulty")
    stop = asyncio.Event()
    work = asyncio.create_task(rec.run(32, stop=stop.is_set))
    await _wait_for_ops(rec, 100, work)
    before = len(rec.ops)
    await fault(rec)
    after = len(rec.ops)
    await _wait_for_ops(rec, after + 100, work)
    stop.set()
    await work
    assert not rec.capped
    return rec, before


@pytest.mark.parametrize("impl", ["distributed", "legacy"])
async def test_killed_backend_connections_are_retried(own_pg, impl):
    url = own_pg.url()
    await tsoracle.init(url, timelines=[COUNTER], implementation=impl)

    async def kill_repeatedly(rec: Recorder):
        for _ in range(5):
            killed = await asyncio.to_thread(
                own_pg.sql,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = 'tsoracle' AND pid <> pg_backend_pid()"
            )
            assert killed
            done = len(rec.ops)
            while len(rec.ops) < done + 20:  # reconnected and serving before the next kill
                await asyncio.sleep(0.01)

    rec, before = await _run_with_fault(url, kill_repeatedly, impl)
    assert rec.errors == 0 and rec.fenced == 0
    assert len(rec.ops) > before + 100  # it kept going after the kills
    assert check(rec.ops) == []
    retried = tsoracle.oracle.metrics.RETRIES.total(reason="connection", implementation=impl)
    assert retried > 0


async def test_postgres_restart_mid_run(own_pg):
    url = own_pg.url()
    await tsoracle.init(url, timelines=[COUNTER])

    async def restart(rec: Recorder):
        await asyncio.to_thread(own_pg.restart)

    rec, before = await _run_with_fault(url, restart)
    assert rec.errors == 0
    assert len(rec.ops) > before + 100
    assert check(rec.ops) == []
    async with tsoracle.connect(url, timeline=COUNTER) as o:  # durable across the restart
        top = max(op.value for op in rec.ops)
        assert (await o.write_ts()).timestamp > top


async def test_unreachable_server_gives_up_with_a_clear_error(own_pg):
    url = own_pg.url()
    await tsoracle.init(url, timelines=[COUNTER])
    policy = tsoracle.store.RetryPolicy(timeout=1.0)
    oracle = await tsoracle.open_oracle(url, timeline=COUNTER, retry=policy)
    try:
        await oracle.read_ts()
        own_pg.stop()
        with pytest.raises(tsoracle.OracleUnavailable, match="still failing after"):
            await oracle.read_ts()
    finally:
        with contextlib.suppress(Exception):
            await oracle.close()


@pytest.mark.parametrize("impl", ["distributed", "legacy"])
async def test_no_reuse_after_a_crash_with_asynchronous_commit(own_pg, impl):
    """A DBA's `synchronous_commit = off` must not let a crash lose handed-out timestamps."""
    url = own_pg.url()
    await tsoracle.init(url, timelines=[COUNTER], implementation=impl)
    # The database default an admin may choose, and a WAL writer slow enough that a crash
    # certainly loses asynchronously committed transactions (before the fix: 7588, then 7541).
    own_pg.sql("ALTER DATABASE tsoracle SET synchronous_commit = off", "postgres")
    own_pg.sql("ALTER SYSTEM SET wal_writer_delay = '10s'", "postgres")
    own_pg.sql("SELECT pg_reload_conf()", "postgres")
    handed_out = []
    oracle = await tsoracle.open_oracle(url, timeline=COUNTER, implementation=impl)
    try:
        for _ in range(200 if impl == "distributed" else 5):
            w = (await oracle.write_ts()).timestamp
            handed_out.append(w)
        if impl == "legacy":  # a leader hands out its reserved window: spend a few windows
            while handed_out[-1] < 5 * 1000:
                handed_out.append((await oracle.write_ts()).timestamp)
    finally:
        await asyncio.to_thread(own_pg.crash_and_restart, 0.2)
        with contextlib.suppress(tsoracle.OracleError):
            await oracle.close()
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as after:
        again = (await after.write_ts()).timestamp
    assert again > max(handed_out), (again, max(handed_out))


async def test_a_pool_too_small_for_pinned_connections_is_refused(pg_url):
    # Before the fix, pool_size=2 let the distributed oracle's two pinned connections take the
    # whole pool: every other statement waited, then "check that the server is up".
    await tsoracle.init(pg_url, timelines=[COUNTER])
    with pytest.raises(tsoracle.ConfigError, match="use pool_size=3 or more"):
        await tsoracle.open_oracle(pg_url, timeline=COUNTER, pool_size=2)
    async with asyncio.timeout(300):  # only a hang reaches this
        async with tsoracle.connect(pg_url, timeline=COUNTER, pool_size=3) as o:
            async def mixed() -> None:
                for _ in range(20):
                    w = await o.write_ts()
                    await o.apply_write(w.timestamp)
                    assert await o.read_ts() >= w.timestamp
            await asyncio.gather(*[mixed() for _ in range(16)])


async def test_pool_exhaustion_says_so(pg_url):
    await tsoracle.init(pg_url, timelines=[COUNTER])
    policy = tsoracle.store.RetryPolicy(timeout=1.0)
    async with tsoracle.connect(pg_url, timeline=COUNTER, pool_size=3, retry=policy) as o:
        await o.read_ts()  # the two pinned connections are taken
        await o.confirm_leadership()
        await o.write_ts()
        pool = o.backend.pool
        assert pool is not None
        async with pool.connection():  # someone holds the last free connection
            with pytest.raises(tsoracle.OracleUnavailable, match="no free connection") as err:
                await o.write_ts()
        assert "pool_size" in str(err.value) and "server is up" not in str(err.value)


@pytest.mark.parametrize("schema", ["public", "shared_app"])
async def test_deleting_never_drops_the_users_tables(pg, database, schema):
    # Before the fix, deletionPolicy: Delete ran DROP SCHEMA … CASCADE: with `schema: public`
    # it dropped a pre-existing application table public.invoices.
    import psycopg

    url = f"{database}?schema={schema}"
    admin = database.replace("?", "")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(f"CREATE TABLE {schema}.invoices (id INT PRIMARY KEY)")
        await conn.execute(f"INSERT INTO {schema}.invoices VALUES (1), (2)")
    await tsoracle.init(url)
    async with admin_backend(url) as backend:
        dropped = await drop_deployment(backend)
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM information_schema.tables WHERE"
                                 f" table_schema = '{schema}' AND table_name = 'invoices'")
        assert (await cur.fetchone())[0] == 1, "the user's table was dropped"
        cur = await conn.execute(f"SELECT count(*) FROM {schema}.invoices")
        assert (await cur.fetchone())[0] == 2
    async with admin_backend(url) as backend:
        assert not await tables_exist(backend)  # tsoracle's own tables are gone
    assert dropped is False  # the schema was kept: it is not empty


async def test_deleting_drops_a_schema_that_only_held_tsoracle(pg, database):
    import psycopg

    url = f"{database}?schema=only_ours"
    await tsoracle.init(url)
    async with admin_backend(url) as backend:
        assert await drop_deployment(backend) is True
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'only_ours'")
        assert (await cur.fetchone())[0] == 0


async def test_a_flip_waiting_behind_maintenance_does_not_stall_writers(pg):
    # A flip locks the timestamps table; ANALYZE or VACUUM of it (autovacuum, a DBA) holds a
    # lock that makes the flip wait, and writers queue behind a waiting lock. Before the
    # flip's lock_timeout, writers stood still for as long as the maintenance ran.
    import psycopg

    schema = "m_" + uuid.uuid4().hex[:8]
    url = f"{pg.url()}?schema={schema}"
    await tsoracle.init(url, timelines=[COUNTER])
    maintenance = await psycopg.AsyncConnection.connect(pg.admin_dsn())
    writer = await tsoracle.open_oracle(url, timeline=COUNTER, batching=False)
    try:
        await maintenance.execute(f'ANALYZE "{schema}".timestamps')  # held until commit
        flip = asyncio.create_task(tsoracle.flip(url, to="legacy"))
        await asyncio.sleep(0.5)  # the flip is waiting for its lock
        assert not flip.done()
        async with asyncio.timeout(30):  # only a stall reaches this
            for _ in range(20):
                await writer.write_ts()
        assert not flip.done()  # the writes went through while maintenance still ran
        await maintenance.commit()
        result = await asyncio.wait_for(flip, 30)
        assert result.changed and result.implementation == "legacy"
    finally:
        await maintenance.close()
        await writer.close()


_FROZEN_WRITER = """
import asyncio, os, signal, sys
from tsoracle.store import open_backend, parse_url, postgres

postgres.IDLE_IN_TRANSACTION_S = 1  # the test's limit; the product's is 10 s

async def main() -> None:
    backend = open_backend(parse_url(sys.argv[1]))
    await backend.open()

    async def body(tx) -> None:
        await tx.fetch("UPDATE {iceberg_uppers} SET upper = upper + 1 WHERE timeline = 't'")
        [(pid,)] = await tx.fetch("SELECT pg_backend_pid()")
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # gone, as far as the server can tell

    await backend.transaction(body)

asyncio.run(main())
"""


async def test_a_writer_that_vanished_mid_commit_does_not_stall_the_timeline(pg_url):
    """A catalog replica killed while its commit transaction held the timeline's upper row
    lock, with no FIN reaching the server (seen on the dev node with a Spark driver: the rerun
    waited 15 min and more)."""
    import subprocess
    import sys

    from tsoracle.catalog import state
    from tsoracle.store import open_backend, parse_url

    await tsoracle.init(pg_url, timelines=[COUNTER])
    backend = open_backend(parse_url(pg_url))
    await backend.open()
    writer = None
    try:
        await state.ensure(backend, "t")
        writer = subprocess.Popen([sys.executable, "-c", _FROZEN_WRITER, pg_url],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None
        session = int(await asyncio.to_thread(writer.stdout.readline))
        # Before the fix the session stayed idle in transaction, its lock held, for as long
        # as TCP took to give up: this raise (a linearized read's second step) never returned.
        async with asyncio.timeout(60):
            await state.raise_upper(backend, "t", 10)
        assert await state.upper(backend, "t") == 10
        # The server ended the frozen writer's session and rolled its +1 back.
        assert not await backend.fetch(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %(p)s", {"p": session})
        assert await backend.fetch(
            "SELECT upper FROM {iceberg_uppers} WHERE timeline = 't'") == [(10,)]
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
            writer.stdout.close()  # type: ignore[union-attr]
        await backend.close()


async def test_a_client_stalled_mid_transaction_is_rolled_back_and_retried(pg_url,
                                                                          monkeypatch):
    """The other side of the limit: a live client that sat idle in its transaction for longer
    (a stalled event loop) gets its transaction run again, once, after the server's rollback."""
    from tsoracle.catalog import state
    from tsoracle.store import open_backend, parse_url, postgres

    monkeypatch.setattr(postgres, "IDLE_IN_TRANSACTION_S", 1)
    await tsoracle.init(pg_url, timelines=[COUNTER])
    backend = open_backend(parse_url(pg_url))
    await backend.open()
    attempts = 0

    async def body(tx: tsoracle.store.Tx) -> None:
        nonlocal attempts
        attempts += 1
        await tx.fetch("UPDATE {iceberg_uppers} SET upper = upper + 1 WHERE timeline = 't'")
        if attempts == 1:
            await asyncio.sleep(3)  # past the limit: the server ends the session meanwhile

    try:
        await state.ensure(backend, "t")
        await backend.transaction(body)
        assert attempts == 2
        assert await state.upper(backend, "t") == 1  # the first attempt's +1 never landed
    finally:
        await backend.close()


async def test_a_shorter_idle_transaction_limit_is_kept(pg, database):
    """The product's 10 s limit applies unless the server, the role or the URL sets less."""
    import psycopg
    from psycopg import sql

    from tsoracle.store import open_backend, parse_url

    async def limit(url: str) -> str:
        backend = open_backend(parse_url(url))
        await backend.open()
        try:
            rows = await backend.fetch("SHOW idle_in_transaction_session_timeout")
            return str(rows[0][0])
        finally:
            await backend.close()

    def database_default(value: str) -> None:
        with psycopg.connect(database, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout"
                                  " = {}").format(sql.Identifier(admin.info.dbname),
                                                  sql.Literal(value)))

    assert await limit(database) == "10s"
    assert await limit(database + "?options=-c%20idle_in_transaction_session_timeout%3D2s") \
        == "2s"  # the URL's
    database_default("3s")  # a DBA's shorter limit
    assert await limit(database) == "3s"
    database_default("1h")
    assert await limit(database) == "10s"
