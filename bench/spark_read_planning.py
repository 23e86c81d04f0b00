"""Read time against the number of commits, before and after compaction.

For each N, a fresh table gets N one-row appends; `read().count()` is timed (median of 3)
before and after `compact()`.

    python bench/spark_read_planning.py --commits 10 --commits 100 --commits 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tsoracle_dev.spark_local import local_spark_client


def timed_read(table) -> float:  # noqa: ANN001
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        table.read().count()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--commits", type=int, action="append", default=[])
    a = p.parse_args()
    spark, client, work = local_spark_client("tsoracle-planning-")
    try:
        for n in a.commits or [10, 100]:
            table = client.create_table(spark, f"t{n}",
                                        spark.createDataFrame([], "k INT, v STRING").schema)
            for i in range(n):
                table.append(spark.createDataFrame([(i, "v")], "k INT, v STRING"))
            before = timed_read(table)
            t0 = time.perf_counter()
            folded = table.compact()
            compact_s = time.perf_counter() - t0
            after = timed_read(table)
            print(json.dumps({"commits": n, "read_before_s": round(before, 3),
                              "compact_s": round(compact_s, 2), "folded": folded,
                              "read_after_s": round(after, 3)}), flush=True)
    finally:
        client.close()
        spark.stop()


if __name__ == "__main__":
    main()
