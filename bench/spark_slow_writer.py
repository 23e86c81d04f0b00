"""One slow writer against one fast writer on the same timeline: conflicts and latency.

The slow writer's append takes about `--slow-s` seconds to write its Parquet files (a Python UDF
that sleeps); the fast writer appends one row to another table of the same timeline every
`--fast-every-s` seconds. Every commit on the timeline moves its upper, so the slow writer's
compare-and-set fails whenever a fast commit landed while it was writing. Reported per slow
append: latency and the number of commit attempts that lost (before_commit calls - 1).

    python bench/spark_slow_writer.py --appends 3 --slow-s 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from tsoracle_dev.spark_local import local_spark_client


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--appends", type=int, default=3)
    p.add_argument("--slow-s", type=float, default=3.0)
    p.add_argument("--fast-every-s", type=float, default=0.05)
    a = p.parse_args()
    from pyspark.sql import functions as F

    spark, client, work = local_spark_client("tsoracle-slow-")
    schema = spark.createDataFrame([], "k INT, v STRING").schema
    slow_t = client.create_table(spark, "slow", schema)
    fast_t = client.create_table(spark, "fast", schema)
    attempts = [0]
    slow_t.before_commit = lambda _ts: attempts.__setitem__(0, attempts[0] + 1)
    delay = a.slow_s

    @F.udf("string")
    def slowly(v: str) -> str:
        time.sleep(delay)
        return v

    stop = threading.Event()
    fast_commits = [0]

    def fast() -> None:
        while not stop.is_set():
            fast_t.append(spark.createDataFrame([(1, "f")], "k INT, v STRING"))
            fast_commits[0] += 1
            time.sleep(a.fast_every_s)

    runner = threading.Thread(target=fast)
    runner.start()
    results = []
    try:
        for i in range(a.appends):
            attempts[0] = 0
            df = spark.createDataFrame([(i, "s")], "k INT, v STRING").withColumn("v", slowly("v"))
            t0 = time.monotonic()
            slow_t.append(df)
            results.append({"latency_s": round(time.monotonic() - t0, 2),
                            "conflicts": attempts[0] - 1})
    finally:
        stop.set()
        runner.join()
        client.close()
        spark.stop()
    print(json.dumps({"slow_s": a.slow_s, "appends": results,
                      "median_latency_s": statistics.median(r["latency_s"] for r in results),
                      "total_conflicts": sum(r["conflicts"] for r in results),
                      "fast_commits": fast_commits[0]}))


if __name__ == "__main__":
    main()
