"""Lakehouse: Spark on Iceberg through tsoracle's catalog, in the run's one Iceberg Spark
(conftest's `spark`, on the session's `lake_catalog`). Each test works in a namespace of its
own; the pure helpers are tested without Spark."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import pytest

import tsoracle
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle.spark.lakehouse import (
    CatalogUnavailable,
    HistoryExpired,
    Lakehouse,
    TableExists,
    TableNotFound,
    _instant,
    _timestamp,
)

SCHEMA = "id BIGINT, item STRING"


def test_timestamps_are_written_the_way_spark_reads_them():
    assert _instant(1_795_565_171_139) == "2026-11-25T00:06:11.139+00:00"
    assert _instant(0) == "1970-01-01T00:00:00.000+00:00"  # a counter: timeline's first
    assert _timestamp(1_795_565_171_139) == "TIMESTAMP '2026-11-25 00:06:11.139 UTC'"
    with pytest.raises(tsoracle.ConfigError, match="beyond"):
        _instant(2**63)


@pytest.fixture
def lake(spark, lake_catalog) -> Lakehouse:
    return Lakehouse(spark, lake_catalog.uri, staleness_s=0.5, read_window_s=2.0)


@pytest.fixture
def ns() -> str:
    return "t" + uuid.uuid4().hex[:10]


def ids(df) -> list[int]:
    return sorted(r.id for r in df.select("id").collect())


def rows(lake: Lakehouse, pairs: list[tuple[int, str]]):
    return lake.spark.createDataFrame(pairs, SCHEMA)


def test_cuts_across_two_tables_under_concurrent_writers(lake, lake_catalog, ns):
    """Writers append each batch to orders, then to shipments; every cut at a read_ts sees
    shipments' ids within orders', and the same rows when read again at the end, in Spark and
    in pyiceberg (a second engine)."""
    orders, shipments = f"{ns}.orders", f"{ns}.shipments"
    lake.create_table(orders, SCHEMA)
    lake.create_table(shipments, SCHEMA)
    before_any = lake.read_ts()
    done = threading.Event()
    errors: list[BaseException] = []
    cuts: list[tuple[int, list[int], list[int]]] = []

    def writer(w: int) -> None:
        try:
            for b in range(3):
                batch = rows(lake, [(w * 1000 + b * 10 + i, f"w{w}") for i in range(5)])
                lake.append(orders, batch)
                lake.append(shipments, batch)
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while not done.is_set():
                cut = lake.cut([orders, shipments])
                cuts.append((cut.ts, ids(cut[orders]), ids(cut[shipments])))
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    read = threading.Thread(target=reader)
    read.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join(300)
    done.set()
    read.join(300)
    assert errors == [], errors[:2]
    final = lake.cut([orders, shipments])
    cuts.append((final.ts, ids(final[orders]), ids(final[shipments])))
    assert len(cuts) >= 3 and len(cuts[-1][1]) == 30
    for ts, seen_orders, seen_shipments in cuts:
        assert set(seen_shipments) <= set(seen_orders), f"a shipment without its order at {ts}"
        again = lake.cut([orders, shipments], ts)
        assert (ids(again[orders]), ids(again[shipments])) == (seen_orders, seen_shipments)
    # Before their first commit both tables read as empty, with their schema.
    empty = lake.read(orders, before_any)
    assert empty.count() == 0 and empty.schema.simpleString() == "struct<id:bigint,item:string>"

    from pyiceberg.catalog.rest import RestCatalog

    catalog = RestCatalog("tso", uri=lake_catalog.uri)
    for ts, seen_orders, _ in cuts[-3:]:
        table = catalog.load_table(orders)
        snapshot = table.snapshot_as_of_timestamp(ts)
        assert snapshot is not None
        arrow = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        assert sorted(arrow.column("id").to_pylist()) == seen_orders


def test_serializable_reads_lag_at_most_the_staleness(lake, ns):
    table = f"{ns}.t"
    lake.create_table(table, SCHEMA)
    linearized = lake.read_ts()
    assert lake.closed_ts() >= linearized  # never below a linearized read of this Lakehouse
    w = lake.append(table, rows(lake, [(1, "a")]))
    assert lake.read(table, w).count() == 1  # an append's timestamp is closed when it returns
    assert lake.read(table, w - 1).count() == 0
    seen = lake.closed_ts()
    time.sleep(lake.staleness_s)
    closed = lake.closed_ts()
    assert closed >= w and closed >= seen  # caught up within the staleness, never backwards
    assert ids(lake.read(table, "serializable")) == [1]


def test_upsert_and_deletes_leave_earlier_reads_alone(lake, ns):
    table = f"{ns}.t"
    lake.create_table(table, SCHEMA, partitioned_by=["bucket(4, id)"])
    first = lake.append(table, rows(lake, [(1, "apple"), (2, "pear"), (3, "fig")]))
    lake.upsert(table, rows(lake, [(1, "plum"), (4, "kiwi")]), on=["id"])
    lake.delete(table, lake.spark.createDataFrame([(2,)], "id BIGINT"), on=["id"])
    lake.delete_where(table, "item = 'fig'")
    now = lake.read(table)
    assert sorted(tuple(r) for r in now.collect()) == [(1, "plum"), (4, "kiwi")]
    assert sorted(tuple(r) for r in lake.read(table, first).collect()) == [
        (1, "apple"), (2, "pear"), (3, "fig")]
    with pytest.raises(TableExists, match="if_not_exists"):
        lake.create_table(table, SCHEMA)
    lake.create_table(table, SCHEMA, if_not_exists=True)


def test_compaction_keeps_every_as_of_read(lake, ns):
    table = f"{ns}.t"
    lake.create_table(table, SCHEMA)
    stamps = [lake.append(table, rows(lake, [(i, f"v{i}")])) for i in range(4)]
    before = {ts: ids(lake.read(table, ts)) for ts in stamps}
    files = lake.spark.table(f"tso.{table}.files").count()
    result = lake.compact(table, options={"min-input-files": "2"})
    assert result["rewritten_data_files_count"] == 4 and result["added_data_files_count"] == 1
    assert lake.spark.table(f"tso.{table}.files").count() < files
    assert {ts: ids(lake.read(table, ts)) for ts in stamps} == before
    assert ids(lake.read(table)) == [0, 1, 2, 3]


def test_expiry_and_orphan_removal_keep_the_read_window(lake, ns, lake_catalog):
    table = f"{ns}.t"
    lake.create_table(table, SCHEMA)
    old = lake.append(table, rows(lake, [(1, "a")]))
    for what in (lake.expire_snapshots, lake.remove_orphan_files):
        with pytest.raises(tsoracle.ConfigError, match="shorter than this Lakehouse's read "
                                                      "window"):
            what(table, retention_s=1.0)
    recent = lake.append(table, rows(lake, [(2, "b")]))
    time.sleep(lake.read_window_s + 0.5)
    latest = lake.append(table, rows(lake, [(3, "c")]))
    expired = lake.expire_snapshots(table, retention_s=lake.read_window_s)
    assert expired["deleted_manifest_lists_count"] == 1
    # `recent` was current at the window's start: reads in the window still need it. The
    # snapshot before it is gone, and a read there says so (not "empty").
    assert ids(lake.read(table, recent)) == [1, 2] and ids(lake.read(table, latest)) == [1, 2, 3]
    with pytest.raises(HistoryExpired, match="read at or after"):
        lake.read(table, old)
    warehouse = Path(lake_catalog.url.removeprefix("sqlite:///")).parent / "warehouse"
    orphan = warehouse / ns / "t" / "data" / "left-by-a-crashed-writer.parquet"
    orphan.write_bytes(b"PAR1")
    # Too young: an hour's retention keeps it however slowly this machine got here.
    assert lake.remove_orphan_files(table, retention_s=3600) == []
    time.sleep(lake.read_window_s + 0.5)
    removed = lake.remove_orphan_files(table, retention_s=lake.read_window_s)
    assert [Path(r).name for r in removed] == [orphan.name] and not orphan.exists()
    assert ids(lake.read(table, latest)) == [1, 2, 3]


def test_a_stream_restarted_from_its_checkpoint_appends_a_batch_once(lake, ns, tmp_path):
    table = f"{ns}.events"
    lake.create_table(table, SCHEMA)
    source = tmp_path / "incoming"
    source.mkdir()
    for f in range(2):
        (source / f"{f}.json").write_text("".join(
            json.dumps({"id": f * 10 + i, "item": "s"}) + "\n" for i in range(5)))
    checkpoint = tmp_path / "checkpoint"

    def run(where: Path) -> int:
        stream = lake.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1) \
            .json(str(source))
        lake.stream_to(table, stream, checkpoint=str(where),
                       trigger={"availableNow": True}).awaitTermination(300)
        return lake.read(table).count()

    assert run(checkpoint) == 10
    # The driver died after its last batch committed to Iceberg, before the checkpoint
    # recorded it: a restart from the checkpoint runs that batch again.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    assert run(checkpoint) == 10
    snapshots = lake.spark.table(f"tso.{table}.snapshots").count()
    assert snapshots == 2  # one commit per batch, the replay committed nothing
    # The caveat the docs state: a new checkpoint is a new query, from the source's start.
    assert run(tmp_path / "new-checkpoint") == 20


def test_bad_input_is_said_in_the_users_terms(lake, spark, ns):
    with pytest.raises(TableNotFound, match="create_table"):
        lake.read(f"{ns}.missing")
    with pytest.raises(TableNotFound, match="create_table"):
        lake.append(f"{ns}.missing", rows(lake, [(1, "a")]))
    for name in ("nonamespace", f"{ns}.bad-name", f"{ns}.", ""):
        with pytest.raises(tsoracle.ConfigError, match="namespace.name"):
            lake.read(name)
    lake.create_table(f"{ns}.t", SCHEMA)
    for bad in ("latest", 1.5, True, None, -1):
        with pytest.raises(tsoracle.ConfigError, match="as_of"):
            lake.read(f"{ns}.t", as_of=bad)
    with pytest.raises(tsoracle.ConfigError, match="not be repeatable"):
        lake.read(f"{ns}.t", as_of=lake.read_ts() + 3_600_000)
    with pytest.raises(tsoracle.ConfigError, match="on must be"):
        lake.upsert(f"{ns}.t", rows(lake, [(1, "a")]), on="id")
    with pytest.raises(tsoracle.ConfigError, match="read_window_s"):
        Lakehouse(spark, lake.catalog_uri, staleness_s=10, read_window_s=1)


def test_an_unreachable_catalog_or_a_wrong_token_names_the_url_never_the_token(spark, tmp_path):
    dead = Lakehouse(spark, "http://127.0.0.1:9", catalog_name="dead", token="s3cr3t-t0ken")
    for call in (dead.read_ts, dead.closed_ts, lambda: dead.read("a.b", as_of=5),
                 lambda: dead.create_table("a.b", SCHEMA)):  # the last one through Spark
        with pytest.raises(CatalogUnavailable) as caught:
            call()
        assert "http://127.0.0.1:9" in str(caught.value) and "s3cr3t" not in str(caught.value)

    url = f"sqlite:///{tmp_path / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0,
                                      token="the-right-one")) as running:
        wrong = Lakehouse(spark, running.url, catalog_name="guarded", token="s3cr3t-t0ken")
        with pytest.raises(tsoracle.ConfigError, match="refused") as caught:
            wrong.read_ts()
        assert running.url in str(caught.value) and "s3cr3t" not in str(caught.value)
    with pytest.raises(tsoracle.ConfigError, match="catalog_name"):
        Lakehouse(spark, "http://127.0.0.1:10", catalog_name="dead")
