"""Render each dashboard panel's PromQL, queried from a live Prometheus, as PNG plots
(matplotlib), so docs/observability.md shows what an operator sees."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from panels import OPERATOR_PANELS, ORACLE_PANELS  # noqa: E402


def query_range(port: int, expr: str, seconds: int) -> list[dict]:
    end = time.time()
    params = {"query": expr, "start": end - seconds, "end": end, "step": "1"}
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=20) as resp:
        return json.loads(resp.read())["data"]["result"]


def render(port: int, title: str, panels: list[tuple[str, str, str]], out: Path,
           seconds: int = 120) -> None:
    cols = 2
    rows = (len(panels) + 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), squeeze=False)
    for ax, (name, expr, unit) in zip(axes.flat, panels, strict=False):
        for series in query_range(port, expr, seconds)[:8]:
            xs = [float(t) - time.time() for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            label = ",".join(f"{v}" for k, v in sorted(series["metric"].items())) or "value"
            ax.plot(xs, ys, label=label[:40])
        ax.set_title(f"{name} ({unit})", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds ago", fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def render_all(port: int, folder: Path) -> None:
    render(port, "tsoracle: oracle", ORACLE_PANELS, folder / "dashboard-oracle.png")
    render(port, "tsoracle: operator", OPERATOR_PANELS, folder / "dashboard-operator.png")
