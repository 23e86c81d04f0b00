"""Batched read_ts against a distant backend: one batch in flight (k = 1) against a pipeline.

For each added round trip (a relay, tsoracle/latency.py) and concurrency, measures the
distributed oracle's batched read_ts with pipeline depth 1 and k, and reports latency in units
of the round trip measured through the relay in the same run (a bare single-row SELECT).

    python bench/pipelined_reads.py --rtt-ms 0,1,5 --concurrency 1,64,512 --depth 1,8 \
        --json docs/data/pipelined-reads.json --plot docs/img/pipelined-reads.png

Starts its own PostgreSQL (tsoracle_dev.localpg). The event loop is uvloop when it is installed;
`--event-loop asyncio` measures asyncio's own (tsoracle/eventloop.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from tsoracle import eventloop
from tsoracle.bench import (
    TIMELINE,
    bench_url,
    probe_asyncio_ceiling,
    probe_bare_select,
    run_one,
)
from tsoracle.latency import relayed
from tsoracle.oracle import init
from tsoracle_dev.localpg import LocalPostgres


def _csv(kind: type) -> Any:
    return lambda text: [kind(x) for x in text.split(",") if x]


async def measure(url: str, rtts: list[float], concurrencies: list[int], depths: list[int],
                  seconds: float) -> dict[str, Any]:
    url = bench_url(url)
    await init(url, timelines=[TIMELINE])
    rows = []
    ceilings = {c: await probe_asyncio_ceiling(c, 1.0) for c in concurrencies}
    for rtt in rtts:
        with relayed(url, rtt) if rtt else nullcontext(url) as target:
            bare = await probe_bare_select(target, 1.0)
            for c in concurrencies:
                for k in depths:
                    r = await run_one(target, mode="read", implementation="distributed",
                                      batching=True, concurrency=c, seconds=seconds,
                                      pipeline_depth=k)
                    rows.append({
                        "added_rtt_ms": rtt, "measured_rtt_ms": bare["p50_ms"],
                        "concurrency": c, "depth": k, "ops_per_s": r.ops_per_s,
                        "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                        "p50_rtt": r.p50_ms / bare["p50_ms"],
                        "p99_rtt": r.p99_ms / bare["p50_ms"],
                        "queries_per_s": r.queries_per_s,
                        "queries_per_s_bound": k / (bare["p50_ms"] / 1000),
                        "callers_per_batch": r.mean_batch,
                    })
                    print(_line(rows[-1]), file=sys.stderr, flush=True)
    return {"event_loop": eventloop.chosen(), "seconds": seconds,
            "asyncio_ceiling_ops_per_s": ceilings, "rows": rows}


def _line(r: dict[str, Any]) -> str:
    return (f"rtt +{r['added_rtt_ms']:g} ms (measured {r['measured_rtt_ms']:.2f}) "
            f"c={r['concurrency']} k={r['depth']}: {r['ops_per_s']:,.0f} ops/s, "
            f"p50 {r['p50_rtt']:.2f} RTT, p99 {r['p99_rtt']:.2f} RTT, "
            f"{r['queries_per_s']:,.0f} queries/s")


def markdown(report: dict[str, Any]) -> str:
    out = ["| added RTT | measured RTT | clients | k | ops/s | p50 (RTT) | p99 (RTT) | "
           "queries/s | bound k/RTT |", "|" + " --- |" * 9]
    for r in report["rows"]:
        out.append(f"| {r['added_rtt_ms']:g} ms | {r['measured_rtt_ms']:.2f} ms | "
                   f"{r['concurrency']} | {r['depth']} | {r['ops_per_s']:,.0f} | "
                   f"{r['p50_rtt']:.2f} | {r['p99_rtt']:.2f} | {r['queries_per_s']:,.0f} | "
                   f"{r['queries_per_s_bound']:,.0f} |")
    return "\n".join(out)


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    rtts = sorted({r["added_rtt_ms"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    fig, axes = plt.subplots(2, len(rtts), figsize=(4.2 * len(rtts), 6.5), squeeze=False)
    for col, rtt in enumerate(rtts):
        for k in depths:
            sel = sorted((r for r in rows if r["added_rtt_ms"] == rtt and r["depth"] == k),
                         key=lambda r: r["concurrency"])
            cs = [r["concurrency"] for r in sel]
            label = "k = 1 (one batch in flight)" if k == 1 else f"k = {k} (pipelined)"
            axes[0][col].plot(cs, [r["ops_per_s"] for r in sel], marker="o", label=label)
            axes[1][col].plot(cs, [r["p50_rtt"] for r in sel], marker="o", label=f"{label}, p50")
        measured = next(r["measured_rtt_ms"] for r in rows if r["added_rtt_ms"] == rtt)
        axes[0][col].set_title(f"+{rtt:g} ms (measured round trip {measured:.2f} ms)")
        axes[1][col].axhline(1.0, color="grey", linestyle="--", label="one round trip")
        for row, ylabel in ((0, "read_ts ops/s"), (1, "p50 latency (round trips)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[1][col].legend(fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Batched read_ts, distributed oracle on PostgreSQL through a delay relay "
                 f"({report['event_loop']} event loop)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt-ms", type=_csv(float), default=[0.0, 1.0, 5.0])
    p.add_argument("--concurrency", type=_csv(int), default=[1, 64, 512])
    p.add_argument("--depth", type=_csv(int), default=[1, 8])
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--event-loop", choices=["auto", "asyncio"], default="auto")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--plot", help="write a PNG here (needs matplotlib)")
    args = p.parse_args()
    os.environ[eventloop.ENV] = args.event_loop
    with tempfile.TemporaryDirectory(prefix="pipelined-reads-") as tmp:
        pg = LocalPostgres(Path(tmp) / "pg")
        try:
            url = pg.start()
            report = eventloop.run(measure(url, args.rtt_ms, args.concurrency, args.depth,
                                           args.duration))
        finally:
            pg.destroy()
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
