"""Build the Grafana dashboards (grafanalib) and the alert rules from panels.py.

    tsoracle-dashboards          # write charts/tsoracle/{dashboards,files}
    tsoracle-dashboards --check  # fail if the committed files are stale
    (or: python -m tsoracle_dev.dashboards.build ...)

grafanalib, because the dashboards are then plain Python next to the PromQL list the tests
check. grafanalib still writes fields of Grafana's pre-7 JSON and nulls that Grafana's current
dashboard schema does not have; `grafana_v1` drops them, and every dashboard must then pass
`grafana_model.problems` (Grafana's own dashboard model, from its foundation SDK) or nothing is
written and `--check` fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, GridPos, Target, Templating, TimeSeries

from tsoracle_dev import CHECKOUT
from tsoracle_dev.dashboards.grafana_model import SCHEMA_VERSION, problems
from tsoracle_dev.dashboards.panels import (
    ALERTS,
    CATALOG_PANELS,
    OPERATOR_PANELS,
    ORACLE_PANELS,
    P,
)

CHART = CHECKOUT / "charts" / "tsoracle"
RUNBOOKS = "docs/runbooks"
# Where a pager opens an alert's runbook: the project's docs/runbooks, as published. The chart
# replaces this prefix with prometheusRule.runbookBaseURL (a mirror, an internal wiki).
RUNBOOK_BASE_URL = "https://github.com/tsoracle/tsoracle/blob/main/docs/runbooks"


DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Written by grafanalib, absent from Grafana's dashboard schema (pre-7 layout and query fields).
LEGACY = {
    "dashboard": {"__inputs", "hideControls", "rows", "sharedCrosshair", "style"},
    "panel": {"editable", "error", "height", "minSpan", "span"},
    "target": {"metric", "query", "step", "target"},
    "timepicker": {"time_options"},
}


def _no_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def grafana_v1(data: dict) -> dict:
    """grafanalib's JSON as Grafana's dashboard schema (v1) has it."""
    data = _no_nulls(data)
    data["schemaVersion"] = SCHEMA_VERSION  # grafanalib says 12, a layout Grafana would migrate
    for key in LEGACY["dashboard"]:
        data.pop(key, None)
    for key in LEGACY["timepicker"]:
        data.get("timepicker", {}).pop(key, None)
    for panel in data["panels"]:
        for key in LEGACY["panel"]:
            panel.pop(key, None)
        panel["options"]["legend"]["showLegend"] = True  # required by the timeseries schema
        for target in panel["targets"]:
            for key in LEGACY["target"]:
                target.pop(key, None)
    return data


def dashboard(title: str, uid: str, panels: list[P]) -> str:
    items = []
    for n, p in enumerate(panels):
        items.append(TimeSeries(
            title=p.title, dataSource=DATASOURCE, unit=p.unit,
            targets=[Target(expr=p.expr, legendFormat=p.legend, refId="A")],
            gridPos=GridPos(h=8, w=12, x=12 * (n % 2), y=8 * (n // 2)),
        ))
    board = Dashboard(
        title=title, uid=uid, tags=["tsoracle"], timezone="browser", refresh="30s",
        panels=items,
        templating=Templating(list=[{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Prometheus",
        }]),
    ).auto_panel_ids()
    data = grafana_v1(json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder)))
    found = problems(data)
    if found:
        raise ValueError(f"{title}: Grafana's dashboard model rejects it:\n  "
                         + "\n  ".join(found))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def rules(for_override: str | None = None) -> str:
    group = {"name": "tsoracle", "rules": []}
    for name, expr, for_, severity, summary, runbook, description in ALERTS:
        group["rules"].append({
            "alert": name, "expr": expr, "for": for_override or for_,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": f"{RUNBOOK_BASE_URL}/{runbook}.md"},
        })
    return yaml.safe_dump({"groups": [group]}, sort_keys=False, width=1000)


def outputs() -> dict[Path, str]:
    return {
        CHART / "dashboards" / "tsoracle-oracle.json":
            dashboard("tsoracle: oracle", "tsoracle-oracle", ORACLE_PANELS),
        CHART / "dashboards" / "tsoracle-operator.json":
            dashboard("tsoracle: operator", "tsoracle-operator", OPERATOR_PANELS),
        CHART / "dashboards" / "tsoracle-catalog.json":
            dashboard("tsoracle: catalog", "tsoracle-catalog", CATALOG_PANELS),
        CHART / "files" / "alerts.rules.yaml": rules(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path, text in outputs().items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale, run tsoracle-dashboards:", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
