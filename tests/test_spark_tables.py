"""Timestamped tables under ambiguity and odd input (issue 12): real local Spark, real PostgreSQL
(reached through a relay that loses a COMMIT reply or cuts connections) and SQLite files.

Each test names what the code did before its fix.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest

import tsoracle
from tsoracle.errors import ConfigError, LeadershipLost
from tsoracle.spark import OracleClient
from tsoracle.store import RetryPolicy
from tsoracle_dev.pgfaults import LossyRelay

pytestmark = pytest.mark.serializable  # CockroachDB's isolation too (conftest.py)

SCHEMA = "k INT, v STRING"


@pytest.fixture
def relay(pg):
    proxy = LossyRelay(pg.port)
    yield proxy
    proxy.close()


@pytest.fixture
def pg_oracle(pg, relay):
    url = relay.url(f"{pg.url()}?schema=t_{uuid.uuid4().hex[:10]}")
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    return url


@pytest.fixture
def local_client(sqlite_url, tmp_path):
    """A driver client on a fresh embedded (SQLite) oracle."""
    asyncio.run(tsoracle.init(sqlite_url))
    client = OracleClient(sqlite_url, data_dir=tmp_path / "tables")
    yield client
    client.close()


def frame(spark, rows, schema: str = SCHEMA):
    return spark.createDataFrame(rows, schema)


def sorted_rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def commits(client: OracleClient, table: str) -> list[tuple[int, str]]:
    from tsoracle.spark import catalog

    return client.run(catalog.commits_as_of(client.backend, table, 2**64 - 1))


def test_a_lost_commit_reply_neither_loses_nor_duplicates(spark, pg_oracle, relay, tmp_path):
    # Before: the retried transaction met its own commit, raised Conflict, and the files of
    # the commit that had landed were deleted: every read failed with PATH_NOT_FOUND.
    client = OracleClient(pg_oracle, data_dir=tmp_path / "tables")
    try:
        table = client.create_table(spark, "orders", frame(spark, [], SCHEMA).schema)
        relay.arm()
        ts = table.append(frame(spark, [(1, "a"), (2, "b")]))
        assert relay.lost == 1  # the COMMIT reply really was lost
        assert [t for t, _ in commits(client, "orders")] == [ts]
        assert all(Path(p).exists() for _, p in commits(client, "orders"))
        assert sorted_rows(table.read()) == [(1, "a"), (2, "b")]
    finally:
        client.close()


def test_an_outage_after_the_commit_returns_the_timestamp(spark, pg_oracle, relay, tmp_path):
    # Before: a database outage right after the catalog commit made append raise although
    # the rows were committed; the caller's retry wrote them twice.
    client = OracleClient(pg_oracle, data_dir=tmp_path / "tables",
                          retry=RetryPolicy(timeout=1.5))
    try:
        table = client.create_table(spark, "pay", frame(spark, [], SCHEMA).schema)
        table.after_commit = lambda _ts: relay.cut(4.0)  # apply_write meets the outage
        ts = table.append(frame(spark, [(2, "payment")]))
        table.after_commit = None
        assert ts > 0
        deadline = time.monotonic() + 120  # only a hang reaches this
        while True:  # the outage ends; the background apply_write lands
            try:
                if client.read_ts() >= ts:
                    break
            except tsoracle.OracleUnavailable:
                pass  # still cut off
            assert time.monotonic() < deadline, "apply_write never landed"
            time.sleep(0.2)
        assert sorted_rows(table.read()) == [(2, "payment")]  # once, no retry by the caller
    finally:
        client.close()


def test_replayed_stream_batches_never_append_twice(spark, url, tmp_path):
    # Before: two sink calls that shared one group commit stored the tag 'qa:0,qb:0', and a
    # replay of either batch (looked up by exact match) appended it again.
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    client = OracleClient(url, data_dir=tmp_path / "tables")
    try:
        table = client.create_table(spark, "events", frame(spark, [], SCHEMA).schema)
        sinks = {q: table.streaming_sink(q) for q in ("qa", "qb")}
        batches = {"qa": frame(spark, [(1, "qa")]), "qb": frame(spark, [(2, "qb")])}
        # Hold a commit open so that both sink calls queue behind it (one group, before).
        release = threading.Event()
        table.before_commit = lambda _ts: release.wait(30)
        first = threading.Thread(target=table.append, args=(frame(spark, [(0, "first")]),))
        first.start()
        time.sleep(1.0)
        table.before_commit = None
        threads = [threading.Thread(target=sinks[q], args=(batches[q], 0)) for q in sinks]
        for t in threads:
            t.start()
        time.sleep(1.0)
        release.set()
        for t in [first, *threads]:
            t.join()
        for q in ("qa", "qb", "qa"):  # restarted queries replay their batch 0
            sinks[q](batches[q], 0)
        assert sorted_rows(table.read()) == [(0, "first"), (1, "qa"), (2, "qb")]
    finally:
        client.close()


def test_columns_that_look_internal(spark, local_client, tmp_path):
    # Before: a user column `_copy` was overwritten on every read, `_n` made reads fail with
    # AMBIGUOUS_REFERENCE, and `_TS` was accepted, after which every append failed.
    client = local_client
    schema = "k INT, _copy STRING, _N INT"
    table = client.create_table(spark, "odd", frame(spark, [], schema).schema)
    table.append(frame(spark, [(1, "mine", 7), (1, "mine", 7)], schema))
    assert sorted_rows(table.read()) == [(1, "mine", 7), (1, "mine", 7)]
    for bad in ("k INT, _TS INT", "k INT, _Diff INT", "k INT, __TSO_n INT", "k INT, K INT"):
        with pytest.raises(ConfigError):
            client.create_table(spark, "bad", frame(spark, [], bad).schema)
    client.drop_table(spark, "odd")  # there was no way to drop a table
    with pytest.raises(tsoracle.NotInitialized):
        client.table(spark, "odd")
    assert not (tmp_path / "tables" / "odd").exists()


def test_retractions_act_on_the_current_rows(spark, local_client, tmp_path):
    # Before: retracting a row that was not there left a count of -1, and appending the row
    # afterwards left nothing: the row was lost.
    client = local_client
    table = client.create_table(spark, "t", frame(spark, [], SCHEMA).schema)
    with pytest.raises(ConfigError, match="not in the table"):
        table.retract(frame(spark, [(1, "x")]))
    table.append(frame(spark, [(1, "x"), (2, "y")]))
    assert sorted_rows(table.read()) == [(1, "x"), (2, "y")]
    with pytest.raises(ConfigError):  # twice, but it is there once
        table.retract(frame(spark, [(1, "x"), (1, "x")]))
    table.retract(frame(spark, [(1, "x")]))
    assert sorted_rows(table.read()) == [(2, "y")]
    nulls = "k INT, v STRING"
    table.append(frame(spark, [(3, None)], nulls))
    table.retract(frame(spark, [(3, None)], nulls))  # NULLs match NULLs
    assert sorted_rows(table.read()) == [(2, "y")]


def test_null_keys_are_refused(spark, local_client, tmp_path):
    # Before: an upsert with a NULL key part added a row each time (the semi-join was not
    # NULL-safe), and NULL was accepted into the key of an append.
    client = local_client
    schema = "a INT, b INT, v STRING"
    table = client.create_table(spark, "kv", frame(spark, [], schema).schema, keys=("a", "b"))
    table.upsert(frame(spark, [(1, 1, "one")], schema))
    table.upsert(frame(spark, [(1, 1, "uno")], schema))
    assert sorted_rows(table.read()) == [(1, 1, "uno")]
    for write in (table.upsert, table.append):
        with pytest.raises(ConfigError, match="NULL in a key"):
            write(frame(spark, [(1, None, "x")], schema))
    assert sorted_rows(table.read()) == [(1, 1, "uno")]


def test_a_linearized_read_is_never_older_than_a_serializable_one(spark, url, tmp_path):
    # Before: the linearized path read at read_ts, which lags the catalog while an apply_write
    # is slow: it returned fewer rows than a serializable read taken just before it.
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    writer = OracleClient(url, data_dir=tmp_path / "tables")
    reader = OracleClient(url, data_dir=tmp_path / "tables", staleness_s=0.0)
    try:
        table = writer.create_table(spark, "t", frame(spark, [], SCHEMA).schema)
        committed = threading.Event()
        release = threading.Event()

        def slow_apply(_ts: int) -> None:
            committed.set()
            release.wait(30)

        table.after_commit = slow_apply
        done = threading.Thread(target=table.append, args=(frame(spark, [(1, "a")]),))
        done.start()
        assert committed.wait(60)
        other = reader.table(spark, "t")
        serializable = other.read("serializable").count()
        linearized = other.read("linearized").count()
        release.set()
        done.join()
        assert serializable == 1 and linearized >= serializable
    finally:
        writer.close()
        reader.close()


def test_a_driver_fenced_by_another_legacy_leader_does_not_take_it_back(spark, url, tmp_path):
    # Before: two drivers on a legacy timeline took leadership from each other on every call,
    # each take-over jumping a reservation window: the timeline ran 62 s ahead of the clock.
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"], implementation="legacy"))
    first = OracleClient(url, data_dir=tmp_path / "tables")
    second = OracleClient(url, data_dir=tmp_path / "tables")
    try:
        first.read_ts()
        second.read_ts()  # takes the timeline over
        with pytest.raises(LeadershipLost, match="need the distributed one"):
            first.read_ts()
        leader_epoch = asyncio.run(tsoracle.status(url)).timelines[0].leader_epoch
        with pytest.raises(LeadershipLost):
            first.read_ts()
        assert asyncio.run(tsoracle.status(url)).timelines[0].leader_epoch == leader_epoch
        assert second.write_ts().timestamp > 0  # the other driver keeps working
    finally:
        first.close()
        second.close()


def test_table_names_and_data_dir_uris(spark, sqlite_url, tmp_path):
    # Before: `../escape` wrote outside data_dir, "" and "." named data_dir itself, and a
    # `file:` URI became a local folder literally named "file:".
    asyncio.run(tsoracle.init(sqlite_url))
    target = tmp_path / "uri-tables"
    client = OracleClient(sqlite_url, data_dir=target.as_uri())
    try:
        schema = frame(spark, [], SCHEMA).schema
        for bad in ("../escape", "", ".", "/abs", "a/b", "x" * 129):
            with pytest.raises(ConfigError, match="table name"):
                client.create_table(spark, bad, schema)
        table = client.create_table(spark, "ok", schema)
        table.append(frame(spark, [(1, "a")]))
        assert sorted_rows(table.read()) == [(1, "a")]
        assert any((target / "ok" / "data").iterdir())
        assert not Path("file:").exists()
    finally:
        client.close()


def test_compaction_keeps_reads_and_collects_garbage(spark, url, tmp_path):
    # Before: nothing compacted, read planning grew with every commit, and the files of
    # refused or abandoned commits stayed forever.
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    client = OracleClient(url, data_dir=tmp_path / "tables")
    try:
        table = client.create_table(spark, "t", frame(spark, [], SCHEMA).schema, keys=("k",))
        stamps = [table.append(frame(spark, [(i, "v")])) for i in range(5)]
        table.upsert(frame(spark, [(1, "w")]))
        table.retract(frame(spark, [(2, "v")]))
        at, expected = table.read_with_ts("linearized")
        expected = sorted_rows(expected)
        orphan = tmp_path / "tables" / "t" / "data" / "_ts=1" / "__tso_commit=orphan"
        orphan.mkdir(parents=True)
        (orphan / "part-0.parquet").write_bytes(b"not committed")
        assert table.compact() == 7
        assert len(commits(client, "t")) == 1
        assert sorted_rows(table.read(at)) == expected == sorted_rows(table.read())
        with pytest.raises(ConfigError, match="compacted"):
            table.read(stamps[2])
        assert table.collect_garbage(older_than_s=0) == 8  # 7 folded commits and the orphan
        assert not orphan.exists()
        assert sorted_rows(table.read()) == expected  # nothing referenced was touched
        table.append(frame(spark, [(9, "z")]))
        assert sorted_rows(table.read()) == sorted(expected + [(9, "z")])
        assert table.compact() == 2
    finally:
        client.close()


def test_a_cached_serializable_timestamp_never_reads_below_a_compaction(spark, local_client,
                                                                        sqlite_url, tmp_path):
    # Review finding: a driver's cached closed timestamp from before a compaction read at a
    # timestamp whose commits had been folded away, and returned no rows at all.
    table = local_client.create_table(spark, "t", frame(spark, [], SCHEMA).schema)
    table.append(frame(spark, [(1, "a")]))
    stale = OracleClient(sqlite_url, data_dir=tmp_path / "tables", staleness_s=3600)
    try:
        stale_table = stale.table(spark, "t")
        assert sorted_rows(stale_table.read("serializable")) == [(1, "a")]  # cached now
        table.append(frame(spark, [(2, "b")]))
        assert table.compact() == 2
        assert sorted_rows(stale_table.read("serializable")) == [(1, "a"), (2, "b")]
    finally:
        stale.close()
