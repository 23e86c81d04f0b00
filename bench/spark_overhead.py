"""The oracle's share of a Spark read and of a Spark append group.

    python bench/spark_overhead.py [--url URL] [--n 20] [--rows 1000]

Read: a linearized read costs one batched read_ts plus one catalog seal; compared with the Spark
job that reads the table at an explicit timestamp (`count()`). Append: the oracle's part of a
group commit (write_ts, the catalog compare-and-set, apply_write) compared with the whole
append (which also writes Parquet). Defaults to SQLite in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

import tsoracle
from tsoracle.spark import OracleClient, catalog


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--rows", type=int, default=1000)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tso-bench-"))
    url = a.url or f"sqlite:///{tmp / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    with OracleClient(url, data_dir=tmp / "tables") as client:
        table = client.create_table(spark, "bench", spark.createDataFrame(
            [], "id INT, v STRING").schema)
        batch = spark.createDataFrame([(i, f"v{i}") for i in range(a.rows)], "id INT, v STRING")
        for _ in range(3):  # warm up Spark and the oracle
            table.read().count()
            table.append(batch)
        append_total, append_oracle, read_oracle, read_spark = [], [], [], []
        for _ in range(a.n):
            t0 = time.perf_counter()
            table.append(batch)
            append_total.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ts = client.write_ts()
            info = table.info
            client.run(catalog.seal(client.backend, info.timeline, ts))  # the CAS's cost
            client.apply_write(ts)
            append_oracle.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ts = table.resolve("linearized")
            read_oracle.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            table.read(ts).count()
            read_spark.append(time.perf_counter() - t0)
    spark.stop()
    med = statistics.median
    print(json.dumps({
        "backend": url.split(":")[0], "rows_per_append": a.rows, "n": a.n,
        "read_oracle_ms": round(med(read_oracle) * 1000, 2),
        "read_spark_job_ms": round(med(read_spark) * 1000, 1),
        "read_overhead_ratio": round(med(read_oracle) / med(read_spark), 4),
        "append_oracle_ms": round(med(append_oracle) * 1000, 2),
        "append_total_ms": round(med(append_total) * 1000, 1),
        "append_overhead_ratio": round(med(append_oracle) / med(append_total), 4),
    }, indent=2))


if __name__ == "__main__":
    main()
