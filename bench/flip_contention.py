"""Flip latency under concurrent writers, at READ COMMITTED and at SERIALIZABLE.

W writer tasks call the distributed oracle's write_ts in a loop (no group commit, so W statements
are in flight on the timestamp row at once). Each timed flip goes from distributed to legacy
under that load, from the call to its commit; retries are the flip transaction's own
(serialization failures, deadlocks). Between timed flips the bench flips back, untimed, and the
fenced writers reopen.

    python bench/flip_contention.py --writers 0 --writers 16 --writers 64 --flips 5

Starts its own PostgreSQL (tsoracle_dev.localpg); SERIALIZABLE runs use a database whose
default_transaction_isolation is serializable, as on CockroachDB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import tsoracle
from tsoracle.oracle.flip import flip_backend
from tsoracle.store import RetryPolicy, open_backend, parse_url
from tsoracle_dev.localpg import LocalPostgres

TIMELINE = "counter:bench"


async def _open(url: str, stop: asyncio.Event) -> tsoracle.TimestampOracle | None:
    """The distributed oracle, once it is active again (None if the run ended first)."""
    while not stop.is_set():
        try:
            return await tsoracle.open_oracle(url, timeline=TIMELINE, implementation="distributed",
                                              batching=False, pool_size=3)
        except tsoracle.Fenced:
            await asyncio.sleep(0.02)  # legacy is active: it serves one leader, not W writers
    return None


async def writer(url: str, stop: asyncio.Event, counts: list[int], errors: list[str]) -> None:
    oracle = await _open(url, stop)
    while oracle is not None and not stop.is_set():
        try:
            await oracle.write_ts()
            counts[0] += 1
        except tsoracle.Fenced:
            await oracle.close()
            oracle = await _open(url, stop)
        except tsoracle.OracleError as exc:
            errors.append(str(exc))
            await asyncio.sleep(0.01)
    if oracle is not None:
        await oracle.close()


async def one(url: str, writers: int, flips: int, budget_s: float) -> dict[str, object]:
    await tsoracle.init(url, timelines=[TIMELINE])
    stop = asyncio.Event()
    counts, errors = [0], []
    tasks = [asyncio.create_task(writer(url, stop, counts, errors)) for _ in range(writers)]
    retries: list[str] = []
    backend = open_backend(parse_url(url), retry=RetryPolicy(timeout=budget_s),
                           on_retry=retries.append)
    await backend.open()
    latencies: list[float] = []
    failed: list[str] = []
    try:
        for _ in range(flips):
            # Timed: distributed -> legacy while W writers hammer the distributed row.
            try:
                await flip_backend(backend, "distributed")
            except tsoracle.OracleError as exc:
                failed.append(f"untimed flip back: {exc}")
            mark, deadline = counts[0], time.monotonic() + 10
            while counts[0] - mark < 4 * writers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # until the writers have reopened and are hot
            before = counts[0]
            start = time.perf_counter()
            try:
                await flip_backend(backend, "legacy")
                latencies.append(time.perf_counter() - start)
            except tsoracle.OracleError as exc:
                failed.append(str(exc))
            if writers and counts[0] == before:
                failed.append("no write completed before the flip")
    finally:
        stop.set()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
        await backend.close()
    return {
        "writers": writers, "flips": flips, "completed": len(latencies),
        "p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "max_s": round(max(latencies), 4) if latencies else None,
        "flip_retries": len(retries), "failed": failed[:2], "writer_errors": len(errors),
        "writes": counts[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--writers", type=int, action="append",
                   help="concurrent writers (repeatable; default 0, 16, 64)")
    p.add_argument("--flips", type=int, default=5, help="flips timed per setting")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds a flip may retry before it gives up")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    counts = a.writers or [0, 16, 64]
    results = []
    with tempfile.TemporaryDirectory(prefix="tsoracle-flipbench-") as tmp:
        pg = LocalPostgres(Path(tmp) / "pg")
        pg.start()
        pg.sql("ALTER SYSTEM SET max_connections = 400", "postgres")
        try:
            for isolation, base in (("read committed", pg.url()),
                                    ("serializable", pg.serializable_url())):
                for w in counts:
                    url = f"{base}?schema=flip_{uuid.uuid4().hex[:8]}"
                    r = asyncio.run(one(url, w, a.flips, a.budget))
                    r["isolation"] = isolation
                    results.append(r)
                    print(f"{isolation:<15} writers {w:>3}: flips {r['completed']}/{a.flips}"
                          f"  p50 {r['p50_s']} s  max {r['max_s']} s  flip retries "
                          f"{r['flip_retries']}  writes {r['writes']} writer errors "
                          f"{r['writer_errors']}  {r['failed'] or ''}",
                          flush=True)
        finally:
            pg.destroy()
    by = {(r["isolation"], r["writers"]): r for r in results}
    for w in counts:
        rc, ser = by[("read committed", w)], by[("serializable", w)]
        if rc["p50_s"] and ser["p50_s"]:
            print(f"writers {w:>3}: serializable / read committed p50 = "
                  f"{ser['p50_s'] / rc['p50_s']:.1f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["completed"] == a.flips for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
