"""What ordering commits by the oracle costs a Spark job on Iceberg, and what concurrent
appends from one driver get.

    python bench/spark_overhead.py [--url URL] [--n 20] [--rows 1000] [--threads 1 --threads 4]

The catalog runs in this process (on SQLite in a temporary folder unless --url names an
initialised oracle), so its commit path can be timed from inside:

- an append: the whole `Lakehouse.append` (a Spark job writing Parquet, then the commit);
  of it, the catalog's commit (`Ordering.commit`: write_ts, the metadata file, the upper's and
  the pointer's compare-and-set, apply_write), and of that, the oracle calls alone;
- a linearized read: `read_ts()` (one HTTP round trip: the oracle's read_ts, the upper raised)
  against the Spark job that reads the table at that timestamp (`count()`);
- K threads appending to one table at once: appends per second, the commits the catalog
  refused (409: the table moved since the writer loaded it; the Iceberg client retries) and
  its internal conflicts (a fresh timestamp taken inside the catalog).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

import tsoracle
from tsoracle.catalog.ordering import Ordering
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.spark import Lakehouse


class Timed:
    """Durations of an async method of a class, recorded while `on` is set (instrumentation
    of this process's own catalog, not a replacement of it)."""

    def __init__(self, cls: type, name: str) -> None:
        self.samples: list[float] = []
        self.on = False
        inner: Callable[..., Awaitable[Any]] = getattr(cls, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                if self.on:
                    self.samples.append(time.perf_counter() - started)

        setattr(cls, name, timed)


def conflicts() -> float:
    return sum(REGISTRY.get_sample_value("tsoracle_catalog_conflicts_total", {"kind": k}) or 0
               for k in ("moved", "superseded"))


def refused() -> float:
    """Commits the catalog answered 409: a requirement failed (the table moved since the
    writer loaded it); the Iceberg client reloads and commits again."""
    return REGISTRY.get_sample_value(
        "tsoracle_catalog_request_seconds_count",
        {"route": "/v1/namespaces/{namespace}/tables/{table}", "status": "409"}) or 0


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--threads", type=int, action="append")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tso-bench-"))
    url = a.url or f"sqlite:///{tmp / 'oracle.db'}"
    if a.url is None:
        asyncio.run(tsoracle.init(url))
    commit = Timed(Ordering, "commit")
    oracle_calls = [Timed(ReopeningOracle, "write_ts"), Timed(ReopeningOracle, "apply_write")]
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(tmp / "warehouse"),
                                      port=0)) as catalog:
        lake = Lakehouse.start(catalog.url, app_name="tsoracle-bench")
        lake.spark.sparkContext.setLogLevel("ERROR")
        table = f"bench_{int(time.time())}.t"
        lake.create_table(table, "id INT, v STRING")
        batch = lake.spark.createDataFrame([(i, f"v{i}") for i in range(a.rows)],
                                           "id INT, v STRING")
        for _ in range(3):  # warm up Spark, the catalog and the oracle
            lake.append(table, batch)
            lake.read(table).count()
        append_total, read_oracle, read_spark = [], [], []
        for timer in (commit, *oracle_calls):
            timer.on = True
        for _ in range(a.n):
            t0 = time.perf_counter()
            lake.append(table, batch)
            append_total.append(time.perf_counter() - t0)
        for timer in (commit, *oracle_calls):
            timer.on = False
        for _ in range(a.n):
            t0 = time.perf_counter()
            ts = lake.read_ts()
            read_oracle.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lake.read(table, ts).count()
            read_spark.append(time.perf_counter() - t0)
        # The oracle's calls within each commit: write_ts and apply_write alternate.
        calls = [w + ap for w, ap in zip(oracle_calls[0].samples, oracle_calls[1].samples,
                                          strict=False)]
        concurrent = {}
        for k in a.threads or [1, 4]:
            before, before_409 = conflicts(), refused()
            errors: list[BaseException] = []

            def appender(errors: list[BaseException] = errors) -> None:
                try:
                    for _ in range(max(1, a.n // 2)):
                        lake.append(table, batch)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=appender) for _ in range(k)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            concurrent[str(k)] = {
                "appends_per_s": round(k * max(1, a.n // 2) / elapsed, 2),
                "catalog_conflicts": int(conflicts() - before),
                "commits_refused_409": int(refused() - before_409), "errors": len(errors)}
        lake.spark.stop()
    print(json.dumps({
        "backend": url.split(":")[0], "rows_per_append": a.rows, "n": a.n,
        "append_total_ms": ms(append_total),
        "append_catalog_commit_ms": ms(commit.samples),
        "append_oracle_calls_ms": ms(calls),
        "append_commit_ratio": round(statistics.median(commit.samples)
                                     / statistics.median(append_total), 4),
        "read_ts_ms": ms(read_oracle),
        "read_spark_job_ms": ms(read_spark),
        "read_overhead_ratio": round(statistics.median(read_oracle)
                                     / statistics.median(read_spark), 4),
        "concurrent_appends_one_table": concurrent,
    }, indent=2))


if __name__ == "__main__":
    main()
