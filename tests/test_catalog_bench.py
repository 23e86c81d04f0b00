"""bench/catalog_commits.py with tiny settings: the report has every cell, both catalogs
commit, and nothing in its output shows the database's password (no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tsoracle_dev.localpg import PASSWORD

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, str(ROOT / "bench" / "catalog_commits.py")]
PNG = b"\x89PNG\r\n\x1a\n"


def test_both_catalogs_commit_in_every_cell(pg, tmp_path):
    report_path, plot_path = tmp_path / "report.json", tmp_path / "plot.png"
    done = subprocess.run(
        [*BENCH, "--url", pg.url(), "--committers", "1,2", "--duration", "0.5",
         "--warmup", "0.2", "--json", str(report_path), "--plot", str(plot_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())

    cells = {(r["kind"], r["layout"], r["committers"], r["catalog"]) for r in report["rows"]}
    expected = {(kind, layout, n, catalog) for kind in ("property", "append")
                for layout, n in (("one", 1), ("one", 2), ("distinct", 2))
                for catalog in ("tsoracle", "jdbc")}
    assert cells == expected and len(report["rows"]) == len(expected)
    for r in report["rows"]:
        assert r["commits"] > 0 and r["commits_per_s"] > 0, r
        assert r["errors"] == 0, r["error_sample"]
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["cpu_ms_per_commit"]["bench"] is not None
        assert ("server_retries" in r) == (r["catalog"] == "tsoracle")

    ratios = {q["kind"]: q for q in report["ratios"]}
    assert set(ratios) == {"property", "append"}
    for q in ratios.values():
        assert (q["least"], q["most"], q["layout"]) == (1, 2, "distinct")
        assert q["latency_p50"] > 0 and q["commits_per_s"] > 0
        assert isinstance(q["latency_goal_met"], bool)
        assert isinstance(q["throughput_goal_met"], bool)

    table = done.stdout
    assert table.startswith("| commit | tables | committers | catalog | commits/s |")
    assert table.count("\n| property |") + table.count("\n| append |") == len(expected)
    assert "tsoracle ÷ JDBC latency at 1 committer(s)" in table
    assert plot_path.read_bytes().startswith(PNG)
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.served  # the CLI in a process of its own
def test_a_url_with_a_query_is_refused():
    done = subprocess.run([*BENCH, "--url", "postgresql://u@h/db?schema=prod"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--url must have no query" in done.stderr
