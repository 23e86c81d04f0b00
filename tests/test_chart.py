"""The chart as the ecosystem expects it (issue 28, item 4), rendered by the real helm binary.

Before: ConfigMaps named tsoracle-tsoracle-operator (the release name doubled);
prometheusRule.enabled=true failed with Helm's generic `no matches for kind "PrometheusRule"`;
alerts carried a repository path (`runbook: docs/runbooks/….md`), not a `runbook_url` a pager
opens, and no description; every install printed a `found symbolic link` INFO line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tsoracle_dev.kubetools import tools_dir

CHART = Path(__file__).resolve().parent.parent / "charts" / "tsoracle"
PROMETHEUS_RULE = "monitoring.coreos.com/v1/PrometheusRule"


def helm_template(release: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_dir() / "helm"), "template", release, str(CHART), *args],
                          capture_output=True, text=True)


def rendered(release: str, *args: str) -> list[dict]:
    proc = helm_template(release, *args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_names_carry_the_release_once():
    for release, prefix in (("tsoracle", "tsoracle"), ("prod", "prod-tsoracle")):
        docs = rendered(release, "--set", "dashboards.enabled=true")
        maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
        assert maps == {f"{prefix}-{board}" for board in ("oracle", "operator", "catalog")}


def test_a_prometheus_rule_without_its_crd_says_what_to_install():
    proc = helm_template("tsoracle", "--set", "prometheusRule.enabled=true")
    assert proc.returncode != 0
    assert "needs the Prometheus operator's CRDs" in proc.stderr
    assert "prometheusRule.enabled=false" in proc.stderr and "no matches for kind" not in \
        proc.stderr


def test_alerts_carry_a_runbook_url_a_summary_and_a_description():
    base = "https://wiki.example.internal/tsoracle/runbooks"
    for args, want in (((), "https://github.com/tsoracle/tsoracle/blob/main/docs/runbooks/"),
                       (("--set", f"prometheusRule.runbookBaseURL={base}/"), f"{base}/")):
        [rule] = [d for d in rendered("tsoracle", "--set", "prometheusRule.enabled=true",
                                      "--api-versions", PROMETHEUS_RULE, *args)
                  if d["kind"] == "PrometheusRule"]
        alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
        assert alerts
        for alert in alerts:
            notes = alert["annotations"]
            assert set(notes) == {"summary", "description", "runbook_url"}, alert["alert"]
            assert notes["runbook_url"].startswith(want) and notes["runbook_url"].endswith(".md")
            runbook = notes["runbook_url"].removeprefix(want)
            assert (CHART.parent.parent / "docs" / "runbooks" / runbook).exists(), runbook


def test_rendering_prints_nothing_but_the_manifests():
    proc = helm_template("tsoracle")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
