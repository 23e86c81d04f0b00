"""Idempotency-Key (catalog/idempotency.py): a mutation retried with its key lands once and
gets its first answer, on SQLite and PostgreSQL, from one replica or two, one retry at a time
or many at once; a key reused for another request is refused."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import tsoracle
from tests.test_catalog import call
from tsoracle.catalog import idempotency
from tsoracle.catalog.errors import BadRequest, CommitFailed, Contended, no_table
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle.store import open_backend, parse_url

SCHEMA = {"type": "struct", "schema-id": 0,
          "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
TABLE = "/v1/namespaces/db/tables/t"


def _key() -> str:
    return str(uuid.uuid4())


def _keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def _props(**updates: str) -> dict[str, Any]:
    return {"updates": [{"action": "set-properties", "updates": updates}]}


def _commits(base: str) -> int:
    """How many commits the table has had (its metadata log and its current file)."""
    status, table = call("GET", base + TABLE)
    assert status == 200, table
    return len(table["metadata"]["metadata-log"]) + 1


def _running(url: str, warehouse: Path, **extra: Any) -> RunningCatalog:
    return RunningCatalog(CatalogConfig(url=url, warehouse=str(warehouse), port=0, **extra))


@pytest.fixture
def served(url: str, tmp_path: Path):
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    with _running(url, tmp_path / "warehouse") as running:
        base = running.url
        assert call("POST", base + "/v1/namespaces", {"namespace": ["db"]})[0] == 200
        assert call("POST", base + "/v1/namespaces/db/tables",
                    {"name": "t", "schema": SCHEMA})[0] == 200
        yield base


def _sql(url: str, statement: str) -> None:
    async def run() -> None:
        backend = open_backend(parse_url(url))
        await backend.open()
        try:
            await backend.fetch(statement)
        finally:
            await backend.close()

    asyncio.run(run())


# --- the rules, without a server ------------------------------------------------------------

def test_a_key_is_a_uuid_in_its_canonical_form():
    key = "017F22E2-79B0-7CC3-98C4-DC0C0C07398F"
    assert idempotency.parse_key(key) == key.lower()
    for bad in ("", "nope", key[:-1], key + "0", "{" + key + "}", key.replace("-", "")):
        with pytest.raises(BadRequest, match="UUID"):
            idempotency.parse_key(bad)


def test_a_fingerprint_tells_method_path_and_body_apart():
    prints = {idempotency.fingerprint(m, p, q, b) for m, p, q, b in (
        ("POST", "/v1/a", "", b"{}"), ("DELETE", "/v1/a", "", b"{}"),
        ("POST", "/v1/b", "", b"{}"), ("POST", "/v1/a", "", b"{ }"),
        ("POST", "/v1/a{}", "", b""), ("POST", "/v1/", "", b"a{}"),
        ("DELETE", "/v1/a", "purgeRequested=true", b""), ("DELETE", "/v1/a", "", b""))}
    assert len(prints) == 8
    assert idempotency.fingerprint("POST", "/v1/a", "", b"{}") in prints


def test_the_lifetime_is_advertised_as_an_iso_8601_duration():
    assert [idempotency.lifetime_text(s) for s in (1800, 3600, 5445, 45, 0)] == \
        ["PT30M", "PT1H", "PT1H30M45S", "PT45S", "PT0S"]


def test_successes_and_deterministic_refusals_are_final_and_nothing_else():
    assert idempotency.final(200, None) and idempotency.final(204, None)
    assert idempotency.final(409, CommitFailed("Requirement failed: ..."))
    assert idempotency.final(404, no_table(("db", "t")))
    assert not idempotency.final(409, Contended("lost 8 races; try again"))
    assert not idempotency.final(409, idempotency.KeyTaken("another landed first"))
    assert not any(idempotency.final(s, None) for s in (408, 429, 500, 503, 504))


# --- a served catalog -------------------------------------------------------------------------

@pytest.mark.served
def test_the_catalog_advertises_its_key_lifetime(url, tmp_path):
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    with _running(url, tmp_path / "w", key_lifetime_s=5445) as running:
        status, config = call("GET", running.url + "/v1/config")
    assert status == 200 and config["idempotency-key-lifetime"] == "PT1H30M45S", config


@pytest.mark.served
def test_a_retried_commit_lands_once_and_gets_its_first_answer(served):
    before = _commits(served)
    key = _key()
    first = call("POST", served + TABLE, _props(a="1"), headers=_keyed(key))
    assert first[0] == 200, first
    for _ in range(3):
        assert call("POST", served + TABLE, _props(a="1"), headers=_keyed(key)) == first
    assert _commits(served) == before + 1
    # Without a key the same request is a new commit each time (what the key prevents).
    call("POST", served + TABLE, _props(a="1"))
    assert _commits(served) == before + 2


@pytest.mark.served
def test_every_kind_of_change_is_answered_once(served):
    """Namespaces, tables, views, renames, drops and transactions: each retried with its key
    gets the first answer, and the retry changes nothing (a create would be a 409 otherwise,
    a drop a 404)."""
    view = {"name": "v", "schema": SCHEMA, "view-version": {
        "version-id": 1, "timestamp-ms": 1, "schema-id": 0, "summary": {},
        "representations": [{"type": "sql", "sql": "select 1", "dialect": "spark"}],
        "default-namespace": ["db"]}, "properties": {}}
    requests = [
        ("POST", "/v1/namespaces", {"namespace": ["ns2"], "properties": {"a": "1"}}),
        ("POST", "/v1/namespaces/ns2/properties", {"updates": {"b": "2"}, "removals": ["a"]}),
        ("POST", "/v1/namespaces/db/tables", {"name": "u", "schema": SCHEMA}),
        ("POST", "/v1/tables/rename", {"source": {"namespace": ["db"], "name": "u"},
                                       "destination": {"namespace": ["db"], "name": "u2"}}),
        ("POST", "/v1/transactions/commit", {"table-changes": [
            {"identifier": {"namespace": ["db"], "name": "u2"}, "requirements": [],
             "updates": _props(x="1")["updates"]}]}),
        ("DELETE", "/v1/namespaces/db/tables/u2", None),
        ("POST", "/v1/namespaces/db/views", view),
        ("DELETE", "/v1/namespaces/db/views/v", None),
        ("DELETE", "/v1/namespaces/ns2", None),
    ]
    for method, path, body in requests:
        key = _key()
        first = call(method, served + path, body, headers=_keyed(key))
        assert first[0] in (200, 204), (path, first)
        assert call(method, served + path, body, headers=_keyed(key)) == first, path


@pytest.mark.served
def test_a_key_reused_for_another_request_is_refused(served):
    key = _key()
    assert call("POST", served + TABLE, _props(a="1"), headers=_keyed(key))[0] == 200
    before = _commits(served)
    for method, path, body in (("POST", TABLE, _props(a="2")),
                               ("POST", "/v1/namespaces", {"namespace": ["other"]}),
                               ("DELETE", TABLE, None)):
        status, answer = call(method, served + path, body, headers=_keyed(key))
        assert (status, answer["error"]["type"]) == (422, "UnprocessableEntityException")
        assert "send a new key" in answer["error"]["message"]
    assert _commits(served) == before
    assert call("GET", served + "/v1/namespaces/other")[0] == 404


@pytest.mark.served
def test_a_key_reused_with_another_query_is_refused(served):
    """Before: the query was not in the fingerprint, so a drop with purgeRequested=true
    replayed the earlier drop's 204 and never purged."""
    key = _key()
    assert call("DELETE", served + TABLE + "?purgeRequested=false", headers=_keyed(key)) == \
        (204, None)
    status, answer = call("DELETE", served + TABLE + "?purgeRequested=true",
                          headers=_keyed(key))
    assert (status, answer["error"]["type"]) == (422, "UnprocessableEntityException")


@pytest.mark.served
def test_a_malformed_key_is_a_400_and_changes_nothing(served):
    before = _commits(served)
    status, answer = call("POST", served + TABLE, _props(a="1"), headers=_keyed("retry-1"))
    assert (status, answer["error"]["type"]) == (400, "BadRequestException"), answer
    assert "Idempotency-Key" in answer["error"]["message"]
    assert _commits(served) == before


@pytest.mark.served
def test_a_deterministic_refusal_is_replayed_even_once_it_would_succeed(served):
    key = _key()
    body = {"namespace": ["db"]}
    status, answer = call("POST", served + "/v1/namespaces", body, headers=_keyed(key))
    assert (status, answer["error"]["type"]) == (409, "AlreadyExistsException")
    assert call("DELETE", served + TABLE)[0] == 204
    assert call("DELETE", served + "/v1/namespaces/db")[0] == 204
    # A new key would create it now; the old one tells the first answer again.
    assert call("POST", served + "/v1/namespaces", body, headers=_keyed(key)) == (status, answer)
    assert call("GET", served + "/v1/namespaces/db")[0] == 404


@pytest.mark.served
def test_concurrent_retries_with_one_key_land_once(served):
    before = _commits(served)
    key = _key()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda _: call("POST", served + TABLE, _props(c="1"), headers=_keyed(key)),
            range(16)))
    assert answers[0][0] == 200 and all(a == answers[0] for a in answers), answers
    assert _commits(served) == before + 1


@pytest.mark.served
def test_a_reply_lost_on_the_way_to_the_client_is_replayed(served):
    """The client sends its commit and goes away before the answer (a lost reply): the commit
    lands; the client's retry with the key gets the answer and lands nothing more."""
    before = _commits(served)
    key = _key()
    body = b'{"updates": [{"action": "set-properties", "updates": {"lost": "1"}}]}'
    where = urlsplit(served)
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(b"POST " + TABLE.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nIdempotency-Key: " + key.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    for _ in range(200):  # it lands after the client left: wait for the commit, not a time
        if _commits(served) == before + 1:
            break
        time.sleep(0.05)
    status, answer = call("POST", served + TABLE, _props(lost="1"), headers=_keyed(key))
    assert status == 200 and answer["metadata"]["properties"]["lost"] == "1", answer
    assert _commits(served) == before + 1


@pytest.mark.served
def test_an_answer_lost_with_its_server_is_rebuilt_from_what_landed(url, served):
    """The change landed (its key with it) but its answer was never recorded (the server
    died before it could): a retry gets the table as it is now, 204 for a drop, and lands
    nothing more."""
    key = _key()
    first = call("POST", served + TABLE, _props(a="1"), headers=_keyed(key))
    _sql(url, "UPDATE {iceberg_idempotency} SET status = NULL, body = NULL")
    before = _commits(served)
    status, answer = call("POST", served + TABLE, _props(a="1"), headers=_keyed(key))
    assert status == 200 and _commits(served) == before
    assert answer["metadata-location"] == first[1]["metadata-location"]
    drop = _key()
    assert call("DELETE", served + TABLE, headers=_keyed(drop))[0] == 204
    _sql(url, "UPDATE {iceberg_idempotency} SET status = NULL, body = NULL")
    assert call("DELETE", served + TABLE, headers=_keyed(drop)) == (204, None)


@pytest.mark.served
def test_a_key_outlives_its_lifetime_only_by_the_grace(url, tmp_path):
    """After the advertised lifetime and the grace, the key is new again (its row pruned or
    ignored): the same request lands a second time."""
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    with _running(url, tmp_path / "w", key_lifetime_s=1) as running:
        base = running.url
        call("POST", base + "/v1/namespaces", {"namespace": ["db"]})
        call("POST", base + "/v1/namespaces/db/tables", {"name": "t", "schema": SCHEMA})
        key = _key()
        call("POST", base + TABLE, _props(a="1"), headers=_keyed(key))
        call("POST", base + TABLE, _props(a="1"), headers=_keyed(key))
        assert _commits(base) == 2
        # Age the row past lifetime and grace (no sleeping through the grace).
        shift = (1 + idempotency.GRACE_S) * 1000 + 1
        _sql(url, f"UPDATE {{iceberg_idempotency}} SET at_ms = at_ms - {shift}")
        call("POST", base + TABLE, _props(a="1"), headers=_keyed(key))
        assert _commits(base) == 3


@pytest.mark.pg
@pytest.mark.served
def test_two_replicas_answer_one_key_once(pg, tmp_path):
    """A retry that reaches the other replica gets the first answer; concurrent copies sent to
    both land once (the second replica finds the key taken in its own transaction)."""
    url = f"{pg.url()}?schema=idem_{uuid.uuid4().hex[:8]}"
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    with _running(url, tmp_path / "w") as a, _running(url, tmp_path / "w") as b:
        assert call("POST", a.url + "/v1/namespaces", {"namespace": ["db"]})[0] == 200
        assert call("POST", a.url + "/v1/namespaces/db/tables",
                    {"name": "t", "schema": SCHEMA})[0] == 200
        key = _key()
        first = call("POST", a.url + TABLE, _props(a="1"), headers=_keyed(key))
        assert call("POST", b.url + TABLE, _props(a="1"), headers=_keyed(key)) == first
        before = _commits(a.url)
        for round_ in range(5):
            key = _key()
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(
                    lambda i, r=str(round_), k=key: call(
                        "POST", (a.url, b.url)[i % 2] + TABLE, _props(r=r), headers=_keyed(k)),
                    range(8)))
            assert all(x == answers[0] for x in answers) and answers[0][0] == 200, answers
        assert _commits(a.url) == before + 5


@pytest.mark.pg
@pytest.mark.served
def test_copies_on_two_replicas_that_fail_on_what_the_other_landed_get_its_answer(pg, tmp_path):
    """Before: the copy that lost the race failed on the name or requirement the winner's
    change took (409, 404), not on the key, and its refusal became the key's answer, over the
    landed one: a client told "already exists" or "refresh and apply again" for its own
    change."""
    url = f"{pg.url()}?schema=idem_{uuid.uuid4().hex[:8]}"
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds"]))
    with _running(url, tmp_path / "w") as a, _running(url, tmp_path / "w") as b:
        assert call("POST", a.url + "/v1/namespaces", {"namespace": ["db"]})[0] == 200
        wrong = []
        for i in range(12):
            tables = "/v1/namespaces/db/tables"
            assert call("POST", a.url + tables, {"name": f"t{i}", "schema": SCHEMA})[0] == 200
            schema = {**SCHEMA, "schema-id": 1, "fields": [
                *SCHEMA["fields"], {"id": 2, "name": "x", "type": "long", "required": False}]}
            for method, path, body in (
                    ("POST", "/v1/namespaces", {"namespace": [f"n{i}"]}),
                    ("POST", f"{tables}/t{i}", {
                        "requirements": [{"type": "assert-current-schema-id",
                                          "current-schema-id": 0}],
                        "updates": [{"action": "add-schema", "schema": schema},
                                    {"action": "set-current-schema", "schema-id": -1}]}),
                    ("DELETE", f"{tables}/t{i}", None)):
                key, start = _key(), threading.Barrier(2)

                def send(base: str, method=method, path=path, body=body, key=key,
                         start=start) -> tuple[int, Any]:
                    start.wait()
                    return call(method, base + path, body, headers=_keyed(key))

                with ThreadPoolExecutor(2) as pool:
                    answers = list(pool.map(send, (a.url, b.url)))
                again = call(method, a.url + path, body, headers=_keyed(key))
                if {x[0] for x in [*answers, again]} - {200, 204}:
                    wrong.append((path, [x[0] for x in answers], again[0]))
        assert not wrong, wrong


@pytest.mark.pg
@pytest.mark.served
def test_a_keyed_namespace_change_whose_commit_reply_was_lost_answers_as_landed(pg, tmp_path):
    """Before: the database layer ran the create again after its COMMIT reply was lost; the
    namespace was there (the first run landed), so the answer was 409, recorded over the
    landed key. Now the landed key's answer is given."""
    from tests.test_catalog_faults import lossy

    with lossy(pg, tmp_path) as (relay, [running]):
        for i, (method, path, body) in enumerate((
                ("POST", "/v1/namespaces", {"namespace": ["lost"]}),
                ("POST", "/v1/namespaces/lost/properties", {"updates": {"a": "1"}}),
                ("DELETE", "/v1/namespaces/lost", None))):
            key = _key()
            relay.arm(1)
            first = call(method, running.url + path, body, headers=_keyed(key))
            assert relay.lost == i + 1
            assert first[0] in (200, 204), (path, first)
            assert call(method, running.url + path, body, headers=_keyed(key)) == first
