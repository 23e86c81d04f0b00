"""Issue 26, findings 3 to 5: what the operator logs names no database host; a fenced oracle's
errors do not pile up frames; one unreachable database does not hold up the others.

Real PostgreSQL and SQLite throughout; the one stand-in is a dead server (a socket that accepts
and never answers), which is what an unreachable database looks like to a client.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import traceback
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg_pool
import pytest

import tsoracle
from tsoracle.errors import LeadershipLost
from tsoracle.fencing import ensure_tables, tables_exist
from tsoracle.operator import logs
from tsoracle.operator.backends import SharedBackends
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.store import parse_url, schema
from tsoracle_dev.localpg import LocalPostgres

COUNTER = "counter:findings"
CALLS = 2_000


def _by_name(url: str) -> str:
    """The same server named by a host name: libpq's messages and psycopg's reprs then show
    `localhost`, which no address pattern catches (127.0.0.1 would be masked by chance)."""
    return url.replace("@127.0.0.1:", "@localhost:", 1)


def _port(url: str) -> str:
    return str(urlsplit(url).port)


# --- Finding 3: the database host in the operator's log ------------------------------------

@pytest.fixture
def operator_logging() -> Iterator[None]:
    """The operator's own log setup (logs.install), undone afterwards for the other tests."""
    names = ["psycopg", "psycopg.pool", "tsoracle.store.schema", "kopf.objects",
             "kopf.activities", "kopf._core.engines.activities", "urllib3.connectionpool"]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names}
    handlers = {h: list(h.filters) for h in logging.getLogger().handlers}
    logs.install(verbose=False)
    yield
    for name, (level, filters) in saved.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).filters[:] = filters
    for handler, filters in handlers.items():
        handler.filters[:] = filters


async def test_a_refused_table_option_is_logged_without_the_host(pg: LocalPostgres, caplog):
    """No CockroachDB can run here: PostgreSQL refuses CockroachDB's table options (as a role
    without the ZONECONFIG privilege would), which takes the same path through the code.
    Before: `table option … not set on postgresql://tsoracle:***@localhost:PORT/tsoracle`."""
    caplog.set_level(logging.INFO, logger="tsoracle.store.schema")
    schema._explained.clear()
    name = f"o_{uuid.uuid4().hex[:8]}"
    url = f"{_by_name(pg.url())}?schema={name}"
    async with admin_backend(url) as backend:
        backend.dialect.cockroach = True
        statements = [str(s) for _, s in backend.dialect.hot_table_options("timestamps")]
        await ensure_tables(backend, implementation="distributed", fence="Always")
        assert await tables_exist(backend)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(statements) == 2
    for text, statement in zip(warned, statements, strict=True):
        for secret in ("localhost", f":{_port(url)}", "tsoracle-test-pw", "postgresql://"):
            assert secret not in text.lower(), (secret, text)
        # What was refused, for whom, and what to do.
        assert f"table timestamps of schema {name} for role {parse_url(url).user}" in text
        assert text.endswith(f"a database admin can run: {statement}")


async def test_the_operators_log_setup_masks_psycopgs_connection_repr(pg: LocalPostgres, caplog,
                                                                      operator_logging):
    """psycopg's pool logs a connection it rolls back as `<psycopg.AsyncConnection [INTRANS]
    (host=localhost port=PORT user=… database=…) at 0x…>`: the filter the operator installs
    masks the address. Before: the record kept `host=localhost port=PORT`."""
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    url = _by_name(pg.url())
    async with psycopg_pool.AsyncConnectionPool(url, min_size=1, open=False) as pool:
        conn = await pool.getconn()
        await conn.execute("SELECT 1")  # a transaction left open: the pool rolls it back
        await pool.putconn(conn)
    said = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"
            and r.getMessage().startswith("rolling back returned connection")]
    assert len(said) == 1, caplog.text
    assert "<psycopg.AsyncConnection [INTRANS] (<backend>) at 0x" in said[0], said[0]
    assert "localhost" not in said[0] and f"port={_port(url)}" not in said[0], said[0]


# --- Finding 4: a fenced oracle's error, raised again and again ----------------------------

def _frames(exc: BaseException) -> int:
    return sum(1 for _ in traceback.walk_tb(exc.__traceback__))


async def _raised(call, times: int) -> list[tsoracle.Fenced]:
    caught = []
    for _ in range(times):
        with pytest.raises(tsoracle.Fenced) as info:
            await call()
        caught.append(info.value)
    return caught


def _bounded(caught: list[tsoracle.Fenced]) -> None:
    """Each call its own error, of one type and message, with a traceback of its own frames.
    Before: one object whose traceback grew by ~5 frames a call (10,002 after 2,000)."""
    first, last = caught[1], caught[-1]  # [0] is the first discovery (a longer path)
    assert len({id(e) for e in caught}) == len(caught)
    assert {type(e) for e in caught} == {type(first)}
    assert {str(e) for e in caught} == {str(first)}
    assert _frames(last) <= _frames(first) < 20, (_frames(first), _frames(last))


async def test_a_flipped_out_legacy_leader_raises_a_fresh_fenced_each_call(sqlite_url):
    await tsoracle.init(sqlite_url, timelines=[COUNTER], implementation="legacy")
    async with tsoracle.connect(sqlite_url, timeline=COUNTER, implementation="legacy") as old:
        await old.write_ts()
        await tsoracle.flip(sqlite_url, to="distributed")
        caught = await _raised(old.read_ts, CALLS)
    assert "active implementation is now 'distributed'" in str(caught[-1])
    _bounded(caught)


async def test_a_reopening_client_raises_a_fresh_leadership_lost_each_call(pg: LocalPostgres):
    url = f"{pg.url()}?schema=f_{uuid.uuid4().hex[:8]}"
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    client = ReopeningOracle(
        lambda: tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy"),
        name=COUNTER)
    try:
        await client.write_ts()
        async with tsoracle.connect(url, timeline=COUNTER, implementation="legacy") as other:
            await other.write_ts()  # another process took the timeline over
            caught = await _raised(client.read_ts, CALLS)
    finally:
        await client.close()
    assert all(isinstance(e, LeadershipLost) for e in caught)
    _bounded(caught)


# --- Finding 5: an unreachable database and the others -------------------------------------

@pytest.fixture
def dead_server() -> Iterator[socket.socket]:
    """A TCP port that accepts connections (the kernel completes them) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        listener.setblocking(False)
        yield listener


async def test_an_unreachable_database_does_not_hold_up_a_healthy_one(pg: LocalPostgres,
                                                                      dead_server):
    """Before: one lock over every open, so the healthy resource waited for the dead one's
    connect_timeout; it finished after the dead one failed."""
    port = dead_server.getsockname()[1]
    dead = f"postgresql://tsoracle:pw@127.0.0.1:{port}/tsoracle?connect_timeout=3&schema=d"
    healthy = f"{pg.url()}?schema=h_{uuid.uuid4().hex[:8]}"
    backends = SharedBackends(pool_size=2)
    finished: list[str] = []

    async def get(resource: str, url: str) -> object:
        try:
            return await backends.get(resource, url)
        finally:
            finished.append(resource)

    loop = asyncio.get_running_loop()
    accepted: list[socket.socket] = []
    try:
        # Two resources on the dead database share one attempt; the healthy one starts only
        # once that attempt is connected and waiting for an answer.
        stuck = [asyncio.create_task(get(f"ns/dead-{i}", dead)) for i in range(2)]
        accepted.append((await asyncio.wait_for(loop.sock_accept(dead_server), 30))[0])
        view = await get("ns/healthy", healthy)
        assert finished == ["ns/healthy"]
        assert await view.fetch("SELECT 1") == [(1,)]
        for outcome in await asyncio.gather(*stuck, return_exceptions=True):
            assert isinstance(outcome, tsoracle.OracleUnavailable), outcome
        assert finished[0] == "ns/healthy" and sorted(finished[1:]) == ["ns/dead-0", "ns/dead-1"]
        with pytest.raises(BlockingIOError):
            dead_server.accept()  # no second connection: the two shared one attempt
    finally:
        await backends.close()
        for conn in accepted:
            conn.close()


async def test_a_resource_moving_databases_leaves_the_other_users_served(pg: LocalPostgres):
    """A Secret that now names another database: the old database's backend stays open while
    another resource uses it and closes with its last user."""
    one = f"{pg.url()}?schema=a_{uuid.uuid4().hex[:8]}"
    other_db = "db_" + uuid.uuid4().hex[:10]
    pg.sql(f"CREATE DATABASE {other_db} OWNER tsoracle", "postgres")
    two = f"{pg.url(database=other_db)}?schema=b_{uuid.uuid4().hex[:8]}"
    backends = SharedBackends(pool_size=2)
    try:
        a, b = await asyncio.gather(backends.get("ns/a", one), backends.get("ns/b", one))
        moved, b_again = await asyncio.gather(backends.get("ns/a", two),
                                              backends.get("ns/b", one))
        for view in (a, b, moved, b_again):
            assert await view.fetch("SELECT 1") == [(1,)]
        await backends.forget("ns/b")
        with pytest.raises(tsoracle.OracleClosed):
            await b.fetch("SELECT 1")  # its last user is gone: closed
        assert await moved.fetch("SELECT 1") == [(1,)]
    finally:
        await backends.close()
