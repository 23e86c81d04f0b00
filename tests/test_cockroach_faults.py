"""CockroachDB's failure shape, made on a real PostgreSQL (tools/pgfaults.py): statements that
fail with SQLSTATE 40001 before they apply, and replies lost after the server applied them.

No CockroachDB binary can run on these machines; the errors it returns can, and that is what
the oracle sees of it. The Porcupine checks of the same faults are the lincheck scenarios
`serialization-faults` and `lost-replies` (tests/test_lincheck.py).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from history import check
from pgfaults import LossyRelay, SerializationFaults
from support.workload import Recorder

import tsoracle
from tsoracle.oracle.metrics import RETRIES
from tsoracle.store import RetryPolicy

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
        url = relay.url(f"{pg.url()}?schema=l_{uuid.uuid4().hex[:8]}")
        await tsoracle.init(url, timelines=[COUNTER], implementation=impl)
        relay.rate = rate
        before = RETRIES.total(reason="connection", implementation=impl)
        rec = await _workload(url, impl, 600)
        retried = RETRIES.total(reason="connection", implementation=impl) - before
        assert rec.errors == 0 and rec.fenced == 0 and not rec.capped
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
