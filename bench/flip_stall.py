"""The longest write stall a flip causes, with 512 writers (issue 26's failover figures).

W writer tasks share one process's oracle (a `ReopeningOracle`, as a service would: group
commit, one legacy leader) and call write_ts in a loop. The bench flips distributed -> legacy ->
distributed, F times each way, through the same path as `tsoracle flip`. For each flip, the
stall is the longest time any writer waited between two writes it completed, around the flip;
the same measure over a window of the same length without a flip is the baseline (the ratio is
what to compare across machines).

    python bench/flip_stall.py --writers 512 --flips 3

Starts its own PostgreSQL (tsoracle_dev.localpg). Goal: a flip stall of at most 2 s.
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
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle_dev.localpg import LocalPostgres

TIMELINE = "counter:bench"
WINDOW_S = 3.0  # looked at around each flip, and without one for the baseline


async def writer(oracle: ReopeningOracle, done: list[float], stop: asyncio.Event,
                 errors: list[str]) -> None:
    while not stop.is_set():
        try:
            await oracle.write_ts()
            done.append(time.monotonic())
        except tsoracle.OracleError as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            await asyncio.sleep(0.01)


def longest_wait(per_writer: list[list[float]], start: float, end: float) -> float:
    """The longest gap between two completions of one writer that overlaps [start, end]."""
    worst = 0.0
    for times in per_writer:
        prev = None
        for t in times:
            if prev is not None and t >= start and prev <= end:
                worst = max(worst, t - prev)
            prev = t
    return worst


async def run(url: str, writers: int, flips: int) -> dict[str, object]:
    await tsoracle.init(url, timelines=[TIMELINE])
    opens: list[float] = []

    async def open_active() -> tsoracle.TimestampOracle:
        began = time.monotonic()
        try:
            return await tsoracle.open_oracle(url, timeline=TIMELINE, implementation=None)
        finally:
            opens.append(time.monotonic() - began)

    oracle = ReopeningOracle(open_active, name=TIMELINE)
    stop = asyncio.Event()
    per_writer: list[list[float]] = [[] for _ in range(writers)]
    errors: list[str] = []
    tasks = [asyncio.create_task(writer(oracle, per_writer[i], stop, errors))
             for i in range(writers)]
    stalls: dict[str, list[float]] = {"legacy": [], "distributed": []}
    baselines: list[float] = []
    try:
        await asyncio.sleep(WINDOW_S)  # warm: every writer has written
        for _ in range(flips):
            for to in ("legacy", "distributed"):
                quiet = time.monotonic()
                await asyncio.sleep(WINDOW_S)
                baselines.append(longest_wait(per_writer, quiet, quiet + WINDOW_S))
                began = time.monotonic()
                await tsoracle.flip(url, to=to)
                await asyncio.sleep(WINDOW_S)  # the writers reopen and catch up
                stalls[to].append(longest_wait(per_writer, began, began + WINDOW_S))
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await oracle.close()
    worst = max(stalls["legacy"] + stalls["distributed"])
    base = statistics.median(baselines)
    return {"writers": writers, "flips_each_way": flips,
            "stall_to_legacy_max_s": round(max(stalls["legacy"]), 3),
            "stall_to_distributed_max_s": round(max(stalls["distributed"]), 3),
            "stalls_s": {k: [round(x, 3) for x in v] for k, v in stalls.items()},
            "opens_s": [round(x, 3) for x in opens],
            "baseline_longest_wait_p50_s": round(base, 3),
            "stall_over_baseline": round(worst / base, 1) if base else None,
            "writes": sum(len(t) for t in per_writer), "writer_errors": len(errors),
            "error_kinds": {k: errors.count(k) for k in sorted(set(errors))},
            "goal_met": worst <= 2.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, default=512)
    p.add_argument("--flips", type=int, default=3, help="flips each way")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsoracle-stallbench-") as tmp:
        pg = LocalPostgres(Path(tmp) / "pg")
        pg.start()
        try:
            result = asyncio.run(run(f"{pg.url()}?schema=s_{uuid.uuid4().hex[:8]}",
                                     a.writers, a.flips))
        finally:
            pg.destroy()
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
