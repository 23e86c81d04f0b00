"""Render each dashboard panel's PromQL, queried from a live Prometheus, as PNG plots
(matplotlib), so docs/observability.md shows what an operator sees.

Each panel is drawn as Grafana would: the same query, legends from the same legendFormat, and
the unit as a person reads it (seconds become milliseconds, "ops" becomes "per second").
Events of the scenario (a flip, a fault) are drawn as annotations across every panel.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from tsoracle_dev.dashboards.panels import OPERATOR_PANELS, ORACLE_PANELS, P

matplotlib.use("Agg")  # files only, never a window (pyplot picks its backend at first use)

# Grafana unit id -> (axis label, factor applied to the values). Durations spanning more than
# LOG_SPAN are drawn on a log scale: one slow call during a fault would flatten every other line.
UNITS = {"ops": ("per second", 1.0), "s": ("ms", 1000.0), "ms": ("ms", 1.0), "short": ("", 1.0)}
LOG_SPAN = 30


def query_range(port: int, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = {"query": expr, "start": start, "end": end, "step": step}
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())["data"]["result"]


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{name}} becomes the label's value."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return text or ",".join(labels.values()) or "value"


def render(port: int, title: str, panels: list[P], out: Path, start: float, end: float,
           events: list[tuple[float, str]] = (), note: str = "") -> list[str]:
    """Draw `panels` over [start, end] (Unix seconds) into `out`; returns the titles of panels
    that had no finite value in the window."""
    step = max(1.0, round((end - start) / 300))
    cols = 2
    rows = (len(panels) + 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 2.9 * rows), squeeze=False)
    empty = []
    for ax, panel in zip(axes.flat, panels, strict=False):
        axis_label, factor = UNITS.get(panel.unit, (panel.unit, 1.0))
        finite, low, high, least = False, 0.0, 0.0, math.inf
        series = query_range(port, panel.expr, start, end, step)
        for s in sorted(series, key=lambda s: legend(panel.legend, s["metric"])):
            xs = [(float(t) - start) / 60 for t, _ in s["values"]]
            ys = [float(v) * factor for _, v in s["values"]]
            finite = finite or any(math.isfinite(y) for y in ys)
            low = min([low, *(y for y in ys if math.isfinite(y))])
            high = max([high, *(y for y in ys if math.isfinite(y))])
            least = min([least, *(y for y in ys if math.isfinite(y) and y > 0)])
            ax.plot(xs, ys, label=legend(panel.legend, s["metric"]), linewidth=1.3,
                    linestyle="--" if "legacy" in s["metric"].values() else "-")
        if not finite:
            empty.append(panel.title)
        for at, text in events:
            x = (at - start) / 60
            ax.axvline(x, color="0.55", linestyle=":", linewidth=1)
            ax.annotate(text, (x, 1), xycoords=("data", "axes fraction"), xytext=(2, -3),
                        textcoords="offset points", fontsize=7, color="0.35", va="top",
                        ha="left", rotation=90)
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_ylabel(panel.axis or axis_label, fontsize=8)
        ax.set_xlim(0, (end - start) / 60)
        if panel.unit == "s" and high > LOG_SPAN * least:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            ax.set_ylabel(f"{panel.axis or axis_label} (log scale)", fontsize=8)
        else:
            ax.set_ylim(bottom=low)
        ax.tick_params(labelsize=8)
        ax.set_xlabel("minutes", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title}  {note}".strip(), fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return empty


def render_all(port: int, folder: Path, start: float, end: float,
               events: list[tuple[float, str]] = ()) -> list[str]:
    """Both dashboards; returns the titles of panels without data. The operator's pictures show
    only the flips among `events` (it has nothing to do with the workload's backend)."""
    flips = [e for e in events if "flip" in e[1]]
    return (render(port, "tsoracle: oracle", ORACLE_PANELS, folder / "dashboard-oracle.png",
                   start, end, events, "(legacy dashed, distributed solid)")
            + render(port, "tsoracle: operator", OPERATOR_PANELS,
                     folder / "dashboard-operator.png", start, end, flips))
