"""CockroachDB's failure shape, made on a real PostgreSQL (tsoracle_dev.pgfaults): statements that
fail with SQLSTATE 40001 before they apply, and replies lost after the server applied them.

No CockroachDB binary can run on these machines; the errors it returns can, and that is what
the oracle sees of it. The Porcupine checks of the same faults are the lincheck scenarios
`serialization-faults` and `lost-replies` (tests/test_lincheck.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

import tsoracle
from tsoracle.fencing import ensure_tables, tables_exist
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.metrics import RETRIES
from tsoracle.store import RetryPolicy, schema
from tsoracle.store.postgres import is_cockroach
from tsoracle_dev.lincheck.history import check
from tsoracle_dev.pgfaults import LossyRelay, SerializationFaults
from tsoracle_dev.workload import Recorder

COUNTER = "counter:crdb"
RATES = [0.05, 0.30]


async def _workload(url: str, impl: str, ops: int) -> Recorder:
    rec = Recorder(url, COUNTER, impl, "faulted")
    stop = asyncio.Event()
    work = asyncio.create_task(rec.run(16, stop=stop.is_set))
    async with asyncio.timeout(300):  # only a hang reaches this
        while len(rec.ops) < ops:
            assert not work.done(), "the workload ended early"
            await asyncio.sleep(0.01)
    stop.set()
    await work
    return rec


@pytest.fixture
def faults(pg, database):
    injector = SerializationFaults(pg, database.rsplit("/", 1)[1])
    yield injector
    injector.set_rate(0.0)


@pytest.mark.parametrize("rate", RATES)
async def test_injected_serialization_failures_are_retried_unseen(faults, database, impl, rate):
    schema = "f_" + uuid.uuid4().hex[:8]
    url = f"{database}?schema={schema}"
    await tsoracle.init(url, timelines=[COUNTER], implementation=impl)
    faults.install(schema)
    faults.set_rate(rate)
    before = RETRIES.total(reason="serialization_failure", implementation=impl)
    rec = await _workload(url, impl, 600)
    retried = RETRIES.total(reason="serialization_failure", implementation=impl) - before
    assert rec.errors == 0 and rec.fenced == 0 and not rec.capped
    assert check(rec.ops) == []
    assert retried > 0  # the faults were real, and counted where an operator looks


@pytest.mark.parametrize("rate", RATES)
async def test_lost_replies_are_retried_unseen(pg, impl, rate):
    relay = LossyRelay(pg.port)
    try:
        # Opening also loses replies (each new connection's one statement): at 30 %, on a busy
        # machine, the default 5 s to open a pool was spent once (a CI run: 16 clients saw
        # "pool initialization incomplete"). The operations' retries are what this tests.
        url = relay.url(f"{pg.url()}?schema=l_{uuid.uuid4().hex[:8]}&connect_timeout=30")
        await tsoracle.init(url, timelines=[COUNTER], implementation=impl)
        relay.rate = rate
        before = RETRIES.total(reason="connection", implementation=impl)
        rec = await _workload(url, impl, 600)
        retried = RETRIES.total(reason="connection", implementation=impl) - before
        assert rec.errors == 0, rec.error_messages
        assert rec.fenced == 0 and not rec.capped
        assert check(rec.ops) == []
        assert relay.lost > 0 and retried >= relay.lost * 0.5, (relay.lost, retried)
    finally:
        relay.close()


async def test_a_spent_retry_budget_names_the_contention(faults, database):
    schema = "f_" + uuid.uuid4().hex[:8]
    url = f"{database}?schema={schema}"
    await tsoracle.init(url, timelines=[COUNTER])
    faults.install(schema)
    oracle = await tsoracle.open_oracle(url, timeline=COUNTER, retry=RetryPolicy(timeout=0.5))
    try:
        faults.set_rate(1.0)
        with pytest.raises(tsoracle.Contended) as err:
            await oracle.write_ts()
    finally:
        faults.set_rate(0.0)
        await oracle.close()
    text = str(err.value)
    assert "conflicted with concurrent transactions" in text and "40001" in text
    assert "server is up" in text and "retry budget" in text
    assert "tsoracle-test-pw" not in text


async def test_a_spent_retry_budget_on_lost_replies_says_so(pg):
    relay = LossyRelay(pg.port)
    try:
        url = relay.url(f"{pg.url()}?schema=l_{uuid.uuid4().hex[:8]}")
        await tsoracle.init(url, timelines=[COUNTER])
        oracle = await tsoracle.open_oracle(url, timeline=COUNTER,
                                            retry=RetryPolicy(timeout=0.5))
        try:
            relay.rate = 1.0
            with pytest.raises(tsoracle.OracleUnavailable, match="still failing after") as err:
                await oracle.write_ts()
            assert not isinstance(err.value, tsoracle.Contended)
            assert "tsoracle-test-pw" not in str(err.value)
        finally:
            relay.rate = 0.0
            await oracle.close()
    finally:
        relay.close()


async def test_the_pool_reconnects_soon_after_an_outage(pg):
    """psycopg_pool doubles its reconnect delay without a cap (1, 2, 4, 8, 16 s), so after a
    16 s outage a caller waited about 15 s more for a server that was back; under lost
    replies, a run of failed connection attempts stalled every caller past its budget."""
    outage = 16.0
    relay = LossyRelay(pg.port)
    try:
        url = relay.url(f"{pg.url()}?schema=l_{uuid.uuid4().hex[:8]}")
        await tsoracle.init(url, timelines=[COUNTER])
        oracle = await tsoracle.open_oracle(url, timeline=COUNTER)
        try:
            await oracle.write_ts()
            relay.cut(outage)
            began = time.monotonic()
            await oracle.write_ts()  # waits the outage out within its 30 s budget
            late = time.monotonic() - began - outage
        finally:
            await oracle.close()
    finally:
        relay.close()
    # The bound is the pool's schedule, not this machine's speed: ~15 s before, ~2 s now.
    assert late < 8.0, f"served {late:.1f}s after the server was back"


# --- CockroachDB's dialect details, as far as PostgreSQL can check them -------------------

@pytest.mark.parametrize(("version", "cockroach"), [
    ("CockroachDB CCL v23.2.4 (x86_64-pc-linux-gnu, built 2024/04/08 21:09:25, go1.21.9 X:nocoverageredesign)", True),  # noqa: E501
    ("CockroachDB OSS v21.1.0 (x86_64-unknown-linux-gnu, built 2021/05/17)", True),
    ("PostgreSQL 15.8 (Debian 15.8-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc", False),
    ("PostgreSQL 16.2 on aarch64-apple-darwin, a build tagged CockroachDB-compat", False),
])
def test_the_dialect_follows_the_servers_version_string(version, cockroach):
    assert is_cockroach(version) is cockroach


async def test_postgresql_skips_cockroach_table_options_and_says_why_once(pg, caplog):
    caplog.set_level(logging.INFO, logger="tsoracle.store.schema")
    schema._explained.clear()
    for _ in range(2):
        await tsoracle.init(f"{pg.url()}?schema=o_{uuid.uuid4().hex[:8]}")
    said = [r for r in caplog.records if "CockroachDB's table options" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "gc.ttlseconds = 600" in said[0].getMessage()


async def test_a_refused_table_option_is_skipped_with_the_statement_to_run(pg, caplog):
    # PostgreSQL refuses CockroachDB's statements as a CockroachDB role without the
    # ZONECONFIG privilege would: provisioning goes on and logs what an admin can run.
    caplog.set_level(logging.INFO, logger="tsoracle.store.schema")
    schema._explained.clear()
    url = f"{pg.url()}?schema=o_{uuid.uuid4().hex[:8]}"
    async with admin_backend(url) as backend:
        backend.dialect.cockroach = True
        statements = [str(s) for _, s in backend.dialect.hot_table_options("timestamps")]
        assert any("CONFIGURE ZONE USING gc.ttlseconds = 600" in s for s in statements)
        assert any("sql_stats_automatic_collection_enabled = false" in s for s in statements)
        assert all(f'"{backend.url.schema}"."timestamps"' in s for s in statements)
        await ensure_tables(backend, implementation="distributed", fence="Always")
        assert await tables_exist(backend)
        await ensure_tables(backend, implementation="distributed", fence="Always")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2  # one per option, not again on the next provisioning
    for text, statement in zip(warned, statements, strict=True):
        assert text.endswith(f"a database admin can run: {statement}")
        assert "tsoracle-test-pw" not in text
