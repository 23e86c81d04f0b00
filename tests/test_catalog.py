"""`tsoracle catalog`: an Iceberg REST catalog whose commits take oracle timestamps, driven by
pyiceberg (a real engine) and by raw HTTP for what engines never send (bad input)."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

import tsoracle
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

# A SERIALIZABLE PostgreSQL too (conftest.py); served: the full suite's, not `make test-fast`'s.
pytestmark = [pytest.mark.serializable, pytest.mark.served]

SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string())])
# A view `v` in namespace `db`, as an engine creates one (pyiceberg has no view writes).
VIEW = {"name": "v", "schema": {"type": "struct", "schema-id": 0, "fields": []},
        "view-version": {"version-id": 1, "schema-id": 0, "timestamp-ms": 1, "summary": {},
                         "default-namespace": ["db"],
                         "representations": [{"type": "sql", "sql": "select 1",
                                              "dialect": "spark"}]}}


@pytest.fixture
def served(url: str, tmp_path: Path):
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "warehouse"), port=0)
    with RunningCatalog(config) as running:
        yield running, config


@pytest.fixture
def catalog(served) -> RestCatalog:
    running, _ = served
    return RestCatalog("tso", uri=running.url)


def call(method: str, url: str, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text else None


def rows(table: Any, snapshot_id: int | None = None) -> list[int]:
    scan = table.scan(snapshot_id=snapshot_id) if snapshot_id else table.scan()
    return sorted(scan.to_arrow()["id"].to_pylist())


def read_ts(base: str) -> int:
    status, body = call("POST", f"{base}/v1/tsoracle/read-ts")
    assert status == 200, body
    return int(body["read-ts"])


def test_tables_round_trip_and_snapshots_carry_oracle_timestamps(served, catalog):
    running, _ = served
    catalog.create_namespace("db", {"owner": "tests"})
    assert catalog.list_namespaces() == [("db",)]
    assert catalog.load_namespace_properties("db") == {"owner": "tests"}
    table = catalog.create_table("db.events", schema=SCHEMA)
    before = read_ts(running.url)
    table.append(pa.table({"id": [1, 2], "who": ["a", "b"]}, schema=SCHEMA))
    table.append(pa.table({"id": [3], "who": ["c"]}, schema=SCHEMA))
    after = read_ts(running.url)

    table = catalog.load_table("db.events")
    assert rows(table) == [1, 2, 3]
    stamps = [s.timestamp_ms for s in table.snapshots()]
    # Each snapshot is stamped with the oracle's write timestamp of its commit: above every
    # read timestamp handed out before it, and covered by the one read after it.
    assert before < stamps[0] < stamps[1] <= after
    assert [e.timestamp_ms for e in table.metadata.snapshot_log] == stamps
    assert table.metadata.last_updated_ms == stamps[1]
    first = table.snapshots()[0]
    assert table.snapshot_as_of_timestamp(stamps[0]).snapshot_id == first.snapshot_id
    assert rows(table, first.snapshot_id) == [1, 2]


def test_namespace_and_table_lifecycle_errors_are_the_specs(catalog):
    with pytest.raises(NoSuchNamespaceError):
        catalog.create_table("nowhere.t", schema=SCHEMA)
    catalog.create_namespace("db")
    with pytest.raises(NamespaceAlreadyExistsError):
        catalog.create_namespace("db")
    catalog.create_table("db.t", schema=SCHEMA)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("db.t", schema=SCHEMA)
    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace("db")
    catalog.create_namespace("other")
    catalog.rename_table("db.t", "other.u")
    assert catalog.list_tables("other") == [("other", "u")]
    with pytest.raises(NoSuchTableError):
        catalog.load_table("db.t")
    catalog.drop_table("other.u")
    with pytest.raises(NoSuchTableError):
        catalog.drop_table("other.u")
    catalog.drop_namespace("db")
    assert catalog.list_namespaces() == [("other",)]


def test_a_stale_append_is_refused_then_retried_once(catalog, caplog):
    catalog.create_namespace("db")
    first = catalog.create_table("db.t", schema=SCHEMA)
    second = catalog.load_table("db.t")
    first.append(pa.table({"id": [1], "who": ["a"]}, schema=SCHEMA))
    # `second` still believes the table has no snapshot: its requirement fails (409, nothing
    # landed), and pyiceberg refreshes and appends again on top of `first`'s snapshot.
    second.append(pa.table({"id": [2], "who": ["b"]}, schema=SCHEMA))
    assert "concurrent update" in caplog.text
    table = catalog.load_table("db.t")
    assert rows(table) == [1, 2]
    assert len(table.snapshots()) == 2


def _set_properties(ns: str, name: str, **props: str) -> dict[str, Any]:
    return {"identifier": {"namespace": [ns], "name": name}, "requirements": [],
            "updates": [{"action": "set-properties", "updates": props}]}


def test_a_transaction_lands_every_table_at_one_timestamp_or_none(served, catalog):
    running, _ = served
    catalog.create_namespace("db")
    for name in ("a", "b"):
        catalog.create_table(f"db.{name}", schema=SCHEMA)
    status, _ = call("POST", f"{running.url}/v1/transactions/commit", {"table-changes": [
        _set_properties("db", "a", step="1"), _set_properties("db", "b", step="1")]})
    assert status == 204
    a, b = catalog.load_table("db.a"), catalog.load_table("db.b")
    assert a.properties["step"] == b.properties["step"] == "1"
    assert a.metadata.last_updated_ms == b.metadata.last_updated_ms

    stale = _set_properties("db", "b", step="2")
    stale["requirements"] = [{"type": "assert-table-uuid", "uuid": str(a.metadata.table_uuid)}]
    status, body = call("POST", f"{running.url}/v1/transactions/commit", {"table-changes": [
        _set_properties("db", "a", step="2"), stale]})
    assert status == 409 and body["error"]["type"] == "CommitFailedException", body
    assert catalog.load_table("db.a").properties["step"] == "1"  # nothing of it landed


def test_bad_input_gets_the_specs_errors_and_writes_nothing(served, catalog, tmp_path):
    running, config = served
    base = running.url
    catalog.create_namespace("db")
    catalog.create_table("db.t", schema=SCHEMA)
    cases = [
        ("POST", "/v1/namespaces", None, b"{not json", 400, "BadRequestException"),
        ("POST", "/v1/namespaces", None, b"[1, 2]", 400, "BadRequestException"),
        ("POST", "/v1/namespaces", {"namespace": []}, None, 400, "BadRequestException"),
        ("POST", "/v1/namespaces", {"namespace": [""]}, None, 400, "BadRequestException"),
        ("POST", "/v1/namespaces", {"namespace": "db"}, None, 400, "BadRequestException"),
        ("GET", "/v1/namespaces/nowhere", None, None, 404, "NoSuchNamespaceException"),
        ("GET", "/v1/namespaces/nowhere/tables", None, None, 404, "NoSuchNamespaceException"),
        ("GET", "/v1/namespaces/db/tables/missing", None, None, 404, "NoSuchTableException"),
        ("GET", "/v1/namespaces/nowhere/tables/t", None, None, 404, "NoSuchTableException"),
        ("POST", "/v1/namespaces/db/tables/t", {"requirements": [{"type": "nonsense"}]}, None,
         400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/tables/t",
         {"requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
          "updates": [{"action": "set-properties", "updates": {"x": "y"}}]}, None,
         409, "CommitFailedException"),
        ("POST", "/v1/namespaces/db/tables",
         {"name": "outside", "location": str(tmp_path / "elsewhere"),
          "schema": {"type": "struct", "schema-id": 0, "fields": []}}, None,
         400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/tables",
         {"name": "escape", "location": config.warehouse + "/../escape",
          "schema": {"type": "struct", "schema-id": 0, "fields": []}}, None,
         400, "BadRequestException"),
        ("POST", "/v1/tables/rename", {"source": {"namespace": ["db"], "name": "t"}}, None,
         400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/register",
         {"name": "r", "metadata-location": str(tmp_path / "x.metadata.json")}, None,
         400, "BadRequestException"),
        ("GET", "/v1/no/such/route", None, None, 404, "NotFoundException"),
        # Found by an attack on the catalog; each was a 200 that wrote outside the warehouse,
        # or a 500, before the fix.
        ("POST", "/v1/namespaces/db/tables",
         {"name": "../../escaped", "schema": {"type": "struct", "schema-id": 0, "fields": []}},
         None, 400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/tables",
         {"name": "meta", "schema": {"type": "struct", "schema-id": 0, "fields": []},
          "properties": {"write.metadata.path": str(tmp_path / "outside-meta")}},
         None, 400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/tables/t",
         {"updates": [{"action": "set-properties",
                       "updates": {"write.data.path": str(tmp_path / "outside-data")}}]},
         None, 400, "BadRequestException"),
        ("POST", "/v1/namespaces/db/tables/t",
         {"updates": [{"action": "set-properties", "updates": [1]}]}, None,
         400, "BadRequestException"),
        ("POST", "/v1/namespaces", None, b'{"namespace": ["\\ud800"]}', 400,
         "BadRequestException"),
        ("GET", "/v1/namespaces?pageSize=%C2%B2", None, None, 400, "BadRequestException"),
    ]
    for method, path, body, raw, status, kind in cases:
        got, answer = call(method, base + path, body, raw=raw)
        assert (got, answer["error"]["type"]) == (status, kind), (method, path, answer)
        assert "Traceback" not in answer["error"]["message"]
    assert _declared_too_large(base) == 413
    assert catalog.list_namespaces() == [("db",)]
    assert catalog.list_tables("db") == [("db", "t")]
    assert catalog.load_table("db.t").properties == {}
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "escape").exists()
    assert not any((tmp_path / d).exists() for d in ("escaped", "outside-meta", "outside-data"))
    assert not (Path(config.warehouse).parent / "escaped").exists()


def _declared_too_large(base: str) -> int:
    """A request whose headers declare a body over the limit: refused before it is sent."""
    parsed = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.putrequest("POST", "/v1/namespaces")
    conn.putheader("Content-Length", str(17 * 1024 * 1024))
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_token_is_required_when_configured(url, tmp_path):
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0, token="s3cret")
    with RunningCatalog(config) as running:
        status, body = call("GET", running.url + "/v1/namespaces")
        assert status == 401 and body["error"]["type"] == "NotAuthorizedException"
        assert "s3cret" not in body["error"]["message"]
        status, _ = call("GET", running.url + "/v1/namespaces",
                         headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        assert RestCatalog("tso", uri=running.url, token="s3cret").list_namespaces() == []


def test_readers_at_read_ts_see_one_repeatable_cut_across_tables(served, catalog):
    """Writers append id i to a, then to b; a reader at T = read_ts() must see b's ids within
    a's, and the same rows when it reads at T again at the end."""
    running, _ = served
    catalog.create_namespace("db")
    for name in ("a", "b"):
        catalog.create_table(f"db.{name}", schema=SCHEMA)
    stop = threading.Event()
    failures: list[BaseException] = []
    seen: list[tuple[int, list[int], list[int]]] = []

    def writer(who: str, ids: range) -> None:
        try:
            own = RestCatalog("w", uri=running.url)
            for i in ids:
                for name in ("a", "b"):
                    for _ in range(20):  # another writer's commit moved the table: retry
                        try:
                            own.load_table(f"db.{name}").append(
                                pa.table({"id": [i], "who": [who]}, schema=SCHEMA))
                            break
                        except CommitFailedException:
                            continue
                    else:
                        raise AssertionError(f"append of {i} to {name} kept failing")
        except BaseException as exc:
            failures.append(exc)

    def reader() -> None:
        try:
            own = RestCatalog("r", uri=running.url)
            while not stop.is_set():
                ts = read_ts(running.url)
                cut = [_as_of(own.load_table(f"db.{n}"), ts) for n in ("a", "b")]
                seen.append((ts, *cut))
        except BaseException as exc:
            failures.append(exc)

    writers = [threading.Thread(target=writer, args=(w, range(k * 100, k * 100 + 6)))
               for k, w in enumerate(["x", "y"])]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in (*writers, *readers):
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not failures, failures
    assert len(seen) >= 2
    for ts, a, b in seen:
        assert set(b) <= set(a), (ts, a, b)
    final = {n: catalog.load_table(f"db.{n}") for n in ("a", "b")}
    assert rows(final["a"]) == rows(final["b"]) == sorted([*range(0, 6), *range(100, 106)])
    for ts, a, b in seen:  # the same cut, read again after every commit landed
        assert (_as_of(final["a"], ts), _as_of(final["b"], ts)) == (a, b), ts


def _as_of(table: Any, ts: int) -> list[int]:
    snapshot = table.snapshot_as_of_timestamp(ts)
    return rows(table, snapshot.snapshot_id) if snapshot else []


def test_two_replicas_on_one_database_lose_no_commit(url, tmp_path):
    asyncio.run(tsoracle.init(url))
    configs = [CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0) for _ in "ab"]
    with RunningCatalog(configs[0]) as one, RunningCatalog(configs[1]) as two:
        RestCatalog("1", uri=one.url).create_namespace("db")
        RestCatalog("1", uri=one.url).create_table("db.t", schema=SCHEMA)
        failures: list[BaseException] = []

        def append(base: str, ids: range) -> None:
            try:
                cat = RestCatalog("c", uri=base)
                for i in ids:
                    while True:
                        try:
                            cat.load_table("db.t").append(
                                pa.table({"id": [i], "who": [base]}, schema=SCHEMA))
                            break
                        except CommitFailedException:
                            continue
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=append, args=(base, range(k * 100, k * 100 + 8)))
                   for k, base in enumerate([one.url, two.url, one.url, two.url])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        table = RestCatalog("c", uri=two.url).load_table("db.t")
        assert rows(table) == sorted(i for k in range(4) for i in range(k * 100, k * 100 + 8))
        stamps = [e.timestamp_ms for e in table.metadata.snapshot_log]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps) == 32


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tsoracle.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["--url", "sqlite:///{tmp}/none.db"], "tsoracle init"),
    (["--url", "postgresql://someone:pa55word@127.0.0.1:1/db"], "cannot connect"),
    (["--url", "postgresql://someone:pa55word@db.internal.example:5432/db"], "cannot connect"),
    (["--url", "sqlite:///{tmp}/o.db", "--timeline", "nope"], "unknown timeline"),
    (["--url", "sqlite:///{tmp}/o.db", "--port", "70000"], "--port 70000"),
    (["--url", "sqlite:///{tmp}/o.db", "--token-file", "{tmp}/missing"], "--token-file"),
])
def test_catalog_serve_refuses_bad_setups_in_one_line(tmp_path, args, says):
    asyncio.run(tsoracle.init(f"sqlite:///{tmp_path}/o.db"))
    done = _cli("catalog", "serve", "--warehouse", str(tmp_path / "wh"), "--port", "0",
                *(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    for hidden in ("pa55word", "127.0.0.1", "db.internal.example"):
        assert hidden not in done.stderr


def test_catalog_serve_prints_its_address_and_serves(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    asyncio.run(tsoracle.init(url))
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    proc = subprocess.Popen([sys.executable, "-m", "tsoracle.cli", "catalog", "serve", "--url",
                             url, "--warehouse", str(tmp_path / "wh"), "--port", "0",
                             "--token-file", str(token)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("catalog: http://127.0.0.1:"), first
        catalog = RestCatalog("cli", uri=first.split(" ", 1)[1], token="t0ken")
        catalog.create_namespace("db")
        assert catalog.list_namespaces() == [("db",)]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_on_legacy_one_replica_leads_and_the_other_waits_for_a_flip(url, tmp_path):
    """Legacy serves one process per timeline: the replica whose leadership was taken answers
    503 and is not ready; once the deployment is flipped to distributed it serves again."""
    asyncio.run(tsoracle.init(url, implementation="legacy"))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as first:
        RestCatalog("1", uri=first.url).create_namespace("db")
        with RunningCatalog(config) as second:  # opening the timeline takes leadership
            RestCatalog("2", uri=second.url).create_table("db.t", schema=SCHEMA)
            status, body = call("POST", f"{first.url}/v1/namespaces/db/tables/t",
                                _set_properties("db", "t", k="v"))
            assert status == 503 and body["error"]["type"] == "ServiceUnavailableException"
            assert "tsoracle flip --to distributed" in body["error"]["message"]
            assert call("GET", f"{first.url}/readyz")[0] == 503
            assert call("GET", f"{second.url}/readyz")[0] == 200
            asyncio.run(tsoracle.flip(url, to="distributed"))
            assert call("GET", f"{first.url}/readyz")[0] == 200
            status, body = call("POST", f"{first.url}/v1/namespaces/db/tables/t",
                                _set_properties("db", "t", k="v"))
            assert status == 200, body
            assert catalog_props(second.url) == {"k": "v"}


def catalog_props(base: str) -> dict[str, str]:
    return dict(RestCatalog("p", uri=base).load_table("db.t").properties)


def test_registering_over_a_view_or_with_a_location_outside_is_refused(served, catalog):
    # Before: over a view, 8 lost "races" then a 409 CommitFailed; a planted metadata file
    # whose table location is outside the warehouse registered with a 200.
    running, config = served
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    view = VIEW
    assert call("POST", f"{running.url}/v1/namespaces/db/views", view)[0] == 200
    status, body = call("POST", f"{running.url}/v1/namespaces/db/register",
                        {"name": "v", "metadata-location": table.metadata_location,
                         "overwrite": True})
    assert status == 409 and body["error"]["type"] == "AlreadyExistsException", body
    planted = Path(config.warehouse) / "db" / "planted.metadata.json"
    data = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    planted.write_text(json.dumps({**data, "location": "file:///etc/elsewhere"}))
    status, body = call("POST", f"{running.url}/v1/namespaces/db/register",
                        {"name": "r", "metadata-location": str(planted)})
    assert status == 400 and "outside" in body["error"]["message"], body
    assert catalog.list_tables("db") == [("db", "t")]


def test_a_dropped_view_is_registered_again_and_bad_registrations_are_refused(served, catalog):
    """POST .../register-view (Iceberg 1.11's kit asks for it): the file as the view's current
    version; a taken name, a table's file, an outside location or a missing field refused."""
    running, config = served
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    view = VIEW
    status, created = call("POST", f"{running.url}/v1/namespaces/db/views", view)
    assert status == 200, created
    location = created["metadata-location"]
    register = f"{running.url}/v1/namespaces/db/register-view"
    status, body = call("POST", register, {"name": "v", "metadata-location": location})
    assert status == 409 and body["error"]["type"] == "AlreadyExistsException", body
    status, body = call("POST", register, {"name": "t", "metadata-location": location})
    assert status == 409 and body["error"]["type"] == "AlreadyExistsException", body
    assert call("DELETE", f"{running.url}/v1/namespaces/db/views/v")[0] == 204
    status, again = call("POST", register, {"name": "v2", "metadata-location": location})
    assert status == 200, again
    assert again["metadata-location"] == location
    assert again["metadata"]["view-uuid"] == created["metadata"]["view-uuid"]
    status, loaded = call("GET", f"{running.url}/v1/namespaces/db/views/v2")
    assert status == 200 and loaded["metadata"] == again["metadata"], loaded
    for bad, says in (({"name": "w"}, "metadata-location"),
                      ({"name": 7, "metadata-location": location}, "must be a string"),
                      ({"name": "w", "metadata-location": table.metadata_location},
                       "no readable view metadata"),
                      ({"name": "w", "metadata-location": "file:///etc/passwd"}, "outside")):
        status, body = call("POST", register, bad)
        assert status == 400 and says in body["error"]["message"], (bad, body)
    status, listed = call("GET", f"{running.url}/v1/namespaces/db/views")
    assert [i["name"] for i in listed["identifiers"]] == ["v2"], listed


def test_a_table_whose_metadata_file_is_gone_loads_as_not_found(served, catalog):
    """As Iceberg's reference server answers (1.11's kit): the file's absence, not stale
    metadata from the catalog's cache; the table loads again once the file is back."""
    running, _ = served
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    path = Path(table.metadata_location.removeprefix("file://"))
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    status, body = call("GET", f"{running.url}/v1/namespaces/db/tables/t")
    assert status == 404 and body["error"]["type"] == "NotFoundException", body
    assert body["error"]["message"] == \
        f"Failed to open input stream for file: {table.metadata_location}"
    aside.rename(path)
    assert catalog.load_table("db.t").metadata_location == table.metadata_location
