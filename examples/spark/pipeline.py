"""A Spark driver that appends timestamped rows and reads them back, on the configured oracle.

Submitted with `spark-submit --master k8s://… --deploy-mode cluster` (see docs/spark.md), it
runs in the driver pod: it finds the oracle only through the TimestampOracle resource (the pod's
ServiceAccount), its executors write the Parquet files, and every append is one group commit.
After each append it reads the table linearized and checks that every append that finished
before the read began is there: its own, and those other drivers reported finished.

    pipeline.py --resource orders --namespace etl --writer a --data /data/tables

It prints one line `TSORACLE_PIPELINE_REPORT {json}` and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tsoracle.errors import NotInitialized
from tsoracle.spark import OracleClient
from tsoracle.spark.table import TimestampedTable

SCHEMA = StructType([StructField("writer", StringType()), StructField("batch", LongType()),
                     StructField("seq", LongType())])


def open_table(client: OracleClient, spark: SparkSession, name: str) -> TimestampedTable:
    """The shared table; the first driver creates it, a racing one opens it."""
    for _ in range(20):
        try:
            return client.table(spark, name)
        except NotInitialized:
            try:
                return client.create_table(spark, name, SCHEMA)
            except Exception:  # noqa: BLE001 - another driver created it first: open it
                time.sleep(0.5)
    raise SystemExit(f"table {name!r} could neither be opened nor created")


def finished_elsewhere(progress: Path, writer: str) -> dict[str, int]:
    """writer -> batches other drivers reported finished (files they write after each append)."""
    done = {}
    for path in progress.glob("*.done"):
        other = path.stem
        if other != writer:
            done[other] = int(path.read_text() or 0)
    return done


def median_ms(call: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def oracle_share(client: OracleClient, table: TimestampedTable, commits_ms: list[float],
                 n: int) -> dict[str, float]:
    """Median milliseconds this driver spends on the oracle's database, Spark left out: per
    append group (write_ts, the catalog commit of its files, apply_write) and per linearized
    read (read_ts, the catalog's upper, the seal: before Spark lists and reads the files)."""
    timeline = table.timeline
    stamps: list[int] = []
    shares = {"write_ts": median_ms(
        lambda: stamps.append(client.write_ts(timeline).timestamp), n)}
    shares["apply_write"] = median_ms(lambda: client.apply_write(stamps.pop(0), timeline), n)
    shares["commit"] = round(statistics.median(commits_ms), 2) if commits_ms else 0.0
    shares["append_group"] = round(shares["write_ts"] + shares["commit"]
                                   + shares["apply_write"], 2)
    shares["linearized_read"] = median_ms(lambda: table.resolve("linearized"), n)
    return shares


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource", required=True, help="the TimestampOracle's name")
    parser.add_argument("--namespace", required=True, help="the TimestampOracle's namespace")
    parser.add_argument("--writer", required=True, help="this driver's name in the rows")
    parser.add_argument("--data", required=True, help="folder both driver and executors mount")
    parser.add_argument("--table", default="events")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200, help="rows per append")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between appends")
    parser.add_argument("--measure", type=int, default=0, metavar="N",
                        help="also time N of each oracle call and report the medians")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.appName(f"tsoracle-pipeline-{args.writer}").getOrCreate()
    client = OracleClient.from_resource(args.resource, args.namespace, data_dir=args.data)
    table = open_table(client, spark, args.table)
    progress = Path(args.data) / "_progress"
    progress.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {"writer": args.writer, "appends": [], "failures": []}
    commits_ms: list[float] = []  # each catalog commit's time, from the table's hooks
    commit_began: dict[int, float] = {}
    table.before_commit = lambda ts: commit_began.__setitem__(ts, time.perf_counter())
    table.after_commit = lambda ts: commits_ms.append(
        (time.perf_counter() - commit_began.pop(ts)) * 1000)
    failures: list[str] = report["failures"]  # type: ignore[assignment]
    for batch in range(args.batches):
        rows = spark.range(args.rows, numPartitions=2).select(
            F.lit(args.writer).alias("writer"), F.lit(batch).cast("long").alias("batch"),
            F.col("id").alias("seq"))
        started = time.monotonic()
        ts = table.append(rows)
        append_ms = (time.monotonic() - started) * 1000
        # Which oracle stamped it: the one open now (a flip reopens it on the next call).
        epoch, implementation = client.epoch(), client.implementation()
        (progress / f"{args.writer}.done").write_text(str(batch + 1))
        others = finished_elsewhere(progress, args.writer)  # finished before the read begins
        started = time.monotonic()
        read_ts, df = table.read_with_ts()
        counts = {(r["writer"], r["batch"]): r["n"] for r in
                  df.groupBy("writer", "batch").agg(F.count("*").alias("n")).collect()}
        read_ms = (time.monotonic() - started) * 1000
        if read_ts < ts:
            failures.append(f"read at {read_ts} is below own append at {ts}")
        for b in range(batch + 1):
            if counts.get((args.writer, b)) != args.rows:
                failures.append(f"own batch {b}: {counts.get((args.writer, b))} rows seen")
        for other, done in others.items():
            for b in range(done):
                if counts.get((other, b)) != args.rows:
                    failures.append(f"{other}'s finished batch {b} not seen in full")
        report["appends"].append({  # type: ignore[union-attr]
            "batch": batch, "ts": ts, "read_ts": read_ts, "epoch": epoch,
            "implementation": implementation, "append_ms": round(append_ms, 1),
            "read_ms": round(read_ms, 1)})
        time.sleep(args.pause)
    # The whole table at the end: every row once, and each append's rows under one timestamp,
    # the one its group commit returned.
    final_ts, rows_now = table.read_with_ts()
    stamps = {(r["writer"], r["batch"]): [int(t) for t in r["stamps"]] for r in
              table.changelog(final_ts).groupBy("writer", "batch")
              .agg(F.collect_set("_ts").alias("stamps")).collect()}
    for entry in report["appends"]:  # type: ignore[union-attr]
        got = stamps.get((args.writer, entry["batch"]))
        if got != [entry["ts"]]:
            failures.append(f"batch {entry['batch']}: stamped {got}, committed at {entry['ts']}")
    report["final"] = {"read_ts": final_ts, "rows": rows_now.count(),
                       "distinct": rows_now.select("writer", "batch", "seq").distinct().count(),
                       "stamps": {f"{w}/{b}": ts for (w, b), ts in sorted(stamps.items())}}
    report["reopens"] = client.reopens
    if args.measure > 0:
        try:
            report["oracle_ms"] = oracle_share(client, table, commits_ms, args.measure)
        except Exception as exc:  # noqa: BLE001 - the report still says what was checked
            failures.append(f"measuring the oracle: {type(exc).__name__}: {exc}")
    print("TSORACLE_PIPELINE_REPORT " + json.dumps(report), flush=True)
    client.close()
    spark.stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
