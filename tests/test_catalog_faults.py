"""The catalog under faults: lost COMMIT replies (for every kind of commit, and with two
replicas serving), injected serialization failures (both made on a real PostgreSQL by
tsoracle_dev.pgfaults), flips of the oracle under load, and a replica killed in the middle of
commits. In the load tests, pyiceberg writers append one id per commit; then:

- every acknowledged append is in the table exactly once (nothing acknowledged is lost);
- no id is there twice (nothing committed twice), and nothing that was never sent;
- the table's snapshot log is strictly increasing (no timestamp handed out twice).
An append may fail with CommitStateUnknown (504, the spec's "may have landed") or a 503; those
ids are allowed in the table at most once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.types import StringType

import tsoracle
from tsoracle.catalog import state
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle_dev.pgfaults import LossyRelay, SerializationFaults

# Starts tsoracle's own processes or HTTP servers: the full suite's, not `make test-fast`'s.
pytestmark = pytest.mark.served

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class Appends:
    acknowledged: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def append_ids(uri: Callable[[], str], ids: range, out: Appends) -> None:
    """Append each id in its own commit, retrying refused (409) commits as engines do."""
    for i in ids:
        for _ in range(50):
            try:
                table = RestCatalog("w", uri=uri()).load_table("db.t")
                table.append(pa.table({"id": [i]}, schema=SCHEMA))
                out.acknowledged.append(i)
                break
            except CommitFailedException:
                continue
            except CommitStateUnknownException:
                out.unknown.append(i)
                break
            except Exception as exc:  # an unavailable replica (503, refused connection)
                if "503" in str(exc) or "Connection" in str(exc) or "ServiceUnavailable" in \
                        exc.__class__.__name__:
                    out.unknown.append(i)
                    time.sleep(0.2)
                    break
                out.errors.append(f"{i}: {exc.__class__.__name__}: {exc}")
                break
        else:
            out.errors.append(f"{i}: refused 50 times")


def check_table(uri: str, out: Appends, sent: set[int]) -> list[int]:
    table = RestCatalog("check", uri=uri).load_table("db.t")
    found = table.scan().to_arrow()["id"].to_pylist()
    assert not out.errors, out.errors
    assert len(found) == len(set(found)), "an id was committed twice"
    assert set(out.acknowledged) <= set(found), "an acknowledged append is missing"
    assert set(found) <= sent
    assert set(found) - set(out.acknowledged) <= set(out.unknown)
    stamps = [e.timestamp_ms for e in table.metadata.snapshot_log]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False)), stamps
    assert_files_exist(table)
    return found


def assert_files_exist(table: Any) -> None:
    """The current metadata file and every one its log names are on disk (a catalog caches
    metadata in memory: only the disk tells whether a file it deleted is still referenced)."""
    for location in [table.metadata_location, *(e.metadata_file
                                                 for e in table.metadata.metadata_log)]:
        assert Path(urlparse(location).path).exists(), location


def _prepare(uri: str) -> None:
    catalog = RestCatalog("setup", uri=uri)
    catalog.create_namespace("db")
    catalog.create_table("db.t", schema=SCHEMA)


@contextmanager
def lossy(pg: Any, tmp_path: Path, *, seed: int | None = None,
          replicas: int = 1) -> Iterator[tuple[LossyRelay, list[RunningCatalog]]]:
    """Catalog replicas on a fresh schema of the real PostgreSQL, reached through a relay that
    loses replies; `db.t` made."""
    relay = LossyRelay(pg.port, seed=seed)
    try:
        url = relay.url(f"{pg.url()}?schema=c_{uuid.uuid4().hex[:8]}")
        asyncio.run(tsoracle.init(url))
        config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
        with ExitStack() as stack:
            running = [stack.enter_context(RunningCatalog(config)) for _ in range(replicas)]
            _prepare(running[0].url)
            yield relay, running
    finally:
        relay.close()


def _run_writers(uri: Callable[[], str], writers: int, per_writer: int,
                 during: Callable[[], None] | None = None) -> tuple[Appends, set[int]]:
    out = Appends()
    ranges = [range(w * 1000, w * 1000 + per_writer) for w in range(writers)]
    threads = [threading.Thread(target=append_ids, args=(uri, r, out)) for r in ranges]
    for t in threads:
        t.start()
    if during is not None:
        during()
    for t in threads:
        t.join()
    return out, {i for r in ranges for i in r}


def test_lost_commit_replies_neither_duplicate_nor_lose_a_commit(pg, tmp_path):
    with lossy(pg, tmp_path, seed=7) as (relay, [running]):
        relay.rate = 0.05
        out, sent = _run_writers(lambda: running.url, writers=3, per_writer=12)
        relay.rate = 0.0
        check_table(running.url, out, sent)
    assert relay.lost > 0
    assert len(out.acknowledged) >= len(sent) // 2, out


def test_a_commit_whose_reply_was_lost_is_recognised_not_redone(pg, tmp_path):
    """The next COMMIT reply after each `arm` is lost: the catalog's own transaction's. Its
    retried body finds its commit mark and answers success."""
    with lossy(pg, tmp_path) as (relay, [running]):
        table = RestCatalog("w", uri=running.url).load_table("db.t")
        for i in range(4):
            relay.arm(1)
            table.append(pa.table({"id": [i]}, schema=SCHEMA))
            assert relay.lost == i + 1
        found = RestCatalog("c", uri=running.url).load_table("db.t")
        assert sorted(found.scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 3]
        assert len(found.snapshots()) == 4
        assert_files_exist(found)


def test_injected_serialization_failures_are_retried_unseen(pg, database, tmp_path):
    schema = "s_" + uuid.uuid4().hex[:8]
    url = f"{database}?schema={schema}"
    asyncio.run(tsoracle.init(url))
    faults = SerializationFaults(pg, database.rsplit("/", 1)[1])
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    try:
        with RunningCatalog(config) as running:
            _prepare(running.url)
            faults.install(schema, ("iceberg_objects", "iceberg_uppers", "timestamps"))
            faults.set_rate(0.3)
            out, sent = _run_writers(lambda: running.url, writers=3, per_writer=10)
            faults.set_rate(0.0)
            found = check_table(running.url, out, sent)
        assert sorted(found) == sorted(sent) == sorted(out.acknowledged)
    finally:
        faults.set_rate(0.0)


def test_flips_under_load_hand_out_no_timestamp_twice(url, tmp_path):
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as running:
        _prepare(running.url)
        flips: list[str] = []

        def flip_back_and_forth() -> None:
            for target in ["legacy", "distributed", "legacy", "distributed"]:
                time.sleep(0.4)
                asyncio.run(tsoracle.flip(url, to=target))
                flips.append(target)

        out, sent = _run_writers(lambda: running.url, writers=3, per_writer=10,
                                 during=flip_back_and_forth)
        found = check_table(running.url, out, sent)
        assert flips == ["legacy", "distributed", "legacy", "distributed"]
        assert sorted(found) == sorted(sent) == sorted(out.acknowledged)


def test_a_replica_killed_mid_commit_loses_and_duplicates_nothing(url, tmp_path):
    asyncio.run(tsoracle.init(url))
    replicas: list[subprocess.Popen[str]] = []
    addresses: list[str] = []

    def start() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tsoracle.cli", "catalog", "serve", "--url", url,
             "--warehouse", str(tmp_path / "wh"), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("catalog: "), (line, proc.stderr.read() if proc.stderr else "")
        replicas.append(proc)
        addresses.append(line.split(" ", 1)[1])

    try:
        start()
        _prepare(addresses[-1])

        def kill_and_replace() -> None:
            for _ in range(2):
                time.sleep(1.0)
                os.kill(replicas[-1].pid, signal.SIGKILL)
                replicas[-1].wait()
                start()

        out, sent = _run_writers(lambda: addresses[-1], writers=3, per_writer=12,
                                 during=kill_and_replace)
        found = check_table(addresses[-1], out, sent)
        assert len(replicas) == 3
        assert len(found) >= len(out.acknowledged) > 0
    finally:
        for proc in replicas:
            proc.kill()
            proc.communicate()


def test_metadata_files_of_refused_attempts_are_removed(url, tmp_path):
    asyncio.run(tsoracle.init(url))
    config = CatalogConfig(url=url, warehouse=str(tmp_path / "wh"), port=0)
    with RunningCatalog(config) as running:
        _prepare(running.url)
        out, sent = _run_writers(lambda: running.url, writers=4, per_writer=6)
        check_table(running.url, out, sent)
        table = RestCatalog("c", uri=running.url).load_table("db.t")
    listed = {p.name for p in Path(tmp_path / "wh" / "db" / "t" / "metadata").glob(
        "*.metadata.json")}
    kept = {Path(e.metadata_file).name for e in table.metadata.metadata_log}
    current = Path(table.metadata_location).name
    # Every metadata file is one the table's history names: a refused attempt's is deleted.
    assert listed == kept | {current}, listed - kept - {current}


def test_a_drop_whose_reply_was_lost_is_recognised_and_purged(pg, tmp_path):
    """A drop leaves no pointer to find: its retried body took the gone table for one another
    commit had moved, and the client got 404 NoSuchTable for a drop that had landed (its purge
    never ran). Each commit's mark in iceberg_commits now tells."""
    with lossy(pg, tmp_path) as (relay, [running]):
        catalog = RestCatalog("w", uri=running.url)
        catalog.load_table("db.t").append(pa.table({"id": [1, 2]}, schema=SCHEMA))
        catalog.create_table("db.kept", schema=SCHEMA)
        relay.arm(1)
        catalog.purge_table("db.t")  # raised NoSuchTableError before
        assert relay.lost == 1
        assert not catalog.table_exists("db.t") and catalog.table_exists("db.kept")
        folder = tmp_path / "wh" / "db" / "t"
        deadline = time.monotonic() + 60
        while any(folder.rglob("*.parquet")) or any(folder.rglob("*.avro")):
            assert time.monotonic() < deadline, sorted(folder.rglob("*"))
            time.sleep(0.2)
        # The name is free again, and a table made under it starts empty.
        fresh = catalog.create_table("db.t", schema=SCHEMA)
        assert fresh.scan().to_arrow().num_rows == 0

def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _properties(name: str, step: str) -> dict[str, Any]:
    return {"identifier": {"namespace": ["db"], "name": name}, "requirements": [],
            "updates": [{"action": "set-properties", "updates": {"step": step}}]}


def test_renames_transactions_and_schema_changes_whose_reply_was_lost_land_once(pg, tmp_path):
    """Every kind of commit, its COMMIT reply lost: answered as landed, and landed once."""
    with lossy(pg, tmp_path) as (relay, [running]):
        catalog = RestCatalog("w", uri=running.url)
        for name in ("a", "b"):
            catalog.create_table(f"db.{name}", schema=SCHEMA)
        relay.arm(1)
        catalog.rename_table("db.t", "db.renamed")
        assert relay.lost == 1
        assert catalog.table_exists("db.renamed") and not catalog.table_exists("db.t")

        logs = {n: len(catalog.load_table(f"db.{n}").metadata.metadata_log) for n in "ab"}
        relay.arm(1)
        status = _post(f"{running.url}/v1/transactions/commit", {"table-changes": [
            _properties("a", "1"), _properties("b", "1")]})
        assert (status, relay.lost) == (204, 2)
        a, b = catalog.load_table("db.a"), catalog.load_table("db.b")
        assert a.properties["step"] == b.properties["step"] == "1"
        assert a.metadata.last_updated_ms == b.metadata.last_updated_ms
        # One new metadata file each: the transaction landed once, not again on retry.
        assert {n: len(t.metadata.metadata_log) for n, t in (("a", a), ("b", b))} == {
            n: c + 1 for n, c in logs.items()}

        relay.arm(1)
        with catalog.load_table("db.renamed").update_schema() as update:
            update.add_column("note", StringType())
        assert relay.lost == 3
        renamed = catalog.load_table("db.renamed")
        assert [f.name for f in renamed.schema().fields] == ["id", "note"]
        assert len(renamed.metadata.schemas) == 2
        for table in (a, b, renamed):
            assert_files_exist(table)

def test_two_replicas_with_lost_replies_duplicate_and_lose_nothing(pg, tmp_path):
    with lossy(pg, tmp_path, seed=11, replicas=2) as (relay, [one, two]):
        turn = itertools.cycle([one.url, two.url])
        relay.rate = 0.05
        out, sent = _run_writers(lambda: next(turn), writers=4, per_writer=10)
        relay.rate = 0.0
        check_table(two.url, out, sent)
    assert relay.lost > 0
    assert len(out.acknowledged) >= len(sent) // 2, out


def test_a_retry_that_looks_before_the_lost_commit_is_visible_looks_again(pg, tmp_path,
                                                                          monkeypatch):
    """The retried body may look for its mark while the first attempt's COMMIT is still under
    way on the server (not visible yet). Its claim on the upper then waits and finds it taken:
    that used to count as "nothing landed", the written files were deleted under a pointer
    that named them, and the client was told to retry. Here the first look is made blind."""
    real = state.committed
    looks: list[bool] = []

    async def first_look_blind(tx: Any, timeline: str, ts: int) -> bool:
        found = await real(tx, timeline, ts)
        looks.append(found)
        return found and len(looks) > 1

    with lossy(pg, tmp_path) as (relay, [running]):
        monkeypatch.setattr(state, "committed", first_look_blind)
        table = RestCatalog("w", uri=running.url).load_table("db.t")
        relay.arm(1)
        table.append(pa.table({"id": [7]}, schema=SCHEMA))
        found = RestCatalog("c", uri=running.url).load_table("db.t")
        assert_files_exist(found)
        assert found.scan().to_arrow()["id"].to_pylist() == [7]
        assert len(found.snapshots()) == 1
        assert relay.lost == 1 and looks[:2] == [True, True], looks  # the second look saw it
