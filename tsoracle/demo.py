"""`tsoracle demo`: the main job, end to end on the embedded default (no servers).

A SQLite oracle, tsoracle's Iceberg catalog served in-process, a local warehouse and local
Spark with Iceberg. Writer threads append each batch to `orders`, then to `shipments`; readers
take a cut of both tables at one timestamp; the oracle flips implementation mid-run and the
catalog follows; every cut is read again at the end, in Spark, in pyiceberg (a second engine)
and, with `tsoracle[duckdb]` installed, in DuckDB (a third), and every invariant is checked and
reported. It stands above the engines' helpers (Spark's and DuckDB's), which know nothing of
each other.
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
from typing import TYPE_CHECKING, Any

from tsoracle.errors import MissingExtra
from tsoracle.oracle import flip, init, status

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from tsoracle.duckdb import DuckCatalog
    from tsoracle.spark.lakehouse import AsOf, Lakehouse

SCHEMA = "writer INT, seq INT, payload STRING"
ORDERS, SHIPMENTS = "demo.orders", "demo.shipments"
Rows = frozenset[tuple[int, int]]  # (writer, seq) of each row
KINDS: tuple[AsOf, ...] = ("linearized", "serializable")


@dataclass
class Report:
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.checks[name] = self.checks.get(name, True) and ok
            if not ok:
                self.notes.append(f"FAILED {name}: {detail}")


@dataclass(frozen=True)
class SeenCut:
    ts: int
    kind: str  # "linearized" or "serializable"
    orders: Rows
    shipments: Rows


def progress(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def keys(df: DataFrame) -> Rows:
    return frozenset((r.writer, r.seq) for r in df.select("writer", "seq").collect())


def run_demo(*, writers: int = 3, batches: int = 4, rows: int = 50,
             data_dir: str | None = None, keep: bool = False) -> int:
    import pyspark  # noqa: F401  (the spark extra first: without it, that is what to install)
    from pyiceberg.catalog.rest import RestCatalog

    from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
    from tsoracle.spark.lakehouse import Lakehouse

    root = Path(data_dir or tempfile.mkdtemp(prefix="tsoracle-demo-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{root / 'oracle.db'}"
    started = time.monotonic()
    progress(f"data directory {root}; oracle {url}")
    asyncio.run(init(url, timelines=["EpochMilliseconds"], implementation="distributed"))
    catalog = RunningCatalog(CatalogConfig(url=url, warehouse=str(root / "warehouse"), port=0))
    progress(f"catalog: {catalog.url} (tsoracle's Iceberg REST catalog, warehouse "
             f"{root / 'warehouse'})")
    progress("starting local Spark with Iceberg (a few seconds)...")
    lake: Lakehouse | None = None
    try:
        lake = Lakehouse.start(catalog.url, app_name="tsoracle-demo")
        lake.spark.sparkContext.setLogLevel("ERROR")
        return _story(lake, RestCatalog("tso", uri=catalog.url), url, writers=writers,
                      batches=batches, rows=rows, started=started)
    finally:
        if lake is not None:
            lake.spark.stop()
        catalog.close()
        if not keep and data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _story(lake: Lakehouse, second: Any, url: str, *, writers: int, batches: int, rows: int,
           started: float) -> int:
    report = Report()
    for table in (ORDERS, SHIPMENTS):
        lake.create_table(table, SCHEMA)
    stamps: list[int] = []  # every append's commit timestamp
    after_flip: list[int] = []  # those of appends begun after the flip
    cuts: list[SeenCut] = []
    flipped = threading.Event()
    done = threading.Event()
    lock = threading.Lock()
    errors: list[str] = []
    total_batches = writers * batches

    def writer(w: int) -> None:
        try:
            for b in range(batches):
                df = lake.spark.createDataFrame(
                    [(w, b * rows + i, f"w{w}-b{b}-r{i}") for i in range(rows)], SCHEMA)
                began_after = flipped.is_set()
                order_ts = lake.append(ORDERS, df)
                ship_ts = lake.append(SHIPMENTS, df)
                report.check("each shipment commits above its order", ship_ts > order_ts,
                             f"{ship_ts} <= {order_ts}")
                seen = lake.read(SHIPMENTS).where(f"writer = {w}").count()
                report.check("an append is visible to the next linearized read",
                             seen == (b + 1) * rows, f"writer {w} saw {seen}")
                with lock:
                    stamps.extend((order_ts, ship_ts))
                    if began_after:
                        after_flip.extend((order_ts, ship_ts))
                    n = len(stamps) // 2
                if n % max(1, total_batches // 4) == 0:
                    progress(f"{n}/{total_batches} batches committed to both tables")
        except Exception as exc:  # reported; the thread must not die silently
            errors.append(f"writer {w}: {exc.__class__.__name__}: {exc}")

    def reader() -> None:
        last = -1
        try:
            while not done.is_set():
                for kind in KINDS:
                    cut = lake.cut([ORDERS, SHIPMENTS], kind)
                    seen = SeenCut(cut.ts, str(kind), keys(cut[ORDERS]), keys(cut[SHIPMENTS]))
                    report.check("every cut holds each shipment's order (cross-table)",
                                 seen.shipments <= seen.orders,
                                 f"{len(seen.shipments - seen.orders)} shipments without "
                                 f"their order at {kind} {cut.ts}")
                    if kind == "linearized":
                        report.check("linearized cuts never go backwards",
                                     len(seen.orders) >= last, f"{len(seen.orders)} after {last}")
                        last = len(seen.orders)
                    with lock:
                        cuts.append(seen)
                time.sleep(0.2)
        except Exception as exc:
            errors.append(f"reader: {exc.__class__.__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    read_thread = threading.Thread(target=reader)
    read_thread.start()
    progress(f"{writers} writers x {batches} batches x {rows} rows into {ORDERS}, then "
             f"{SHIPMENTS}; 1 reader taking cuts of both")
    for t in threads:
        t.start()
    while len(stamps) < total_batches and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    with lock:
        before_flip = max(stamps, default=0)
    result = asyncio.run(flip(url, to="legacy"))
    flipped.set()
    bootstrap = result.bootstrap["EpochMilliseconds"]
    progress(f"flipped distributed -> legacy: epoch {result.epoch}, bootstrap {bootstrap}; "
             "the catalog follows (it reopens its oracle on legacy)")
    report.check("the flip's bootstrap covers every commit before it", bootstrap >= before_flip,
                 f"{bootstrap} < {before_flip}")
    for t in threads:
        t.join()
    done.set()
    read_thread.join()
    report.check("no writer or reader failed", not errors, "; ".join(errors[:3]))
    report.check("appends begun after the flip commit above its bootstrap",
                 bool(after_flip) and all(s > bootstrap for s in after_flip),
                 f"{after_flip} vs {bootstrap}")
    state = asyncio.run(status(url))
    report.check("the catalog leads the legacy timeline after the flip",
                 state.deployment.implementation == "legacy"
                 and state.deployment.epoch == result.epoch
                 and all(t.leader_epoch >= 1 for t in state.timelines),
                 f"{state.as_dict()}")

    final = lake.cut([ORDERS, SHIPMENTS])
    expected = writers * batches * rows
    for table in (ORDERS, SHIPMENTS):
        df = final[table]
        total, distinct = df.count(), df.select("writer", "seq").distinct().count()
        report.check("no row lost", total == expected, f"{table}: {total} != {expected}")
        report.check("no row duplicated", distinct == total,
                     f"{table}: {distinct} distinct of {total}")
    report.check("one commit timestamp per append, never reused",
                 len(set(stamps)) == len(stamps) == 2 * total_batches,
                 f"{len(set(stamps))} distinct of {len(stamps)}")
    closed = lake.cut([ORDERS, SHIPMENTS], lake.closed_ts())
    cuts.append(SeenCut(closed.ts, "serializable", keys(closed[ORDERS]),
                        keys(closed[SHIPMENTS])))
    report.check("a serializable cut at closed_ts is complete after the writers",
                 len(cuts[-1].orders) == expected and cuts[-1].shipments == cuts[-1].orders,
                 f"{len(cuts[-1].orders)} orders, {len(cuts[-1].shipments)} shipments")
    cuts.append(SeenCut(final.ts, "linearized", keys(final[ORDERS]), keys(final[SHIPMENTS])))

    for seen in cuts:
        again = lake.cut([ORDERS, SHIPMENTS], seen.ts)
        report.check("every cut repeats at the end (same rows at the same timestamp)",
                     (keys(again[ORDERS]), keys(again[SHIPMENTS])) == (seen.orders,
                                                                       seen.shipments),
                     f"{seen.kind} cut at {seen.ts}")
    for seen in cuts:
        by_arrow = (_arrow_keys(second, ORDERS, seen.ts), _arrow_keys(second, SHIPMENTS, seen.ts))
        report.check("pyiceberg (a second engine) reads the same cuts as Spark",
                     by_arrow == (seen.orders, seen.shipments), f"at {seen.ts}")
    third = _duckdb(lake.catalog_uri, report)
    if third is not None:
        for seen in cuts:
            by_duck = (_duck_keys(third, ORDERS, seen.ts), _duck_keys(third, SHIPMENTS, seen.ts))
            report.check("DuckDB (a third engine) reads the same cuts as Spark",
                         by_duck == (seen.orders, seen.shipments), f"at {seen.ts}")
        third.close()

    elapsed = time.monotonic() - started
    linearized = sum(1 for c in cuts if c.kind == "linearized")
    print()
    print("tsoracle demo report")
    print(f"  rows written         {expected} per table ({writers} writers, {total_batches} "
          f"batches into {ORDERS} then {SHIPMENTS}: {len(stamps)} commits)")
    print(f"  rows read (final)    {len(cuts[-1].orders)} at timestamp {final.ts}")
    print(f"  reads                {linearized} linearized cuts, {len(cuts) - linearized} "
          f"serializable; all {len(cuts)} repeated, and read again by pyiceberg"
          f"{' and DuckDB' if third is not None else ''}")
    print(f"  timestamps           {min(stamps)} .. {max(stamps)}")
    print(f"  flip                 distributed -> legacy at epoch {result.epoch}, bootstrap "
          f"{bootstrap}; {len(after_flip)} commits after it")
    print("  invariants")
    for name, ok in report.checks.items():
        print(f"    [{'ok' if ok else 'FAIL'}] {name}")
    for note in report.notes[:10]:
        print(f"    {note}")
    print(f"  elapsed              {elapsed:.1f} s")
    return 0 if all(report.checks.values()) else 1


def _arrow_keys(catalog: Any, table: str, ts: int) -> Rows:
    """The table as of `ts`, read by pyiceberg into Arrow: no Spark involved."""
    loaded = catalog.load_table(table)
    snapshot = loaded.snapshot_as_of_timestamp(ts)
    if snapshot is None:
        return frozenset()
    arrow = loaded.scan(snapshot_id=snapshot.snapshot_id,
                        selected_fields=("writer", "seq")).to_arrow()
    return frozenset(zip(arrow.column("writer").to_pylist(), arrow.column("seq").to_pylist(),
                         strict=True))


if __name__ == "__main__":
    sys.exit(run_demo(keep=bool(os.environ.get("KEEP"))))


def _duckdb(catalog_uri: str, report: Report) -> DuckCatalog | None:
    """DuckDB on the catalog, or None (and a note) without the duckdb extra."""
    try:
        from tsoracle.duckdb import DuckCatalog

        return DuckCatalog(catalog_uri)
    except MissingExtra as exc:
        report.notes.append(f"DuckDB not read: {exc}")
        return None


def _duck_keys(duck: DuckCatalog, table: str, ts: int) -> Rows:
    """The table as of `ts`, read by DuckDB: no Spark, no pyiceberg."""
    rows = duck.sql(f"SELECT writer, seq FROM {duck.table(table, ts)}").fetchall()
    return frozenset((int(w), int(s)) for w, s in rows)
