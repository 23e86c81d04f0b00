"""Plots of a `tsoracle bench --json` run: read throughput and latency against concurrency,
batched and raw, with the run's physical-limit probes as reference lines (the pure-asyncio
ceiling measured at each concurrency, and the bare SELECT round trip).

    tsoracle-bench-plots docs/data/bench-read.json --out docs/img
    # writes docs/img/bench-read-throughput.png and docs/img/bench-read-latency.png

Only read results are drawn (mode "read"); each implementation in the file gets its own pair
of lines (batched solid, raw dashed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

matplotlib.use("Agg")  # files only, never a window (pyplot picks its backend at first use)

COLORS = {"distributed": "tab:blue", "legacy": "tab:orange"}


def read_series(report: dict[str, Any]) -> dict[tuple[str, bool], list[dict[str, Any]]]:
    """(implementation, batching) -> read results sorted by concurrency."""
    series: dict[tuple[str, bool], list[dict[str, Any]]] = defaultdict(list)
    for r in report["results"]:
        if r["mode"] == "read":
            series[(r["implementation"], bool(r["batching"]))].append(r)
    if not series:
        raise SystemExit("no read results in the report: run `tsoracle bench --mode read --json`")
    for rows in series.values():
        rows.sort(key=lambda r: r["concurrency"])
    return dict(sorted(series.items(), key=lambda kv: (kv[0][0], not kv[0][1])))


def _label(impl: str, batching: bool) -> str:
    return f"{impl} {'batched' if batching else 'raw'}"


def _style(ax: plt.Axes, concurrencies: list[int], ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xticks(concurrencies)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("concurrent callers")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")


def throughput(report: dict[str, Any], out: Path) -> None:
    series = read_series(report)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    concurrencies = sorted({r["concurrency"] for rows in series.values() for r in rows})
    ceiling: dict[int, float] = {}
    for (impl, batching), rows in series.items():
        xs = [r["concurrency"] for r in rows]
        ax.plot(xs, [r["ops_per_s"] for r in rows], marker="o", color=COLORS.get(impl),
                linestyle="-" if batching else "--", label=_label(impl, batching) + " read_ts")
        for r in rows:
            value = r.get("extra", {}).get("asyncio_ceiling_ops_per_s")
            if value:
                ceiling[r["concurrency"]] = max(value, ceiling.get(r["concurrency"], 0.0))
    if ceiling:
        xs = sorted(ceiling)
        ax.plot(xs, [ceiling[c] for c in xs], color="0.3", linestyle=":", marker="^",
                label="asyncio ceiling (no I/O)")
    bare = report.get("bare_select", {}).get("ops_per_s")
    if bare:
        ax.axhline(bare, color="tab:red", linestyle="-.", linewidth=1,
                   label=f"bare SELECT, one connection ({bare:,.0f}/s)")
    ax.set_title("read_ts throughput against concurrency")
    _style(ax, concurrencies, "operations per second")
    _save(fig, out)


def latency(report: dict[str, Any], out: Path) -> None:
    series = read_series(report)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    concurrencies = sorted({r["concurrency"] for rows in series.values() for r in rows})
    for (impl, batching), rows in series.items():
        xs = [r["concurrency"] for r in rows]
        style = "-" if batching else "--"
        ax.plot(xs, [r["p50_ms"] for r in rows], marker="o", color=COLORS.get(impl),
                linestyle=style, label=f"{_label(impl, batching)} p50")
        ax.plot(xs, [r["p99_ms"] for r in rows], marker="s", color=COLORS.get(impl),
                linestyle=style, alpha=0.45, label=f"{_label(impl, batching)} p99")
    bare = report.get("bare_select", {}).get("p50_ms")
    if bare:
        ax.axhline(bare, color="tab:red", linestyle="-.", linewidth=1,
                   label=f"bare SELECT round trip p50 ({bare:.3f} ms)")
    ax.set_title("read_ts latency against concurrency")
    _style(ax, concurrencies, "milliseconds")
    _save(fig, out)


def _save(fig: plt.Figure, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tsoracle-bench-plots",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the JSON that `tsoracle bench --json` printed")
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="folder for the PNGs")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    stem = args.report.stem
    for name, draw in (("throughput", throughput), ("latency", latency)):
        path = args.out / f"{stem}-{name}.png"
        draw(report, path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
