"""Spark drivers on the oracle: real local Spark, real PostgreSQL and SQLite files."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

import tsoracle
from tsoracle.spark import OracleClient
from tsoracle.spark.table import join

pytestmark = pytest.mark.serializable  # CockroachDB's isolation too (conftest.py)

SCHEMA = "writer INT, seq INT"
DRIVER = [sys.executable, "-m", "tsoracle_dev.spark_driver"]


@pytest.fixture
def setup(url, tmp_path, spark):
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:other"]))
    client = OracleClient(url, data_dir=tmp_path / "tables")
    table = client.create_table(spark, "shared", spark.createDataFrame([], SCHEMA).schema)
    yield client, table
    client.close()


def rows(spark, writer: int, n: int, start: int = 0):
    return spark.createDataFrame([(writer, start + i) for i in range(n)], SCHEMA)


def test_append_is_visible_to_linearized_reads_in_every_driver(setup, spark, url, tmp_path):
    client, table = setup
    other = OracleClient(url, data_dir=tmp_path / "tables")  # a second driver's client
    try:
        for b in range(3):
            table.append(rows(spark, 1, 10, b * 10))
            assert other.table(spark, "shared").read().count() == (b + 1) * 10
            assert table.read().count() == (b + 1) * 10
    finally:
        other.close()


def test_concurrent_appends_from_three_driver_processes(setup, spark, url, tmp_path):
    client, table = setup
    procs = [subprocess.Popen([*DRIVER, url, str(tmp_path / "tables"),
                               str(w), "4", "25"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(3)]
    stamps = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        stamps += json.loads(out.strip().splitlines()[-1])["stamps"]
    final = table.read()
    assert final.count() == 3 * 4 * 25
    assert final.distinct().count() == 3 * 4 * 25  # nothing duplicated
    assert len(stamps) == len(set(stamps)) == 12  # one timestamp per group, never shared
    changes = table.changelog().groupBy("_ts").count().collect()
    assert len(changes) == 12


def test_multi_writer_hazard_is_ruled_out(setup, spark, url, tmp_path):
    """A gets ts first but is delayed before its commit; B commits and applies a higher ts;
    a reader reads at B's ts. A must not land below it: it retries at a fresh timestamp."""
    client, table = setup
    b_client = OracleClient(url, data_dir=tmp_path / "tables")
    b_table = b_client.table(spark, "shared")
    a_ts: list[int] = []
    b_done = threading.Event()

    def delay_a(ts: int) -> None:
        a_ts.append(ts)
        if len(a_ts) == 1:
            assert b_done.wait(60)  # hold A between write_ts and its commit

    table.before_commit = delay_a
    result: dict[str, int] = {}
    a_thread = threading.Thread(target=lambda: result.update(a=table.append(rows(spark, 1, 5))))
    a_thread.start()
    deadline = time.monotonic() + 300  # only a hang reaches this
    while not a_ts:
        assert time.monotonic() < deadline and a_thread.is_alive(), "A never allocated"
        time.sleep(0.01)
    b_commit = b_table.append(rows(spark, 2, 7))
    assert b_commit > a_ts[0]
    read_at, snapshot = b_table.read_with_ts("linearized")
    assert read_at >= b_commit
    before = sorted(snapshot.collect())
    b_done.set()
    a_thread.join(60)
    assert len(a_ts) == 2 and a_ts[1] > read_at  # A lost the compare-and-set and retried
    assert result["a"] == a_ts[1]
    assert sorted(table.read(read_at).collect()) == before  # the same read, the same answer
    assert table.read().count() == 12
    b_client.close()


def test_repeated_reads_at_one_timestamp_are_identical(setup, spark):
    client, table = setup
    table.append(rows(spark, 1, 3))
    ts, first = table.read_with_ts()
    expected = sorted(first.collect())
    table.append(rows(spark, 2, 3))
    table.retract(rows(spark, 1, 1))
    assert sorted(table.read(ts).collect()) == expected
    assert table.read().count() == 5
    with pytest.raises(tsoracle.ConfigError, match="not closed yet"):
        table.read(ts + 10**9)


def test_upsert_by_key(setup, spark, tmp_path):
    client, _ = setup
    kv = client.create_table(spark, "kv", spark.createDataFrame([], "k INT, v STRING").schema,
                             keys=("k",))
    kv.append(spark.createDataFrame([(1, "a"), (2, "b")], "k INT, v STRING"))
    kv.upsert(spark.createDataFrame([(2, "B"), (3, "c")], "k INT, v STRING"))
    assert sorted(tuple(r) for r in kv.read().collect()) == [(1, "a"), (2, "B"), (3, "c")]
    with pytest.raises(tsoracle.ConfigError, match="duplicate keys"):
        kv.upsert(spark.createDataFrame([(1, "x"), (1, "y")], "k INT, v STRING"))


def test_flip_during_a_running_pipeline(setup, spark, url):
    client, table = setup
    stop = threading.Event()
    commits: list[tuple[bool, int]] = []
    flipped = threading.Event()

    def pipeline() -> None:
        i = 0
        while not stop.is_set():
            after = flipped.is_set()
            commits.append((after, table.append(rows(spark, 1, 2, i))))
            i += 2

    def wait_until(what: str, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 300  # only a hang reaches this
        while not predicate():
            assert worker.is_alive(), "the pipeline thread died"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    worker = threading.Thread(target=pipeline)
    worker.start()
    wait_until("a commit before the flip", lambda: len(commits) >= 1)
    before_epoch = client.epoch()
    result = asyncio.run(tsoracle.flip(url, to="legacy"))
    flipped.set()
    wait_until("two commits started after the flip",
               lambda: sum(started_after for started_after, _ in commits) >= 2)
    stop.set()
    worker.join(300)
    assert not worker.is_alive()
    assert client.epoch() == result.epoch == before_epoch + 1
    assert client.implementation() == "legacy" and client.reopens >= 1
    stamps = [ts for _, ts in commits]
    assert len(stamps) == len(set(stamps))  # no timestamp reused
    after = [ts for started_after, ts in commits if started_after]
    assert after and min(after) > result.bootstrap["EpochMilliseconds"]
    assert table.read().count() == 2 * len(commits)


def test_cross_timeline_join_fails_before_spark_runs(setup, spark):
    client, table = setup
    other = client.create_table(spark, "elsewhere", spark.createDataFrame([], SCHEMA).schema,
                                timeline="counter:other")
    with pytest.raises(tsoracle.TimelineMismatch) as err:
        join(table, other, on="writer")
    assert "EpochMilliseconds" in str(err.value) and "counter:other" in str(err.value)
    same = client.create_table(spark, "same", spark.createDataFrame([], "writer INT, x INT")
                               .schema)
    table.append(rows(spark, 1, 2))
    same.append(spark.createDataFrame([(1, 9)], "writer INT, x INT"))
    assert join(table, same, on="writer").count() == 2


def test_bad_input_leaves_no_partial_commit(setup, spark, tmp_path):
    client, table = setup
    table.append(rows(spark, 1, 2))
    ts_before, _ = table.read_with_ts()
    commits_before = table.changelog().select("_ts").distinct().count()
    with pytest.raises(tsoracle.ConfigError, match="schema mismatch"):
        table.append(spark.createDataFrame([(1, "x")], "writer INT, seq STRING"))
    with pytest.raises(tsoracle.ConfigError, match="schema mismatch"):
        table.append(spark.createDataFrame([(1,)], "writer INT"))
    assert table.changelog().select("_ts").distinct().count() == commits_before
    assert table.read().count() == 2
    with pytest.raises(tsoracle.NotInitialized, match="does not exist"):
        client.table(spark, "nope")
    with pytest.raises(tsoracle.ConfigError, match="already exists"):
        client.create_table(spark, "shared", spark.createDataFrame([], "a INT").schema)
    with pytest.raises(tsoracle.ConfigError, match="reserved"):
        client.create_table(spark, "bad", spark.createDataFrame([], "_ts INT").schema)


def test_a_table_whose_files_are_gone_says_what_to_do(setup, spark, tmp_path):
    """The catalog outlives a data folder that was emptied or replaced (seen when the Spark
    demo ran twice on one dev cluster, each run with a new hostPath folder)."""
    import shutil

    client, table = setup
    table.append(rows(spark, 1, 2))
    shutil.rmtree(tmp_path / "tables" / "shared")
    with pytest.raises(tsoracle.ConfigError, match=r"committed files that are gone \((file:)?/"
                       r".*shared/data/.*client\.drop_table\(spark, 'shared'\)"):
        table.read().count()
    client.drop_table(spark, "shared")  # what the message says; the name is free again
    again = client.create_table(spark, "shared", spark.createDataFrame([], SCHEMA).schema)
    again.append(rows(spark, 1, 3))
    assert again.read().count() == 3


def test_unreachable_oracle_is_a_clear_error(tmp_path):
    with pytest.raises(tsoracle.OracleUnavailable, match="cannot connect"):
        OracleClient("postgresql://u:pw@127.0.0.1:1/db", data_dir=tmp_path)


def test_streaming_sink_commits_each_micro_batch_once(setup, spark, tmp_path):
    client, table = setup
    source = tmp_path / "incoming"
    source.mkdir()
    (source / "a.json").write_text("\n".join(json.dumps({"writer": 5, "seq": i})
                                             for i in range(4)))

    def run_stream() -> None:
        query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream
                 .foreachBatch(table.streaming_sink("ingest"))
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)

    run_stream()
    assert table.read().where("writer = 5").count() == 4
    (source / "b.json").write_text(json.dumps({"writer": 5, "seq": 99}))
    run_stream()
    assert table.read().where("writer = 5").count() == 5
    # Replaying a committed batch (as a restarted query would) adds nothing.
    sink = table.streaming_sink("ingest")
    sink(spark.createDataFrame([(5, 0)], SCHEMA), 0)
    assert table.read().where("writer = 5").count() == 5
