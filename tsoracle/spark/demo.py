"""`tsoracle demo`: the main job, end to end on the embedded default (no servers).

Several writer threads append to a timestamped table through group commit, a reader reads
linearized and serializable snapshots, the oracle flips implementation mid-run (with bootstrap),
and every invariant is checked and reported.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tsoracle.oracle import flip, init

SCHEMA = "writer INT, seq INT, payload STRING"


@dataclass
class Report:
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks[name] = self.checks.get(name, True) and ok
        if not ok:
            self.notes.append(f"FAILED {name}: {detail}")


def progress(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_demo(*, writers: int = 3, batches: int = 4, rows: int = 50,
             data_dir: str | None = None, keep: bool = False) -> int:
    from pyspark.sql import SparkSession

    from tsoracle.spark.client import OracleClient

    root = Path(data_dir or tempfile.mkdtemp(prefix="tsoracle-demo-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{root / 'oracle.db'}"
    report = Report()
    started = time.monotonic()
    progress(f"data directory {root}; oracle {url}")
    asyncio.run(init(url, timelines=["EpochMilliseconds"], implementation="distributed"))
    progress("starting local Spark (a few seconds)...")
    spark = (SparkSession.builder.master("local[2]").appName("tsoracle-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    client = OracleClient(url, data_dir=root / "tables")
    try:
        table = client.create_table(spark, "events", spark.createDataFrame([], SCHEMA).schema)
        stamps: list[int] = []
        started_after_flip: list[int] = []  # commit timestamps of appends begun after the flip
        flipped = threading.Event()
        reads = {"linearized": 0, "serializable": 0, "repeated": 0}
        lock = threading.Lock()
        done = threading.Event()
        total_batches = writers * batches
        flip_at = total_batches // 2
        flip_info: dict[str, object] = {}

        def writer(w: int) -> None:
            for b in range(batches):
                df = spark.createDataFrame(
                    [(w, b * rows + i, f"w{w}-b{b}-r{i}") for i in range(rows)], SCHEMA)
                after_flip = flipped.is_set()
                ts = table.append(df)
                if after_flip:
                    started_after_flip.append(ts)
                seen = table.read().where(f"writer = {w}").count()
                report.check("append visible to the next linearized read",
                             seen == (b + 1) * rows, f"writer {w} saw {seen}")
                with lock:
                    stamps.append(ts)
                    n = len(stamps)
                if n % max(1, total_batches // 4) == 0:
                    progress(f"{n}/{total_batches} append groups committed")

        def reader() -> None:
            last = -1
            while not done.is_set():
                ts, df = table.read_with_ts("linearized")
                count = df.count()
                report.check("linearized reads never go backwards", count >= last,
                             f"{count} after {last}")
                last = count
                again = table.read(ts).count()
                report.check("a read repeated at the same timestamp is identical",
                             again == count, f"{again} != {count} at {ts}")
                ser_ts = client.closed_ts(table.timeline)
                ser = table.read(ser_ts).count()
                report.check("serializable snapshot repeats", table.read(ser_ts).count() == ser)
                with lock:
                    reads["linearized"] += 1
                    reads["serializable"] += 1
                    reads["repeated"] += 1
                time.sleep(0.2)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        read_thread = threading.Thread(target=reader)
        read_thread.start()
        progress(f"{writers} writers x {batches} batches x {rows} rows; 1 reader")
        for t in threads:
            t.start()
        while len(stamps) < flip_at and any(t.is_alive() for t in threads):
            time.sleep(0.05)
        with lock:
            before_flip = max(stamps, default=0)
        result = asyncio.run(flip(url, to="legacy"))
        flipped.set()
        flip_info.update(epoch=result.epoch, bootstrap=result.bootstrap["EpochMilliseconds"])
        progress(f"flipped distributed -> legacy: epoch {result.epoch}, bootstrap "
                 f"{flip_info['bootstrap']}")
        report.check("flip bootstrap covers every timestamp handed out before it",
                     result.bootstrap["EpochMilliseconds"] >= before_flip)
        for t in threads:
            t.join()
        done.set()
        read_thread.join()
        report.check("appends begun after the flip commit above its bootstrap",
                     all(s > result.bootstrap["EpochMilliseconds"] for s in started_after_flip),
                     f"{started_after_flip} vs {result.bootstrap}")
        final_ts, final = table.read_with_ts("linearized")
        total = final.count()
        distinct = final.select("writer", "seq").distinct().count()
        expected = writers * batches * rows
        report.check("no row lost", total == expected, f"{total} != {expected}")
        report.check("no row duplicated", distinct == total, f"{distinct} distinct of {total}")
        commits = table.changelog(final_ts).select("_ts").distinct().count()
        report.check("one timestamp per group commit, never reused",
                     commits == len(set(stamps)), f"{commits} vs {len(set(stamps))}")
        report.check("reads after the flip come from the new implementation",
                     client.implementation() == "legacy" and client.epoch() == result.epoch)
        elapsed = time.monotonic() - started
        print()
        print("tsoracle demo report")
        print(f"  rows written         {expected} ({writers} writers, {total_batches} appends, "
              f"{len(set(stamps))} group commits)")
        print(f"  rows read (final)    {total} at timestamp {final_ts}")
        print(f"  reads                {reads['linearized']} linearized, "
              f"{reads['serializable']} serializable, {reads['repeated']} repeated")
        print(f"  timestamps           {min(stamps)} .. {max(stamps)}")
        print(f"  flip                 distributed -> legacy at epoch {flip_info['epoch']}, "
              f"bootstrap {flip_info['bootstrap']}; client reopened {client.reopens}x")
        print("  invariants")
        for name, ok in report.checks.items():
            print(f"    [{'ok' if ok else 'FAIL'}] {name}")
        for note in report.notes[:10]:
            print(f"    {note}")
        print(f"  elapsed              {elapsed:.1f} s")
        return 0 if all(report.checks.values()) else 1
    finally:
        client.close()
        spark.stop()
        if not keep and data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run_demo(keep=bool(os.environ.get("KEEP"))))
