"""`kubectl tsoracle status [NAME] [-n NS | -A]`: the namespace's oracles, or one in detail."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from tsoracle.kubectl.api import Api, PluginError, condition
from tsoracle.kubectl.printer import fields, print_, table

HELP = ("list the namespace's TimestampOracles, or show one: implementation, epoch, fencing, "
        "timelines, conditions")
LIST_COLUMNS = ("NAME", "IMPLEMENTATION", "DESIRED", "EPOCH", "FENCING", "READY", "REASON",
                "TIMELINES", "AGE")


def flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("name", nargs="?", help="one resource (default: list them all)")
    c.add_argument("-A", "--all-namespaces", action="store_true",
                   help="list the TimestampOracles of every namespace")


def run(api: Api, args: argparse.Namespace) -> int:
    return status(api, args.name, args.all_namespaces, args.output)


def status(api: Api, name: str | None, all_namespaces: bool, output: str) -> int:
    if name is None:
        items = [summary(o) for o in api.list(all_namespaces)]
        brief = [{k: v for k, v in s.items() if k not in ("spec", "status")} for s in items]
        print_({"namespace": None if all_namespaces else api.namespace,
                "allNamespaces": all_namespaces, "items": brief}, output, list_text)
        return 0
    if all_namespaces:
        raise PluginError("-A lists every namespace's oracles; to show one, give its "
                          "namespace with -n instead")
    print_(summary(api.get(name)), output, one_text)  # spec and status kept whole for scripts
    return 0


def age(created: str | None, now: dt.datetime | None = None) -> str:
    """A resource's age as `kubectl get` prints it (90s, 5m30s, 3h10m, 2d5h, 1y20d)."""
    if not created:
        return "-"
    then = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    s = max(0, int(((now or dt.datetime.now(dt.UTC)) - then).total_seconds()))
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y{d % 365}d" if d < 365 * 8 and d % 365 else f"{d // 365}y"


def summary(obj: dict[str, Any]) -> dict[str, Any]:
    """What `status` shows of one resource (and what -o json|yaml prints)."""
    meta, spec, st = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    ready = condition(obj, "Ready")
    return {
        "name": meta["name"], "namespace": meta["namespace"],
        "implementation": st.get("activeImplementation"),
        "desiredImplementation": spec.get("implementation"),
        # In force, as the CRD's printer column shows it (none before the first reconcile).
        "epoch": st.get("epoch"), "fencing": st.get("fencing"),
        "desiredFencing": spec.get("fencing"),
        "rollout": condition(obj, "RolloutInProgress").get("status") == "True",
        "ready": ready.get("status"), "reason": ready.get("reason"),
        "message": ready.get("message", ""), "age": age(meta.get("creationTimestamp")),
        "created": meta.get("creationTimestamp"),
        "schema": (spec.get("backend") or {}).get("schema"),
        "timelines": st.get("timelines") or [],
        "conditions": st.get("conditions") or [],
        "spec": spec, "status": st,
    }


def list_text(data: dict[str, Any]) -> str:
    items, every = data["items"], data["allNamespaces"]
    if not items:
        where = "any namespace" if every else f"namespace {data['namespace']}"
        return f"No TimestampOracle in {where}."
    rows = [([s["namespace"]] if every else [])
            + [s["name"], s["implementation"], s["desiredImplementation"], s["epoch"],
               s["fencing"], s["ready"], s["reason"], len(s["timelines"]), s["age"]]
            for s in items]
    return table((("NAMESPACE",) if every else ()) + LIST_COLUMNS, rows)


def one_text(s: dict[str, Any]) -> str:
    impl = s["implementation"] or "-"
    if s["desiredImplementation"] != s["implementation"]:
        impl += f" (flipping to {s['desiredImplementation']})"
    fencing = s["fencing"] or "-"
    if s["desiredFencing"] and s["desiredFencing"] != s["fencing"]:
        fencing += f" (changing to {s['desiredFencing']})"
    if s["rollout"]:
        fencing += "  (rollout in progress)"
    ready = (s["ready"] or "-") + (f" ({s['reason']})" if s["reason"] else "")
    out = [f"TimestampOracle {s['namespace']}/{s['name']}",
           fields([("implementation", impl), ("epoch", s["epoch"]), ("fencing", fencing),
                   ("ready", ready), ("schema", s["schema"]), ("age", s["age"])], indent=2),
           "", "Timelines", _section(
               ("TIMELINE", "READ_TS", "WRITE_TS", "LAG_MS"),
               [(t.get("name"), t.get("readTs"), t.get("writeTs"), t.get("lagMs"))
                for t in s["timelines"]], "none reported yet"),
           "", "Conditions", _section(
               ("CONDITION", "STATUS", "REASON", "MESSAGE"),
               [(c.get("type"), c.get("status"), c.get("reason", ""), c.get("message", ""))
                for c in s["conditions"]], "none reported yet (is the operator running?)")]
    return "\n".join(out)


def _section(headers: tuple[str, ...], rows: list[tuple[Any, ...]], empty: str) -> str:
    return table(headers, rows, indent=2) if rows else f"  {empty}"
