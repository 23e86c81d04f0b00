"""DuckDB as an engine on tsoracle's catalog (tsoracle.duckdb): real DuckDB 1.5 with its
iceberg extension from the wheels, against `RunningCatalog` (the served catalog, in-process,
on a SQLite oracle), with pyiceberg as the other engine committing and reading beside it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog

import tsoracle
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle.duckdb import DuckCatalog, extension_file
from tsoracle.errors import ConfigError

pytestmark = pytest.mark.served  # a catalog on a port of this machine
SCHEMA = pa.schema([("id", pa.int64()), ("batch", pa.int64())])
TOKEN = "duck-t0ken'; DROP"  # a quote in it: passed to DuckDB as a string, never as SQL
BATCHES = 6


def _serve(home: Path, token: str | None = None):
    url = f"sqlite:///{home / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    return RunningCatalog(CatalogConfig(url=url, warehouse=str(home / "warehouse"), port=0,
                                        token=token))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory):
    with _serve(tmp_path_factory.mktemp("duck")) as running:
        yield SimpleNamespace(uri=running.url, py=RestCatalog("py", uri=running.url))


def _ids(duck: DuckCatalog, table: str, as_of: int) -> list[int]:
    return [r[0] for r in duck.sql(f"SELECT id FROM {duck.table(table, as_of)} ORDER BY id")
            .fetchall()]


def test_duckdb_reads_one_repeatable_cut_across_tables_while_pyiceberg_commits(catalog):
    """A writer appends each batch to orders, then to shipments; DuckDB reads both tables as
    of T = read_ts() while it writes: every shipment's order is in the same cut, the cut reads
    the same at the end, and pyiceberg (another engine) reads the same rows as of T."""
    catalog.py.create_namespace("cut")
    orders = catalog.py.create_table("cut.orders", schema=SCHEMA)
    shipments = catalog.py.create_table("cut.shipments", schema=SCHEMA)
    duck = DuckCatalog(catalog.uri)
    appended = threading.Semaphore(0)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for b in range(BATCHES):
                rows = pa.table({"id": [b * 10 + i for i in range(3)], "batch": [b] * 3},
                                schema=SCHEMA)
                orders.append(rows)
                appended.release()  # the cut below falls between the two commits
                shipments.append(rows)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            appended.release()

    thread = threading.Thread(target=writer)
    thread.start()
    cuts = []
    for _ in range(BATCHES):  # sized by the writer's commits, not by time
        appended.acquire()
        ts = duck.read_ts()
        cuts.append((ts, _ids(duck, "cut.orders", ts), _ids(duck, "cut.shipments", ts)))
    thread.join(120)
    assert errors == [] and not thread.is_alive(), errors
    final = duck.read_ts()
    cuts.append((final, _ids(duck, "cut.orders", final), _ids(duck, "cut.shipments", final)))
    assert len(cuts[-1][1]) == len(cuts[-1][2]) == 3 * BATCHES
    orders.refresh()
    for ts, seen_orders, seen_shipments in cuts:
        assert set(seen_shipments) <= set(seen_orders), f"a shipment without its order at {ts}"
        assert (_ids(duck, "cut.orders", ts), _ids(duck, "cut.shipments", ts)) == (
            seen_orders, seen_shipments)  # repeatable
        snapshot = orders.snapshot_as_of_timestamp(ts)
        by_pyiceberg = [] if snapshot is None else sorted(
            orders.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["id"].to_pylist())
        assert by_pyiceberg == seen_orders, ts
    # Before the first commit both tables read as empty.
    assert _ids(duck, "cut.orders", cuts[0][0] - 10**6) == []


def test_duckdb_writes_commit_at_oracle_timestamps(catalog):
    catalog.py.create_namespace("w")
    catalog.py.create_table("w.events", schema=SCHEMA)
    duck = DuckCatalog(catalog.uri)
    before = duck.read_ts()
    duck.sql(f"INSERT INTO {duck.table('w.events')} VALUES (1, 0), (2, 0)")
    after = duck.read_ts()
    table = catalog.py.load_table("w.events")
    [snapshot] = table.snapshots()
    w = snapshot.timestamp_ms  # the commit's oracle timestamp W
    assert before < w <= after, (before, w, after)
    assert _ids(duck, "w.events", w) == [1, 2]  # visible exactly from W
    assert _ids(duck, "w.events", w - 1) == []
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2]  # pyiceberg sees it


def test_a_catalog_with_a_token_is_read_with_it_and_refuses_without(tmp_path):
    with _serve(tmp_path, token=TOKEN) as running:
        py = RestCatalog("py", uri=running.url, token=TOKEN)
        py.create_namespace("t")
        py.create_table("t.x", schema=SCHEMA).append(
            pa.table({"id": [7], "batch": [0]}, schema=SCHEMA))
        duck = DuckCatalog(running.url, token=TOKEN)
        assert _ids(duck, "t.x", duck.read_ts()) == [7]
        for token in (None, "wrong"):
            with pytest.raises(ConfigError) as refused:
                DuckCatalog(running.url, token=token)
            assert "DuckCatalog(..., token=...)" in str(refused.value)
            assert "wrong" not in str(refused.value) and TOKEN not in str(refused.value)


def test_table_names_and_timestamps_are_checked_before_any_sql(catalog):
    duck = DuckCatalog(catalog.uri)
    for name in ("orders", ".orders", "ns."):
        with pytest.raises(ConfigError, match="namespace.table"):
            duck.table(name)
    for ts in (-1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="read_ts"):
            duck.table("ns.t", ts)  # type: ignore[arg-type]
    assert duck.table('a"b.c', 5) == '"tso"."a""b"."c" AT (TIMESTAMP => make_timestamp(5000))'


def test_an_extension_for_another_duckdb_says_what_to_install():
    with pytest.raises(ConfigError) as wrong:
        extension_file("iceberg", "0.0.1")
    assert "pip install 'duckdb-extension-iceberg==0.0.1'" in str(wrong.value)
    assert extension_file("iceberg", "1.5.5").is_file()
