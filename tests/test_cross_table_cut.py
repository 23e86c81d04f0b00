"""bench/cross_table_cut.py, small: with T from the catalog's read_ts, every cut across two
tables is consistent and repeatable; Iceberg's reference catalog, with T from the clock, is
measured in the same way (how many of its reads changed is reported, not asserted: it depends
on timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Starts tsoracle's own processes or HTTP servers: the full suite's, not `make test-fast`'s.
pytestmark = pytest.mark.served

BENCH = Path(__file__).resolve().parents[1] / "bench" / "cross_table_cut.py"


def _run(tmp_path: Path, only: str) -> dict[str, object]:
    out = tmp_path / "outcome.json"
    done = subprocess.run([sys.executable, str(BENCH), "--only", only, "--writers", "2",
                           "--ids", "8", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    [outcome] = json.loads(out.read_text())
    return dict(outcome)


def test_read_ts_cuts_are_consistent_and_repeatable(tmp_path):
    outcome = _run(tmp_path, "tsoracle")
    assert outcome["commits"] == 32 and int(outcome["reads"]) > 0
    assert (outcome["inconsistent"], outcome["changed"]) == (0, 0), outcome["examples"]


@pytest.mark.slow  # a JVM
def test_the_reference_catalog_is_measured_with_clock_timestamps(tmp_path):
    outcome = _run(tmp_path, "reference")
    assert outcome["commits"] == 32 and int(outcome["reads"]) > 0
