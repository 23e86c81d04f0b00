"""Build the Grafana dashboards (grafanalib) and the alert rules from panels.py.

    python tools/dashboards/build.py          # write charts/tsoracle/{dashboards,files}
    python tools/dashboards/build.py --check  # fail if the committed files are stale

grafanalib, because the dashboards are then plain Python next to the PromQL list the tests
check, built by a pip dependency with no Go or Node toolchain (Grafana's foundation SDK would
need one of them for little gain here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, GridPos, Target, Templating, TimeSeries

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from panels import ALERTS, OPERATOR_PANELS, ORACLE_PANELS  # noqa: E402

CHART = HERE.parent.parent / "charts" / "tsoracle"
RUNBOOKS = "docs/runbooks"


def dashboard(title: str, uid: str, panels: list[tuple[str, str, str]]) -> str:
    items = []
    for n, (name, expr, unit) in enumerate(panels):
        items.append(TimeSeries(
            title=name, dataSource="${datasource}", unit=unit,
            targets=[Target(expr=expr, legendFormat="", refId="A")],
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
    return json.dumps(board.to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True)


def rules(for_override: str | None = None) -> str:
    group = {"name": "tsoracle", "rules": []}
    for name, expr, for_, severity, summary, runbook in ALERTS:
        group["rules"].append({
            "alert": name, "expr": expr, "for": for_override or for_,
            "labels": {"severity": severity},
            "annotations": {"summary": summary,
                            "runbook": f"{RUNBOOKS}/{runbook}.md"},
        })
    return yaml.safe_dump({"groups": [group]}, sort_keys=False, width=1000)


def outputs() -> dict[Path, str]:
    return {
        CHART / "dashboards" / "tsoracle-oracle.json":
            dashboard("tsoracle: oracle", "tsoracle-oracle", ORACLE_PANELS),
        CHART / "dashboards" / "tsoracle-operator.json":
            dashboard("tsoracle: operator", "tsoracle-operator", OPERATOR_PANELS),
        CHART / "files" / "alerts.rules.yaml": rules(),
    }


def main(argv: list[str]) -> int:
    stale = []
    for path, text in outputs().items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale, run tools/dashboards/build.py:", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
