"""The benches' plots drawn from their committed runs: tsoracle_dev.bench_plots from
docs/data/bench-read.json, bench/catalog_peers.py from docs/data/catalog-peers.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "tsoracle_dev.bench_plots"]
REPORT = ROOT / "docs" / "data" / "bench-read.json"
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)


def test_the_committed_report_has_what_the_plots_draw():
    report = json.loads(REPORT.read_text())
    reads = [r for r in report["results"] if r["mode"] == "read"]
    assert {r["batching"] for r in reads} == {True, False}
    assert len({r["concurrency"] for r in reads}) >= 3
    assert all(r["extra"]["asyncio_ceiling_ops_per_s"] > 0 for r in reads)
    assert report["bare_select"]["p50_ms"] > 0 and report["bare_select"]["ops_per_s"] > 0


def test_plots_of_the_committed_report(tmp_path):
    proc = run(str(REPORT), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    written = sorted(tmp_path.iterdir())
    assert [p.name for p in written] == ["bench-read-latency.png", "bench-read-throughput.png"]
    assert proc.stdout.split() == [str(p) for p in reversed(written)]
    for png in written:
        data = png.read_bytes()
        assert data.startswith(PNG) and len(data) > 20_000, png


def test_a_report_without_reads_is_refused(tmp_path):
    report = json.loads(REPORT.read_text())
    report["results"] = [r for r in report["results"] if r["mode"] != "read"]
    path = tmp_path / "writes.json"
    path.write_text(json.dumps(report))
    proc = run(str(path), "--out", str(tmp_path))
    assert proc.returncode != 0
    assert "no read results" in proc.stderr
    assert not list(tmp_path.glob("*.png"))


def test_the_peers_plot_draws_the_committed_peers_report(tmp_path):
    """bench/catalog_peers.py --from-json redraws docs/data/catalog-peers.json (the figure in
    docs/performance.md) without measuring."""
    report = ROOT / "docs" / "data" / "catalog-peers.json"
    out = tmp_path / "peers.png"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "catalog_peers.py"),
                           "--from-json", str(report), "--plot", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(report.read_text())["cells"]
    assert set(cells) >= {"sequential", "one-table", "distinct", "append-1", "append-8"}
    assert all(f"| {cell} |" in proc.stdout for cell in cells)  # the table, printed
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000
