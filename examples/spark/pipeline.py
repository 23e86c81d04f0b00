"""A Spark driver that appends rows to an Iceberg table through tsoracle's catalog and reads them
back, as of oracle timestamps.

Submitted with `spark-submit --master k8s://… --deploy-mode cluster` (see docs/spark.md), it
runs in the driver pod: it finds the catalog through the TimestampOracle resource
(`status.catalog.url`, read with the pod's ServiceAccount; the bearer token comes from the
environment), its executors write the data files into the warehouse, and every append is one
commit at one oracle timestamp. After each append it reads the table linearized and checks that
every append that finished before the read began is there: its own, and those other drivers
reported finished.

    pipeline.py --resource orders --namespace etl --writer a --progress /data/progress

It prints one line `TSORACLE_PIPELINE_REPORT {json}` and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from tsoracle.spark import Lakehouse, TableExists
from tsoracle.spark.session import JAR_ENV

SCHEMA = "writer STRING, batch BIGINT, seq BIGINT"
TOKEN_ENV = "TSORACLE_CATALOG_TOKEN"


def catalog_url(resource: str, namespace: str) -> str:
    """The catalog the operator runs for the resource (spec.catalog), from its status."""
    from kubernetes import client, config

    config.load_incluster_config()
    obj: dict[str, Any] = client.CustomObjectsApi().get_namespaced_custom_object(
        "tsoracle.io", "v1alpha1", namespace, "timestamporacles", resource)
    url = ((obj.get("status") or {}).get("catalog") or {}).get("url")
    if not url:
        raise SystemExit(f"TimestampOracle {namespace}/{resource} publishes no catalog "
                         "(status.catalog.url): enable spec.catalog and wait for CatalogReady")
    return str(url)


def ship_nothing() -> dict[str, str]:
    """Where Iceberg's runtime is among Spark's own jars (the tsoracle-spark image: in the driver
    and every executor), Spark need not copy it to each executor (48 MB) again."""
    jar = Path(os.environ.get(JAR_ENV, ""))
    home = Path(os.environ.get("SPARK_HOME", "/nonexistent"))
    return {"spark.jars": ""} if jar.parent == home / "jars" and jar.is_file() else {}


def finished_elsewhere(progress: Path, writer: str) -> dict[str, int]:
    """writer -> batches other drivers reported finished (files they write after each append)."""
    done = {}
    for path in progress.glob("*.done"):
        if path.stem != writer:
            done[path.stem] = int(path.read_text() or 0)
    return done


def median_ms(call: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource", required=True, help="the TimestampOracle's name")
    parser.add_argument("--namespace", required=True, help="the TimestampOracle's namespace")
    parser.add_argument("--writer", required=True, help="this driver's name in the rows")
    parser.add_argument("--progress", required=True,
                        help="a folder every driver mounts, for 'batch finished' notes")
    parser.add_argument("--table", default="etl.events", help="namespace.name")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200, help="rows per append")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between appends")
    parser.add_argument("--measure", type=int, default=0, metavar="N",
                        help="also time N linearized read timestamps and report the median")
    args = parser.parse_args(argv)

    lake = Lakehouse.start(catalog_url(args.resource, args.namespace),
                           token=os.environ.get(TOKEN_ENV) or None,
                           app_name=f"tsoracle-pipeline-{args.writer}",
                           extra_conf=ship_nothing())
    spark = lake.spark
    for attempt in range(3):  # drivers started together race to create it
        try:
            lake.create_table(args.table, SCHEMA, if_not_exists=True)
            break
        except TableExists:
            break  # another driver created it between the check and the create
        except Exception as exc:
            if "ALREADY_EXISTS" not in str(exc) or attempt == 2:  # ... or its namespace
                raise
    progress = Path(args.progress)
    progress.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"writer": args.writer, "appends": [], "failures": []}
    failures: list[str] = report["failures"]
    for batch in range(args.batches):
        rows = spark.range(args.rows, numPartitions=2).select(
            F.lit(args.writer).alias("writer"), F.lit(batch).cast("long").alias("batch"),
            F.col("id").alias("seq"))
        started = time.monotonic()
        ts = lake.append(args.table, rows)
        append_ms = (time.monotonic() - started) * 1000
        (progress / f"{args.writer}.done").write_text(str(batch + 1))
        others = finished_elsewhere(progress, args.writer)  # finished before the read begins
        started = time.monotonic()
        cut = lake.cut([args.table])  # linearized: read_ts(), then the table as of it
        counts = {(r["writer"], r["batch"]): r["n"] for r in cut[args.table].groupBy(
            "writer", "batch").agg(F.count("*").alias("n")).collect()}
        read_ms = (time.monotonic() - started) * 1000
        if cut.ts < ts:
            failures.append(f"read at {cut.ts} is below own append at {ts}")
        for b in range(batch + 1):
            if counts.get((args.writer, b)) != args.rows:
                failures.append(f"own batch {b}: {counts.get((args.writer, b))} rows seen")
        for other, done in others.items():
            for b in range(done):
                if counts.get((other, b)) != args.rows:
                    failures.append(f"{other}'s finished batch {b} not seen in full")
        report["appends"].append({"batch": batch, "ts": ts, "read_ts": cut.ts,
                                  "append_ms": round(append_ms, 1),
                                  "read_ms": round(read_ms, 1)})
        time.sleep(args.pause)
    # The whole table at the end: every row once; and each of this driver's appends became
    # visible exactly at the timestamp its commit returned (absent just below it).
    final = lake.cut([args.table])
    rows_now = final[args.table]
    stamps = {}
    for entry in report["appends"]:
        mine = (F.col("writer") == args.writer) & (F.col("batch") == entry["batch"])
        at, below = (lake.read(args.table, t).where(mine).count()
                     for t in (entry["ts"], entry["ts"] - 1))
        if (at, below) != (args.rows, 0):
            failures.append(f"batch {entry['batch']} committed at {entry['ts']}: {at} rows "
                            f"there, {below} just below")
        stamps[f"{args.writer}/{entry['batch']}"] = entry["ts"]
    report["final"] = {"read_ts": final.ts, "rows": rows_now.count(),
                       "distinct": rows_now.select("writer", "batch", "seq").distinct().count(),
                       "stamps": stamps}
    if args.measure > 0:
        report["read_ts_ms"] = median_ms(lake.read_ts, args.measure)
    print("TSORACLE_PIPELINE_REPORT " + json.dumps(report), flush=True)
    spark.stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
