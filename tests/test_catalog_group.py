"""Group commit in the catalog: commits that queue while a group lands share the next
transaction and its one timestamp, and one whose table moved lands nothing while the rest of
its group lands (a savepoint each)."""

from __future__ import annotations

import asyncio
import math
import uuid
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    SetCurrentSchemaUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
)
from pyiceberg.types import LongType, NestedField

import tsoracle
from tests.conftest import fresh_schema
from tsoracle.catalog import idempotency, state
from tsoracle.catalog.errors import (
    BadRequest,
    CommitFailed,
    CommitStateUnknown,
    NoSuchTable,
    Unavailable,
)
from tsoracle.catalog.metadata import Warehouse
from tsoracle.catalog.ordering import Ordering, Plan
from tsoracle.catalog.service import Catalog, Change
from tsoracle.oracle.commit_engine import Conflict, Failed, Landed
from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle_dev.pgfaults import LossyRelay

pytestmark = pytest.mark.serializable

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


async def _catalog(url: str, warehouse: Path, pool_size: int = 10) -> Catalog:
    await tsoracle.init(url)
    backend = await open_instrumented_backend(url, "catalog", pool_size=pool_size)
    store = Warehouse(str(warehouse))
    ordering = Ordering(url, "EpochMilliseconds", backend,
                        cleanup=lambda files: asyncio.to_thread(store.delete, files))
    await state.ensure(backend, "EpochMilliseconds")
    return Catalog(backend, ordering, store)


async def _tables(catalog: Catalog, n: int) -> list[str]:
    from pyiceberg.catalog.rest import CreateTableRequest

    await catalog.create_namespace(("db",), {})
    names = [f"t{i}" for i in range(n)]
    for name in names:
        await catalog.create_table(("db",), CreateTableRequest.model_validate(
            {"name": name, "location": None, "schema": SCHEMA.model_dump(by_alias=True),
             "partition-spec": None, "write-order": None}))
    return names


def _set(name: str, value: str) -> Change:
    return Change(("db",), name, (), (SetPropertiesUpdate(updates={"k": value}),))


async def test_commits_queued_together_land_at_one_timestamp(url, tmp_path):
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        names = await _tables(catalog, 10)
        # All ten queue before the first group starts (each runs to its first wait in turn).
        done = await asyncio.gather(*(catalog.commit([_set(n, "x")]) for n in names))
        stamps = {d[0].metadata.last_updated_ms for d in done}
        assert len(stamps) == 1  # one group, one W
        assert all(d[0].metadata.properties["k"] == "x" for d in done)
        # Two commits to one table share a group too: the second is built on the first.
        first, second = await asyncio.gather(catalog.commit([_set("t0", "1")]),
                                             catalog.commit([_set("t0", "2")]))
        assert first[0].metadata.last_updated_ms == second[0].metadata.last_updated_ms
        assert first[0].metadata_location in {
            e.metadata_file for e in second[0].metadata.metadata_log}
        assert (await catalog.load_table(("db",), "t0")).metadata.properties["k"] == "2"
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_commits_to_one_table_share_a_group_in_arrival_order(url, tmp_path):
    """Eight commits to one table, queued together: one W, each on the one before (its own
    metadata file, the earlier ones in its metadata log), one whose requirement fails on
    what the earlier ones left refused alone."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 1)
        changes = [Change(("db",), "t0", (), (SetPropertiesUpdate(updates={f"k{i}": "v"}),))
                   for i in range(8)]
        # The fifth asserts a schema the table never has: refused, and only it.
        changes[4] = Change(("db",), "t0", (AssertCurrentSchemaId(current_schema_id=1),),
                            changes[4].updates)
        done = await asyncio.gather(*(catalog.commit([c]) for c in changes),
                                    return_exceptions=True)
        assert isinstance(done[4], CommitFailed), done[4]
        landed = [d[0] for i, d in enumerate(done) if i != 4]
        assert len({d.metadata.last_updated_ms for d in landed}) == 1  # one group, one W
        files = [d.metadata_location for d in landed]
        assert len(set(files)) == 7
        table = await catalog.load_table(("db",), "t0")
        assert table.metadata_location == files[-1]
        assert set(table.metadata.properties) == {f"k{i}" for i in range(8) if i != 4}
        logged = [e.metadata_file for e in table.metadata.metadata_log]
        assert logged[-6:] == files[:-1]  # in arrival order
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_refusal_on_what_an_earlier_member_leaves_stands_only_if_it_landed(url,
                                                                                 tmp_path):
    """Before: the second commit was checked on the first's new schema and refused (409,
    "found 1") though the first never landed (its new location is another table's folder):
    refused on a state the table never had. Now it is tried again, and lands."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 2)
        taken = (await catalog.load_table(("db",), "t1")).metadata.location
        wider = Schema(NestedField(1, "id", LongType(), required=False),
                       NestedField(2, "x", LongType(), required=False), schema_id=1)
        moves = Change(("db",), "t0", (), (AddSchemaUpdate(schema_=wider, last_column_id=2),
                                           SetCurrentSchemaUpdate(schema_id=-1),
                                           SetLocationUpdate(location=taken)))
        keeps = Change(("db",), "t0", (AssertCurrentSchemaId(current_schema_id=0),),
                       (SetPropertiesUpdate(updates={"k": "v"}),))
        done = await asyncio.gather(catalog.commit([moves]), catalog.commit([keeps]),
                                    return_exceptions=True)
        assert isinstance(done[0], BadRequest) and "overlaps" in str(done[0]), done[0]
        assert not isinstance(done[1], BaseException), done[1]
        table = await catalog.load_table(("db",), "t0")
        assert (table.metadata.current_schema_id, table.metadata.properties.get("k")) == (0, "v")
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_commits_behind_a_drop_of_their_table_wait_for_the_next_group(url, tmp_path):
    """A drop queued before two commits to its table: the commits are not built on anything
    the drop leaves; they go to the next group and find no table there (404)."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 2)
        done = await asyncio.gather(catalog.drop_table(("db",), "t0", False),
                                    catalog.commit([_set("t0", "1")]),
                                    catalog.commit([_set("t0", "2")]),
                                    catalog.commit([_set("t1", "3")]), return_exceptions=True)
        assert done[0] is None
        assert [type(d) for d in done[1:3]] == [NoSuchTable, NoSuchTable], done
        assert done[3][0].metadata.properties["k"] == "3"
        assert await catalog.table_exists(("db",), "t0") is False
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_member_whose_table_moved_lands_nothing_and_the_rest_land(url, tmp_path):
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 2)
        t0 = await state.pointer(catalog.backend, ("db",), "t0")
        t1 = await state.pointer(catalog.backend, ("db",), "t1")
        assert t0 is not None and t1 is not None
        stale = Plan("stale", swaps=[state.Swap(("db",), "t0", "not-its-pointer", "x")])
        good = Plan("good", swaps=[state.Swap(("db",), "t1", t1.metadata_location, "y")])
        results = await asyncio.gather(catalog.ordering._attempt(_const(stale), 0),
                                       catalog.ordering._attempt(_const(good), 0))
        assert results == [Conflict("its table moved"), Landed("good")]  # try again, landed
        assert (await state.pointer(catalog.backend, ("db",), "t0")) == t0
        moved = await state.pointer(catalog.backend, ("db",), "t1")
        assert moved is not None and moved.metadata_location == "y"
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


def _const(plan: Plan[str]):
    async def build(ts: int, attempt: int) -> Plan[str]:
        return plan
    return build


async def test_an_unexpected_failure_answers_the_group_instead_of_hanging(url, tmp_path,
                                                                       monkeypatch):
    """A failure of no expected kind inside a group's landing left its requests waiting
    forever (their futures were never resolved); now each gets the error, and the catalog
    serves the next commit."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        names = await _tables(catalog, 2)

        async def broken(*args: object) -> None:
            raise RuntimeError("a bug")

        def broken_at_once(*args: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(state, "record_commit", broken)  # a statement at a time (SQLite)
        monkeypatch.setattr(state, "claim_at_once", broken_at_once)  # sent at once (PostgreSQL)
        outcomes = await asyncio.wait_for(asyncio.gather(
            *(catalog.commit([_set(n, "x")]) for n in names), return_exceptions=True), 30)
        # Whether they landed is not known there: "may have landed" (504), never a bare 500.
        assert [type(o) for o in outcomes] == [CommitStateUnknown, CommitStateUnknown]
        monkeypatch.undo()
        done = await asyncio.wait_for(catalog.commit([_set(names[0], "y")]), 30)
        assert done[0].metadata.properties["k"] == "y"
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_commit_is_four_round_trips_and_so_is_a_group_on_postgresql(pg, tmp_path):
    """On PostgreSQL a group's transaction goes in one round trip (pipeline mode): a commit
    costs the pointer read, `write_ts`, the transaction and `apply_write`, counted on the wire
    by a relay (one reply per round trip). Before: eight, a statement at a time. Counted once
    the connections are set up: a new connection's settings, and each statement's first
    preparation on a connection, are a round trip each, once."""
    relay = LossyRelay(pg.port)
    catalog = await _catalog(relay.url(f"{pg.url()}?schema={fresh_schema()}"),
                             tmp_path / "wh", pool_size=2)
    try:
        names = await _tables(catalog, 8)

        async def group(value: str) -> int:
            before = relay.delivered
            done = await asyncio.gather(*(catalog.commit([_set(n, value)]) for n in names),
                                        catalog.commit([_set("t0", "again")]))
            assert len({d[0].metadata.last_updated_ms for d in done}) == 1  # one group
            return relay.delivered - before

        for value in ("set", "up", "both connections"):
            await group(value)
        # The once-a-minute pruning of old commit marks is no commit's cost: never, here.
        catalog.ordering._pruned_at = math.inf
        before = relay.delivered
        for i in range(5):
            await catalog.commit([_set("t0", str(i))])
        assert relay.delivered - before == 5 * 4
        # A pointer read per table (the second commit to t0 is built on the first), 3 more.
        assert [await group("a"), await group("b")] == [len(names) + 3] * 2
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()
        relay.close()


async def test_a_group_that_finds_the_upper_passed_lands_nothing(url, tmp_path):
    """A read sealed the upper above the group's W before it landed: sent at once, the claim
    fails and with it every move; nothing landed and the commit is tried again."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 1)
        t0 = await state.pointer(catalog.backend, ("db",), "t0")
        assert t0 is not None

        async def sealed_above(ts: int, attempt: int) -> Plan[str]:
            await state.raise_upper(catalog.backend, "EpochMilliseconds", ts + 1)
            return Plan("p", swaps=[state.Swap(("db",), "t0", t0.metadata_location, "x")])

        outcome = await catalog.ordering._attempt(sealed_above, 0)
        assert outcome == Conflict("its timestamp fell behind the upper")
        assert await state.pointer(catalog.backend, ("db",), "t0") == t0
        assert await catalog.ordering.closed() > 0  # and the catalog commits again
        done = await catalog.commit([_set("t0", "after")])
        assert done[0].metadata.properties["k"] == "after"
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_member_whose_key_is_taken_is_refused_alone(url, tmp_path):
    """A member's Idempotency-Key already has a live row (another replica landed a request
    with it): that member lands nothing and answers KeyTaken; its group's other member
    lands. Sent at once, the taken key fails the whole transaction, which is then sorted out
    a member at a time."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 2)
        key = str(uuid.uuid4())
        await catalog.backend.transaction(lambda tx: state.record_key(tx, key, "f", 1, 0))
        t0, t1 = [await state.pointer(catalog.backend, ("db",), n) for n in ("t0", "t1")]
        assert t0 is not None and t1 is not None
        keyed = Plan("keyed", swaps=[state.Swap(("db",), "t0", t0.metadata_location, "x")])
        other = Plan("other", swaps=[state.Swap(("db",), "t1", t1.metadata_location, "y")])

        async def with_key() -> object:
            idempotency.CURRENT.set(idempotency.Mark(key, "another fingerprint", 0))
            return await catalog.ordering._attempt(_const(keyed), 0)

        results = await asyncio.gather(with_key(), catalog.ordering._attempt(_const(other), 0))
        assert isinstance(results[0], Failed), results[0]
        assert isinstance(results[0].error, idempotency.KeyTaken)
        assert results[1] == Landed("other")
        assert await state.pointer(catalog.backend, ("db",), "t0") == t0
        assert await state.stored_key(catalog.backend, key, 0) == ("f", None, None)  # kept
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_stopped_group_task_answers_every_commit_waiting_on_it(url, tmp_path):
    """Before: cancelling the task that lands the groups (a shutdown cancels every task)
    left the commits of its group and those queued behind it waiting forever. Now the
    group's get "may have landed" (504) and the queued ones "nothing landed, send it again"
    (503); the next commit starts a new task."""
    catalog = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(catalog, 2)
        t0 = await state.pointer(catalog.backend, ("db",), "t0")
        assert t0 is not None
        entered = asyncio.Event()

        async def stuck(ts: int, attempt: int) -> Plan[str]:
            entered.set()
            await asyncio.Event().wait()
            raise AssertionError("never built")

        in_group = asyncio.ensure_future(catalog.ordering.commit(stuck))
        await asyncio.wait_for(entered.wait(), 30)
        queued = asyncio.ensure_future(catalog.commit([_set("t1", "x")]))
        await asyncio.sleep(0.05)  # queued behind the stuck group
        task = catalog.ordering._groups._task  # no public handle: the test plays a shutdown
        assert task is not None
        task.cancel()
        done = await asyncio.wait_for(asyncio.gather(in_group, queued, return_exceptions=True),
                                      30)
        assert [type(d) for d in done] == [CommitStateUnknown, Unavailable], done
        assert await state.pointer(catalog.backend, ("db",), "t0") == t0
        after = await asyncio.wait_for(catalog.commit([_set("t1", "y")]), 30)
        assert after[0].metadata.properties["k"] == "y"
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()


async def test_a_commit_whose_outcome_is_unknown_keeps_its_metadata_file(pg, tmp_path):
    """Found by attack: a group sent at once landed, its reply was lost, and another replica
    moved one of its tables before the resend; that member's outcome is unknown (504), and
    its metadata file, named by the table's metadata log since it did land, was deleted."""
    from urllib.parse import urlparse

    url = f"{pg.url()}?schema={fresh_schema()}"
    a = await _catalog(url, tmp_path / "wh")
    b = await _catalog(url, tmp_path / "wh")
    try:
        await _tables(a, 2)
        real = a.backend.at_once
        sends = 0

        async def reply_lost_then_table_moved(statements):
            nonlocal sends
            sends += 1
            rows = await real(statements)
            if sends > 1:
                return rows
            await b.commit([Change(("db",), "t0", (), (SetPropertiesUpdate(updates={"b": "1"}),))])
            return await real(statements)  # the resend, as after a lost reply: refused

        a.backend.at_once = reply_lost_then_table_moved  # type: ignore[method-assign]
        done = await asyncio.gather(a.commit([_set("t0", "a")]), a.commit([_set("t1", "a")]),
                                    return_exceptions=True)
        assert isinstance(done[0], CommitStateUnknown) and not isinstance(done[1], Exception)
        table = await b.load_table(("db",), "t0")
        assert table.metadata.properties == {"k": "a", "b": "1"}  # a's commit did land
        files = [e.metadata_file for e in table.metadata.metadata_log]
        assert files and all(Path(urlparse(f).path).exists() for f in files), files
    finally:
        for catalog in (a, b):
            await catalog.ordering.close()
            await catalog.backend.close()


async def test_without_pipeline_mode_a_group_goes_a_statement_at_a_time(pg, tmp_path,
                                                                     monkeypatch):
    """psycopg on a libpq older than 14 has no pipeline mode: such a catalog commits a
    statement at a time rather than failing every group (psycopg's NotSupportedError would
    have been a 504 each). libpq 14+ is what runs here; its answer is replaced."""
    import psycopg

    monkeypatch.setattr(psycopg.AsyncPipeline, "is_supported", classmethod(lambda cls: False))
    catalog = await _catalog(f"{pg.url()}?schema={fresh_schema()}", tmp_path / "wh")
    try:
        assert catalog.backend.sends_at_once is False
        names = await _tables(catalog, 3)
        done = await asyncio.gather(*(catalog.commit([_set(n, "x")]) for n in names))
        assert all(d[0].metadata.properties["k"] == "x" for d in done)
    finally:
        await catalog.ordering.close()
        await catalog.backend.close()
