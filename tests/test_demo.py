"""The README's first command ends in `tsoracle demo`: run it as a user does (smaller). It
serves tsoracle's Iceberg catalog in-process and runs local Spark with Iceberg in its own
process (this one's Spark, if any, is the suite's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.spark
def test_the_demo_runs_and_checks_its_invariants(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TSORACLE_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "tsoracle.cli", "demo", "--writers", "2", "--batches", "3",
         "--rows", "10", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "rows written         60 " in out and "rows read (final)    60 " in out
    assert "flipped distributed -> legacy" in out
    assert "catalog: http://127.0.0.1:" in out
    checks = [line for line in out.splitlines() if line.startswith("    [")]  # the invariants
    assert len(checks) >= 10 and all(c.strip().startswith("[ok]") for c in checks), checks
    named = " ".join(checks)
    assert "cross-table" in named and "second engine" in named and "repeats" in named
    assert "DuckDB (a third engine)" in named  # tsoracle[test] installs tsoracle[duckdb]
    assert "read again by pyiceberg and DuckDB" in out
