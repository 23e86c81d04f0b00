"""The chart's alert rules as code: `promtool test rules` (tests/alerts/alerts.test.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "charts" / "tsoracle" / "files" / "alerts.rules.yaml"
TESTS = ROOT / "tests" / "alerts" / "alerts.test.yaml"


def _alerts(rules: dict) -> list[dict]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def promtool_test(rules_file: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the unit tests against `rules_file` (a copy of the tests that points at it)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/run does)"
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(rules_file)]
    copy = tmp_path / "alerts.test.yaml"
    copy.write_text(yaml.safe_dump(tests))
    return subprocess.run([promtool, "test", "rules", str(copy)], capture_output=True, text=True)


def test_every_alert_passes_its_unit_tests(tmp_path):
    proc = promtool_test(RULES, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_quiet():
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for alert in _alerts(yaml.safe_load(RULES.read_text())):
        name = alert["alert"]
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), name
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), name


@pytest.mark.parametrize("name", [a["alert"] for a in _alerts(yaml.safe_load(RULES.read_text()))])
def test_the_for_duration_of_each_alert_is_pinned(name, tmp_path):
    # A rule whose `for` changed (0m <-> 5m) must fail its tests: they check the timing.
    rules = yaml.safe_load(RULES.read_text())
    for alert in _alerts(rules):
        if alert["alert"] == name:
            alert["for"] = "5m" if alert.get("for", "0m") in ("0m", "0s") else "0m"
    mutated = tmp_path / "mutated.rules.yaml"
    mutated.write_text(yaml.safe_dump(rules))
    proc = promtool_test(mutated, tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert name in proc.stdout + proc.stderr
