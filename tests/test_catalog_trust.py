"""The catalog's trust boundary (docs/iceberg.md, "Trust boundary"): hostile requests, sent as
raw HTTP the way a careless or hostile client would, on SQLite and PostgreSQL. Each case here
was handled wrongly by the catalog before (a 500, a 504, a 409 engines retry forever, code
loaded, files written or deleted outside the request's own table, a leak), and is kept as a
regression corpus."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog

import tsoracle
from tests.test_catalog import SCHEMA, call, read_ts
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle.errors import ConfigError

# Starts tsoracle's own processes or HTTP servers: the full suite's, not `make test-fast`'s.
pytestmark = pytest.mark.served

EMPTY_SCHEMA = {"type": "struct", "schema-id": 0,
                "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def served(url: str, tmp_path: Path):
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:cat"]))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "warehouse"), port=0)
    with RunningCatalog(config) as running:
        catalog = RestCatalog("tso", uri=running.url)
        catalog.create_namespace("db")
        catalog.create_table("db.victim", schema=SCHEMA).append(
            pa.table({"id": [1], "who": ["v"]}, schema=SCHEMA))
        yield running.url, catalog, Path(config.warehouse)


def _create(base: str, name: str, **extra: Any) -> tuple[int, Any]:
    return call("POST", f"{base}/v1/namespaces/db/tables",
                {"name": name, "schema": EMPTY_SCHEMA, **extra})


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


def _kind(answer: Any) -> str:
    return str(answer["error"]["type"])


def test_no_property_that_names_code_is_accepted_anywhere(served, tmp_path):
    """Before: `write.py-location-provider.impl` reached pyiceberg, which imported and called
    it: `shutil.rmtree` with another table's location deleted that table's files."""
    base, catalog, warehouse = served
    victim = catalog.load_table("db.victim")
    before = _files(warehouse / "db" / "victim")
    assert before
    for key in ("write.py-location-provider.impl", "py-io-impl", "io-impl",
                "write.location-provider.impl", "s3.retry-strategy-impl", "client.factory",
                "metrics-reporter-impl", "catalog-impl", "PY-IO-IMPL"):
        got, answer = _create(base, "evil", location=victim.location(),
                              properties={key: "shutil.rmtree"})
        assert (got, _kind(answer)) == (400, "BadRequestException"), (key, answer)
        assert "names code" in answer["error"]["message"]
        got, answer = call("POST", f"{base}/v1/namespaces/db/tables/victim", {"updates": [
            {"action": "set-properties", "updates": {key: "shutil.rmtree"}}]})
        assert got == 400, (key, answer)
        got, answer = call("POST", f"{base}/v1/namespaces",
                           {"namespace": ["n"], "properties": {key: "x.y"}})
        assert got == 400, (key, answer)
        got, answer = call("POST", f"{base}/v1/namespaces/db/properties",
                           {"updates": {key: "x.y"}})
        assert got == 400, (key, answer)
    # A metadata file that carries such a key is not registered either.
    current = json.loads(Path(urllib.parse.urlparse(
        victim.metadata_location).path).read_text())
    current["properties"]["write.py-location-provider.impl"] = "shutil.rmtree"
    planted = warehouse / "planted.metadata.json"
    planted.write_text(json.dumps(current))
    got, answer = call("POST", f"{base}/v1/namespaces/db/register",
                       {"name": "planted", "metadata-location": str(planted)})
    assert got == 400, answer
    assert _files(warehouse / "db" / "victim") == before
    assert catalog.load_table("db.victim").scan().to_arrow().num_rows == 1
    # Keys that only look alike are a table's own business.
    got, answer = _create(base, "fine", properties={"write.parquet.compression-codec": "zstd",
                                                    "implementation-notes": "x"})
    assert got == 200, answer


@pytest.mark.parametrize("spelling", [
    "file://..{wh}/db/x", "file://evil.example{wh}/db/x", "file://localhost{wh}/db/x",
    "{wh}/db/../../outside", "{wh}/db/%2e%2e/%2e%2e/outside", "{wh}/db/%252E%252E/x",
    "warehouse/db/x", "file:warehouse/db/x", "{wh}/db/x?y=1", "{wh}/db/x#frag",
    "{wh}/db/victim", "{wh}/db/victim/inner", "{wh}/db", " {wh}/db/x", "{wh}/db/x ",
])
def test_a_location_is_resolved_as_the_fileio_writes_it(served, tmp_path, spelling,
                                                         monkeypatch):
    """Before: `file://..<warehouse>/x` passed the warehouse check (the host was dropped) and
    the FileIO wrote to the relative path `../<warehouse>/x`; a table could also be created in
    another table's folder."""
    base, _, warehouse = served
    monkeypatch.chdir(tmp_path)
    location = spelling.format(wh=warehouse)
    got, answer = _create(base, f"t{uuid.uuid4().hex[:6]}", location=location)
    assert (got, _kind(answer)) == (400, "BadRequestException"), (location, answer)
    assert not (tmp_path / "outside").exists() and not (tmp_path / "..").joinpath(
        "outside").exists()
    relative = [p for p in tmp_path.rglob("*.metadata.json")
                if warehouse not in p.parents]
    assert relative == []


def test_default_locations_never_share_a_folder(served):
    from tsoracle.catalog import boundary

    base, catalog, warehouse = served
    catalog.create_namespace("db.x")
    assert _create(base, "x/y")[0] == 200  # a name with a slash
    catalog.create_table(("db", "x", "y"), schema=SCHEMA)
    assert _create(base, "..")[0] == 200  # a dot-dot name stays one folder inside db
    a, b, c = (call("GET", f"{base}/v1/namespaces/{ns}/tables/{name}")[1]["metadata"]["location"]
               for ns, name in (("db", "x%2Fy"), ("db%1Fx", "y"), ("db", "%2E%2E")))
    assert len({a, b, c}) == 3
    for loc in (a, b, c):
        path = Path(urllib.parse.urlparse(loc).path)
        assert warehouse / "db" in path.parents, loc
        assert ".." not in path.parts
    assert not any(boundary.overlaps(boundary.resolve(p), boundary.resolve(q))
                   for p, q in ((a, b), (b, c), (a, c)))


@pytest.mark.parametrize("case", ["long-namespace", "long-table", "deep-namespace",
                                  "long-property", "many-levels-page"])
def test_names_and_sizes_have_one_limit_checked_before_the_database(served, case):
    """Before: on PostgreSQL a name of a few thousand characters overflowed the index (54000),
    was retried as a lost connection for 30 s, holding every other commit, then answered 504."""
    from tsoracle.oracle.metrics import RETRIES

    base, catalog, _ = served
    retried = RETRIES.total()  # the catalog runs in this process: its backends count here
    if case == "long-namespace":
        got, answer = call("POST", f"{base}/v1/namespaces", {"namespace": ["n" * 3000]})
        assert "255 bytes" in answer["error"]["message"]
    elif case == "long-table":
        got, answer = _create(base, "t" * 3000)
        assert "255 bytes" in answer["error"]["message"]
    elif case == "deep-namespace":
        got, answer = call("POST", f"{base}/v1/namespaces", {"namespace": ["n"] * 9})
        assert "8 levels" in answer["error"]["message"]
    elif case == "long-property":
        got, answer = _create(base, "p", properties={"comment": "x" * (65 * 1024)})
        assert "65536 bytes" in answer["error"]["message"]
    else:
        got, answer = call("GET", f"{base}/v1/namespaces?pageSize=" + "9" * 5000)
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert RETRIES.total() == retried  # refused before the database, never retried
    assert catalog.list_tables("db") == [("db", "victim")]


@pytest.mark.parametrize("raw,where", [
    (b"[" * 100_000 + b"]" * 100_000, "/v1/namespaces"),
    (b'{"namespace": ["ok"], "properties": {"k": "\\ud800"}}', "/v1/namespaces"),
    (b'{"namespace": ["ok"], "properties": {"\\udfff": "v"}}', "/v1/namespaces"),
    (b'{"name": "bad-spec", "schema": ' + json.dumps(EMPTY_SCHEMA).encode()
     + b', "partition-spec": {"spec-id": 0, "fields": [{"source-id": 99, "field-id": 1000,'
       b' "name": "p", "transform": "identity"}]}}', "/v1/namespaces/db/tables"),
    (b'{"name": "bad-order", "schema": ' + json.dumps(EMPTY_SCHEMA).encode()
     + b', "write-order": {"order-id": 1, "fields": [{"source-id": 99, "transform":'
       b' "identity", "direction": "asc", "null-order": "nulls-first"}]}}',
     "/v1/namespaces/db/tables"),
])
def test_invalid_input_is_a_400_never_a_500(served, raw, where):
    base, catalog, _ = served
    got, answer = call("POST", base + where, raw=raw)
    assert got == 400, answer
    assert catalog.list_namespaces() == [("db",)]
    assert call("GET", f"{base}/v1/namespaces/db")[0] == 200


def test_updates_that_cannot_apply_are_a_400_not_a_conflict(served):
    """A 409 tells engines to refresh and retry: for updates that can never apply they retried
    forever. Dropping a partition's source column is one such."""
    base, catalog, _ = served
    got, answer = _create(base, "parted", **{"partition-spec": {"spec-id": 0, "fields": [
        {"source-id": 1, "field-id": 1000, "name": "id_p", "transform": "identity"}]}})
    assert got == 200, answer
    table = catalog.load_table("db.parted")
    uuid_is = {"type": "assert-table-uuid", "uuid": str(table.metadata.table_uuid)}
    drop_source = {"requirements": [uuid_is],
                   "updates": [{"action": "add-schema", "schema": {
                       "type": "struct", "schema-id": 1, "fields": [
                           {"id": 2, "name": "other", "type": "string", "required": False}]},
                       "last-column-id": 2},
                       {"action": "set-current-schema", "schema-id": -1}]}
    unknown_schema = {"updates": [{"action": "set-current-schema", "schema-id": 42}]}
    for body in (drop_source, unknown_schema):
        got, answer = call("POST", f"{base}/v1/namespaces/db/tables/parted", body)
        assert got == 400, answer
    assert catalog.load_table("db.parted").metadata == table.metadata


def test_a_rollback_with_a_removal_is_stamped_at_its_commit_timestamp(url, tmp_path):
    """Before: removing a snapshot and rolling main back in one commit kept pyiceberg's wall
    clock on the rollback's snapshot-log entry, so a read at a later read_ts (on a counter
    timeline: at any) did not see the rollback."""
    asyncio.run(tsoracle.init(url, timelines=["counter:cat"]))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0,
                           timeline="counter:cat", retention_s=0)  # it expires a new snapshot
    with RunningCatalog(config) as running:
        base = running.url
        catalog = RestCatalog("tso", uri=base)
        catalog.create_namespace("db")
        table = catalog.create_table("db.t", schema=SCHEMA)
        for i in range(3):
            table.append(pa.table({"id": [i], "who": ["w"]}, schema=SCHEMA))
        table = catalog.load_table("db.t")
        first, second, third = (s.snapshot_id for s in table.snapshots())
        got, answer = call("POST", f"{base}/v1/namespaces/db/tables/t", {"updates": [
            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
             "snapshot-id": first},
            {"action": "remove-snapshots", "snapshot-ids": [third]}]})
        assert got == 200, answer
        w = answer["metadata"]["last-updated-ms"]
        log = answer["metadata"]["snapshot-log"]
        assert log[-1] == {"snapshot-id": first, "timestamp-ms": w}
        assert all(e["timestamp-ms"] < w for e in log[:-1])
        t = read_ts(base)
        assert t >= w
        as_of = [e for e in log if e["timestamp-ms"] <= t][-1]["snapshot-id"]
        assert as_of == first  # a read at read_ts sees the rollback
        assert second in {s.snapshot_id for s in catalog.load_table("db.t").snapshots()}


def test_register_neither_moves_a_table_back_nor_shares_another_tables_files(served):
    base, catalog, warehouse = served
    table = catalog.load_table("db.victim")
    old = table.metadata_location
    table.append(pa.table({"id": [2], "who": ["v"]}, schema=SCHEMA))
    newer = catalog.load_table("db.victim").metadata_location
    got, answer = call("POST", f"{base}/v1/namespaces/db/register",
                       {"name": "victim", "metadata-location": old, "overwrite": True})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert catalog.load_table("db.victim").metadata_location == newer
    for source in (newer, old):  # a live table's current or earlier file, under a new name
        got, answer = call("POST", f"{base}/v1/namespaces/db/register",
                           {"name": "copy", "metadata-location": source})
        assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert catalog.list_tables("db") == [("db", "victim")]


def test_a_purge_removes_the_current_metadata_file_too(served):
    """Before: the current file stayed, and registering it again gave a table whose data was
    gone."""
    base, catalog, _ = served
    current = Path(urllib.parse.urlparse(
        catalog.load_table("db.victim").metadata_location).path)
    assert current.exists()
    assert call("DELETE", f"{base}/v1/namespaces/db/tables/victim?purgeRequested=true")[0] \
        == 204
    deadline = time.monotonic() + 30
    while current.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not current.exists()


def test_a_nested_namespace_needs_its_parent(served):
    base, catalog, _ = served
    got, answer = call("POST", f"{base}/v1/namespaces", {"namespace": ["nowhere", "child"]})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert "nowhere" in answer["error"]["message"]
    assert catalog.list_namespaces() == [("db",)]
    assert call("POST", f"{base}/v1/namespaces", {"namespace": ["db", "child"]})[0] == 200


def test_a_catalog_refuses_a_schema_another_timeline_orders(url, tmp_path):
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:other"]))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as running:
        RestCatalog("tso", uri=running.url).create_namespace("db")
    with pytest.raises(ConfigError, match="--timeline EpochMilliseconds"):
        RunningCatalog(CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0,
                                     timeline="counter:other"))


def _names(base: str, path: str, key: str) -> list[Any]:
    """Every page of a listing (`path` ends in `?` or `&`), two at a time."""
    seen: list[Any] = []
    token = ""
    for _ in range(100):
        query = "pageSize=2" + (f"&pageToken={urllib.parse.quote(token)}" if token else "")
        got, answer = call("GET", f"{base}{path}{query}")
        assert got == 200, answer
        seen += answer[key]
        token = answer.get("next-page-token") or ""
        if not token:
            return seen
    raise AssertionError("pages never ended")


NAMES = ["a", "B", "_c", "a_b", "a-b", "ab", "Ab", "é", "z", "Z1", "0", ".x"]


@pytest.mark.pg
def test_pages_neither_skip_nor_repeat_on_a_database_collation(pg, tmp_path):
    """Before: pages were cut in Python's order over rows the database sorted by its own
    collation (not C): names were skipped and repeated."""
    database = f"icu_{uuid.uuid4().hex[:8]}"
    pg.sql(f"CREATE DATABASE {database} TEMPLATE template0 LOCALE_PROVIDER icu "
           "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8' OWNER tsoracle", "postgres")
    url = pg.url(database=database) + "?schema=cat"
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as running:
        catalog = RestCatalog("tso", uri=running.url)
        catalog.create_namespace("db")
        for name in NAMES:
            catalog.create_table(("db", name), schema=SCHEMA)
            catalog.create_namespace(("db", name))
        tables = [i["name"] for i in _names(running.url, "/v1/namespaces/db/tables?",
                                            "identifiers")]
        children = [n[-1] for n in _names(running.url, "/v1/namespaces?parent=db&",
                                          "namespaces")]
        for found in (tables, children):
            assert sorted(found) == sorted(NAMES) and len(found) == len(set(found)), found
        got, answer = call("GET", f"{running.url}/v1/namespaces/db/tables?pageToken=zzz")
        assert (got, _kind(answer)) == (400, "BadRequestException"), answer


def _slow_call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """`call`, waiting out the catalog's retry budget against a database that is down."""
    request = urllib.request.Request(url, method=method,
                                     data=json.dumps(body).encode() if body else None)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.mark.pg
def test_a_503_names_no_database_address_or_user(pg, tmp_path, caplog):
    from tsoracle_dev.pgfaults import LossyRelay

    caplog.set_level(logging.INFO)
    relay = LossyRelay(pg.port)
    try:
        url = relay.url(f"{pg.url()}?schema=c_{uuid.uuid4().hex[:8]}")
        asyncio.run(tsoracle.init(url))
        config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
        with RunningCatalog(config) as running:
            RestCatalog("tso", uri=running.url).create_namespace("db")
            relay.cut(300)
            # At once: each waits out the catalog's retry budget (30 s).
            with ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(lambda args: _slow_call(*args), [
                    ("POST", f"{running.url}/v1/tsoracle/read-ts"),
                    ("GET", f"{running.url}/v1/namespaces"),
                    ("POST", f"{running.url}/v1/namespaces/db/tables",
                     {"name": "t", "schema": EMPTY_SCHEMA})]))
    finally:
        relay.close()
    parsed = urllib.parse.urlparse(url)
    secrets = {str(parsed.port), parsed.hostname or "", parsed.username or "",
               parsed.path.strip("/"), "127.0.0.1"}
    for got, answer in answers:
        assert got in (503, 504), answer
        text = json.dumps(answer)
        assert not [s for s in secrets if s and s in text], text
    # Nor the log: psycopg's pool logs each failed connection with host and port.
    driver = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    assert driver, "the outage left no driver log line to check"
    assert not [line for line in driver if "127.0.0.1" in line
                or f"port {parsed.port}" in line], driver[:3]


def test_a_rename_racing_a_create_on_another_replica_is_a_conflict_never_a_504(url, tmp_path):
    """Before: the unique violation of a rename that lost to a create on another replica was
    answered 504 CommitStateUnknown (about one race in nine)."""
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as a, RunningCatalog(config) as b:
        catalog = RestCatalog("tso", uri=a.url)
        catalog.create_namespace("db")
        rounds = 40
        for i in range(rounds):
            assert _create(a.url, f"s{i}")[0] == 200
        outcomes: list[tuple[str, int, Any]] = []
        barrier = threading.Barrier(2)

        def rename(i: int) -> None:
            barrier.wait()
            got, answer = call("POST", f"{a.url}/v1/tables/rename", {
                "source": {"namespace": ["db"], "name": f"s{i}"},
                "destination": {"namespace": ["db"], "name": f"d{i}"}})
            outcomes.append(("rename", got, answer))

        def create(i: int) -> None:
            barrier.wait()
            got, answer = _create(b.url, f"d{i}")
            outcomes.append(("create", got, answer))

        for i in range(rounds):
            threads = [threading.Thread(target=rename, args=(i,)),
                       threading.Thread(target=create, args=(i,))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert all(got in (200, 204, 409) for _, got, _ in outcomes), \
            [o for o in outcomes if o[1] not in (200, 204, 409)]
        names = {n for _, n in catalog.list_tables("db")}
        for i in range(rounds):
            assert f"d{i}" in names  # one of the two made it, exactly once


@pytest.mark.pg
def test_a_refused_statement_is_not_retried_as_a_lost_connection(pg):
    """PostgreSQL's 54000 (an index row too large) was taken for a lost connection and retried
    for the whole budget."""
    from tsoracle.errors import Refused
    from tsoracle.store import open_backend, parse_url

    retries: list[str] = []

    async def run() -> None:
        schema = f"r_{uuid.uuid4().hex[:8]}"
        pg.sql(f"CREATE SCHEMA {schema} AUTHORIZATION tsoracle")
        pg.sql(f"CREATE TABLE {schema}.k (v TEXT PRIMARY KEY)")
        pg.sql(f"ALTER TABLE {schema}.k OWNER TO tsoracle")
        backend = open_backend(parse_url(f"{pg.url()}?schema={schema}"),
                               on_retry=retries.append)
        await backend.open()
        try:
            big = os.urandom(6000).hex()

            async def insert(tx: Any) -> None:
                await tx.fetch(f"INSERT INTO {schema}.k (v) VALUES (%(v)s)", {"v": big})

            with pytest.raises(Refused) as caught:
                await backend.transaction(insert)
            assert caught.value.kind == "invalid"
            assert "127.0.0.1" not in str(caught.value)
        finally:
            await backend.close()

    asyncio.run(run())
    assert retries == []  # refused at once, never retried as a lost connection


@pytest.mark.parametrize("timeline", ["EpochMilliseconds", "counter:cat"])
def test_snapshot_expiry_keeps_what_reads_in_the_retention_window_need(url, tmp_path,
                                                                       timeline):
    """Any engine's expire_snapshots meets the guard (spark.Lakehouse kept it client-side)."""
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:cat"]))
    kept: dict[float, tuple[int, Any]] = {}
    for retention in (3600.0, 0.0):
        config = CatalogConfig(url=url, warehouse=str(tmp_path / f"wh{retention:g}"), port=0,
                               timeline=timeline, retention_s=retention)
        with RunningCatalog(config) as running:
            catalog = RestCatalog("tso", uri=running.url)
            ns = f"db{int(retention)}"
            catalog.create_namespace(ns)
            table = catalog.create_table(f"{ns}.t", schema=SCHEMA)
            for i in range(3):
                table.append(pa.table({"id": [i], "who": ["w"]}, schema=SCHEMA))
            oldest = catalog.load_table(f"{ns}.t").snapshots()[0].snapshot_id
            kept[retention] = call("POST", f"{running.url}/v1/namespaces/{ns}/tables/t",
                                   {"updates": [{"action": "remove-snapshots",
                                                 "snapshot-ids": [oldest]}]})
            if retention:
                ids = {s.snapshot_id for s in catalog.load_table(f"{ns}.t").snapshots()}
                assert oldest in ids
    got, answer = kept[3600.0]
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert "retention" in answer["error"]["message"]
    assert kept[0.0][0] == 200, kept[0.0]


# --- an adversarial review of the boundary above (each a 200, a 503 or lost files before) ---

def _metadata_file(location: str) -> Path:
    return Path(urllib.parse.urlparse(location).path)


def test_a_purge_deletes_nothing_outside_the_dropped_tables_folder(served):
    """A client-written metadata file may list another table's files: its manifest lists (a
    commit's add-snapshot) and its metadata log (a registered file). Before, the purge deleted
    them all."""
    base, catalog, warehouse = served
    victim = catalog.load_table("db.victim")
    victim_files = _files(warehouse / "db" / "victim")
    stolen = victim.current_snapshot().manifest_list
    assert _create(base, "evil")[0] == 200
    got, answer = call("POST", f"{base}/v1/namespaces/db/tables/evil", {"updates": [
        {"action": "add-snapshot", "snapshot": {
            "snapshot-id": 4242, "sequence-number": 1, "timestamp-ms": 1,
            "manifest-list": stolen, "summary": {"operation": "append"}, "schema-id": 0}}]})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    # The same through register: a file in the registering table's own folder that names the
    # victim's manifest list and metadata file.
    own = catalog.load_table("db.evil")
    crafted = json.loads(_metadata_file(own.metadata_location).read_text())
    crafted["snapshots"] = [{"snapshot-id": 4242, "sequence-number": 1, "timestamp-ms": 1,
                             "manifest-list": stolen, "summary": {"operation": "append"},
                             "schema-id": 0}]
    crafted["current-snapshot-id"] = 4242
    crafted["snapshot-log"] = [{"snapshot-id": 4242, "timestamp-ms": 1}]
    crafted["refs"] = {"main": {"snapshot-id": 4242, "type": "branch"}}
    crafted["last-sequence-number"] = 1
    crafted["metadata-log"] = [{"metadata-file": victim.metadata_location, "timestamp-ms": 1}]
    planted = _metadata_file(own.metadata_location).parent / "crafted.metadata.json"
    planted.write_text(json.dumps(crafted))
    assert call("DELETE", f"{base}/v1/namespaces/db/tables/evil")[0] == 204
    got, answer = call("POST", f"{base}/v1/namespaces/db/register",
                       {"name": "reg", "metadata-location": str(planted)})
    assert got == 200, answer
    assert call("DELETE", f"{base}/v1/namespaces/db/tables/reg?purgeRequested=true")[0] == 204
    deadline = time.monotonic() + 30
    while planted.exists() and time.monotonic() < deadline:  # the purge runs after the reply
        time.sleep(0.1)
    assert not planted.exists()
    assert _files(warehouse / "db" / "victim") == victim_files
    assert catalog.load_table("db.victim").scan().to_arrow().num_rows == 1


def _overwrite(base: str, metadata: Path) -> tuple[int, Any]:
    """Register `metadata` over the table db.victim."""
    return call("POST", f"{base}/v1/namespaces/db/register",
                {"name": "victim", "overwrite": True, "metadata-location": str(metadata)})


def test_register_overwrite_keeps_history_and_stamps_what_it_adds(served):
    """Before, a metadata file whose log held the current file could rewrite the snapshot log
    under a read timestamp already handed out."""
    base, catalog, warehouse = served
    table = catalog.load_table("db.victim")
    table.append(pa.table({"id": [2], "who": ["v"]}, schema=SCHEMA))
    table = catalog.load_table("db.victim")
    first, second = (s.snapshot_id for s in table.snapshots())
    t = read_ts(base)
    current = json.loads(_metadata_file(table.metadata_location).read_text())
    folder = _metadata_file(table.metadata_location).parent
    descends = [*current["metadata-log"], {"metadata-file": table.metadata_location,
                                           "timestamp-ms": current["last-updated-ms"]}]
    rewritten = {**current, "metadata-log": descends, "current-snapshot-id": first,
                 "snapshot-log": [{"snapshot-id": first, "timestamp-ms": 1}],
                 "refs": {"main": {"snapshot-id": first, "type": "branch"}}}
    forward = {**current, "metadata-log": descends, "current-snapshot-id": first,
               "snapshot-log": [*current["snapshot-log"],
                                {"snapshot-id": first, "timestamp-ms": 1}],
               "refs": {"main": {"snapshot-id": first, "type": "branch"}}}
    for name, body in (("rewritten", rewritten), ("forward", forward)):
        (folder / f"{name}.metadata.json").write_text(json.dumps(body))
    got, answer = _overwrite(base, folder / "rewritten.metadata.json")
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert catalog.load_table("db.victim").snapshot_as_of_timestamp(t).snapshot_id == second
    got, answer = _overwrite(base, folder / "forward.metadata.json")
    assert got == 200, answer
    w = answer["metadata"]["last-updated-ms"]
    assert answer["metadata"]["snapshot-log"][-1] == {"snapshot-id": first, "timestamp-ms": w}
    assert w > t
    assert catalog.load_table("db.victim").snapshot_as_of_timestamp(t).snapshot_id == second


def test_files_a_table_names_stay_in_its_own_folder(served):
    base, catalog, warehouse = served
    victim = catalog.load_table("db.victim").location()
    for properties in ({"write.metadata.path": f"{victim}/metadata"},
                       {"write.data.path": f"{victim}/data"}):
        got, answer = _create(base, "e", properties=properties)
        assert (got, _kind(answer)) == (400, "BadRequestException"), answer
        got, answer = call("POST", f"{base}/v1/namespaces/db/tables/victim", {"updates": [
            {"action": "set-properties", "updates": {"write.data.path": "/elsewhere"}}]})
        assert got == 400, answer
    got, answer = _create(base, "inside", properties={
        "write.data.path": f"{warehouse}/db/inside/files"})
    assert got == 200, answer


@pytest.mark.parametrize("where", ["{wh}", "{wh}/other", "{wh}/other/t"])
def test_a_table_cannot_squat_another_namespaces_folder(served, where):
    """Before: a table at the warehouse's root (or another namespace's folder) made every
    later table there fail with an overlap."""
    base, catalog, warehouse = served
    got, answer = _create(base, "squat", location=where.format(wh=warehouse))
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    got, answer = call("POST", f"{base}/v1/namespaces", {
        "namespace": ["evil"], "properties": {"location": f"{warehouse}/db"}})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    catalog.create_namespace("other")
    catalog.create_table("other.t", schema=SCHEMA)
    assert _create(base, "mine", location=f"{warehouse}/db/elsewhere/mine")[0] == 200


@pytest.mark.parametrize("name", ["/" * 255, "%" + "\u20ac" * 84])
def test_a_name_too_long_as_a_folder_is_a_400(served, name):
    base, _, _ = served
    got, answer = _create(base, name)
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert "255 bytes" in answer["error"]["message"]


def test_stage_create_ids_and_update_counts_are_checked(served):
    base, catalog, warehouse = served
    victim = catalog.load_table("db.victim").location()
    got, answer = _create(base, "staged", location=victim, **{"stage-create": True})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    got, answer = call("POST", f"{base}/v1/namespaces/db/tables/victim", {"updates": [
        {"action": "add-snapshot", "snapshot": {
            "snapshot-id": 2**63, "sequence-number": 2, "timestamp-ms": 1,
            "manifest-list": f"{victim}/metadata/snap.avro",
            "summary": {"operation": "append"}, "schema-id": 0}}]})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    many = [{"action": "set-properties", "updates": {f"k{i}": "v"}} for i in range(300)]
    got, answer = call("POST", f"{base}/v1/namespaces/db/tables/victim", {"updates": many})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    assert "at most 256" in answer["error"]["message"]


# --- a second adversarial review (each a 200 that broke a rule, or a refused workflow) ------

CREATE_UPDATES = [
    {"action": "assign-uuid", "uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1"},
    {"action": "upgrade-format-version", "format-version": 2},
    {"action": "add-schema", "schema": EMPTY_SCHEMA, "last-column-id": 1},
    {"action": "set-current-schema", "schema-id": -1},
    {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
    {"action": "set-default-spec", "spec-id": -1},
    {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
    {"action": "set-default-sort-order", "sort-order-id": -1},
]


def test_a_create_by_commit_or_register_stays_in_its_namespace(served):
    base, catalog, warehouse = served
    catalog.create_namespace("att")
    got, answer = call("POST", f"{base}/v1/namespaces/att/tables/x", {
        "requirements": [{"type": "assert-create"}],
        "updates": [*CREATE_UPDATES, {"action": "set-location",
                                      "location": f"{warehouse}/vic"}]})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    own = catalog.create_table("att.own", schema=SCHEMA)
    crafted = json.loads(_metadata_file(own.metadata_location).read_text())
    crafted.update({"location": f"{warehouse}/vic", "table-uuid": str(uuid.uuid4())})
    planted = _metadata_file(own.metadata_location).parent / "elsewhere.metadata.json"
    planted.write_text(json.dumps(crafted))
    got, answer = call("POST", f"{base}/v1/namespaces/att/register",
                       {"name": "squat", "metadata-location": str(planted)})
    assert (got, _kind(answer)) == (400, "BadRequestException"), answer
    catalog.create_namespace("vic")
    catalog.create_table("vic.t", schema=SCHEMA)


def test_a_name_whose_folder_another_holds_gets_a_spare_one(served):
    """Before: renaming a table away and creating its name again, or a table and a namespace
    of one name, was refused as an overlap (dbt swaps tables so)."""
    base, catalog, warehouse = served
    catalog.create_table("db.m", schema=SCHEMA)
    catalog.rename_table("db.m", "db.m_backup")
    catalog.create_table("db.m", schema=SCHEMA)  # m_backup keeps m's old folder
    catalog.create_namespace("db.n")
    catalog.create_table("db.n.t", schema=SCHEMA)
    catalog.create_table("db.n", schema=SCHEMA)  # its default folder holds db.n.t's
    catalog.create_table("db.k", schema=SCHEMA)
    catalog.create_namespace("db.k")
    catalog.create_table("db.k.t", schema=SCHEMA)  # its default folder is in db.k's
    from tsoracle.catalog import boundary

    folders = [boundary.resolve(catalog.load_table(t).location())
               for t in ("db.m", "db.m_backup", "db.n", "db.n.t", "db.k", "db.k.t")]
    assert not any(boundary.overlaps(a, b) for i, a in enumerate(folders)
                   for b in folders[i + 1:]), folders


def test_register_overwrite_changes_nothing_a_reader_has_seen(served):
    base, catalog, warehouse = served
    table = catalog.load_table("db.victim")
    table.append(pa.table({"id": [2], "who": ["v"]}, schema=SCHEMA))
    table = catalog.load_table("db.victim")
    first, second = (s.snapshot_id for s in table.snapshots())
    current = json.loads(_metadata_file(table.metadata_location).read_text())
    folder = _metadata_file(table.metadata_location).parent
    log = [*current["metadata-log"], {"metadata-file": table.metadata_location,
                                      "timestamp-ms": current["last-updated-ms"]}]
    forward = {**current, "metadata-log": log}
    redefined = json.loads(json.dumps(forward))
    redefined["schemas"][0]["fields"][1]["name"] = "renamed"
    relogged = {**forward, "metadata-log": [{"metadata-file": table.metadata_location,
                                             "timestamp-ms": 1}]}
    moved = {**forward, "location": f"{warehouse}/db/elsewhere"}
    stats = {**forward, "statistics": [{"snapshot-id": first, "statistics-path":
                                        f"{table.location()}/metadata/s.puffin",
                                        "file-size-in-bytes": 1, "file-footer-size-in-bytes": 1,
                                        "blob-metadata": []}]}
    foreign = {**forward, "snapshots": [*current["snapshots"], {
        "snapshot-id": 77, "parent-snapshot-id": second, "sequence-number": 3,
        "timestamp-ms": 1, "manifest-list": f"{warehouse}/elsewhere/snap.avro",
        "summary": {"operation": "append"}, "schema-id": 0}]}
    rolled_back = {**forward, "current-snapshot-id": first,
                   "refs": {"main": {"snapshot-id": first, "type": "branch"}}}
    for name, body in (("redefined", redefined), ("relogged", relogged), ("moved", moved),
                       ("stats", stats), ("foreign", foreign), ("rolled", rolled_back)):
        (folder / f"{name}.metadata.json").write_text(json.dumps(body))
    for name in ("redefined", "relogged", "moved", "stats", "foreign"):
        got, answer = _overwrite(base, folder / f"{name}.metadata.json")
        assert (got, _kind(answer)) == (400, "BadRequestException"), (name, answer)
    t = read_ts(base)
    got, answer = _overwrite(base, folder / "rolled.metadata.json")
    assert got == 200, answer
    w = answer["metadata"]["last-updated-ms"]
    assert answer["metadata"]["snapshot-log"][-1] == {"snapshot-id": first, "timestamp-ms": w}
    assert answer["metadata"]["metadata-log"][-1]["metadata-file"] == table.metadata_location
    assert catalog.load_table("db.victim").snapshot_as_of_timestamp(t).snapshot_id == second


def test_ids_fit_the_formats_integers(served):
    base, catalog, _ = served
    table = catalog.load_table("db.victim")
    snapshot = table.current_snapshot().snapshot_id
    for update in ({"action": "set-statistics", "snapshot-id": 2**70, "statistics": {
                        "snapshot-id": 2**70, "statistics-path": f"{table.location()}/s.puffin",
                        "file-size-in-bytes": 1, "file-footer-size-in-bytes": 1,
                        "blob-metadata": []}},
                   {"action": "add-snapshot", "snapshot": {
                       "snapshot-id": 5, "parent-snapshot-id": snapshot, "sequence-number": 9,
                       "timestamp-ms": 1, "manifest-list": f"{table.location()}/metadata/x.avro",
                       "summary": {"operation": "append"}, "schema-id": 2**70}}):
        got, answer = call("POST", f"{base}/v1/namespaces/db/tables/victim",
                           {"updates": [update]})
        assert (got, _kind(answer)) == (400, "BadRequestException"), (update, answer)
