"""Linearizability under faults: real multi-process histories checked by Porcupine (Go)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import runner
from broken import VARIANTS

CORPUS = Path(runner.HERE) / "corpus"
DURATION = 8.0
MIN_OPS = 3000  # "a few thousand" per scenario; a run with less traffic fails


@pytest.mark.parametrize("variant", VARIANTS)
def test_checker_flags_the_regression_corpus(variant, tmp_path):
    html = tmp_path / "violation.html"
    files = sorted((CORPUS / variant).glob("*.jsonl.gz"))
    assert files
    proc = subprocess.run([str(runner.checker_binary()), "-html", str(html),
                           *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a violation, not a timeout
    assert '"verdict":"violation"' in proc.stdout
    assert html.stat().st_size > 1000  # porcupine's visualization was written


@pytest.mark.parametrize("variant", VARIANTS)
def test_broken_oracles_are_caught_live(variant, tmp_path):
    impl = "distributed" if variant == "read-past-unapplied" else "legacy"
    summary = runner.run("none", impl, duration=3, out=tmp_path, broken=variant,
                         clients=2, min_ops=0)
    assert summary["porcupine"] == "violation", summary
    assert (tmp_path / "violation.html").exists()


@pytest.mark.parametrize("implementation", ["distributed", "legacy"])
@pytest.mark.parametrize("scenario", runner.SCENARIOS)
def test_scenario_is_linearizable(scenario, implementation, tmp_path):
    summary = runner.run(scenario, implementation, duration=DURATION, out=tmp_path,
                         min_ops=MIN_OPS)
    runner.print_summary(summary)
    assert summary["porcupine"] == "linearizable", summary
    assert summary["invariant_violations"] == [], summary
    assert summary["ops_checked"] >= MIN_OPS, summary
    if scenario != "none":
        assert summary["faults"], "the nemesis injected nothing"
    assert summary["verdict"] == "pass"
