"""`kubectl tsoracle`: day-2 commands for TimestampOracle resources (a kubectl plugin).

    kubectl tsoracle status [NAME] [-n NS | -A]      the namespace's oracles, or one in detail
    kubectl tsoracle flip NAME --to legacy|distributed [--timeout 120]
    kubectl tsoracle fencing NAME Always|Rollout|Disabled   (on = Always, off = Disabled)
    kubectl tsoracle report NAME [-f FILE.zip] [--operator-log FILE]

Every command takes -o text|json|yaml.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import io
import json
import re
import sys
import time
import zipfile
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.errors import ConfigError
from tsoracle.output import FORMATS, emit, fields, render, table
from tsoracle.resource import GROUP, PLURAL, VERSION
from tsoracle.store import parse_url, secret_forms

MODES = {"Always": "Always", "Rollout": "Rollout", "Disabled": "Disabled",
         "on": "Always", "off": "Disabled"}  # on/off: the plugin's first spelling
REDACTED = "<redacted>"
OPERATOR_PODS = "app.kubernetes.io/name=tsoracle,app.kubernetes.io/component=operator"


class PluginError(Exception):
    pass


class Api:
    def __init__(self, kubeconfig: str | None, namespace: str | None) -> None:
        try:
            if kubeconfig:
                self.client = config.new_client_from_config(kubeconfig)
                _, ctx = config.list_kube_config_contexts(kubeconfig)
            else:
                config.load_kube_config()
                self.client = client.ApiClient()
                _, ctx = config.list_kube_config_contexts()
        except (config.ConfigException, OSError) as exc:
            raise PluginError(f"no usable kubeconfig: {exc}") from None
        self.namespace = namespace or ctx.get("context", {}).get("namespace") or "default"
        self.custom = client.CustomObjectsApi(self.client)
        self.core = client.CoreV1Api(self.client)

    def get(self, name: str) -> dict[str, Any]:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                            PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                raise PluginError(f"TimestampOracle {self.namespace}/{name} not found; "
                                  f"`kubectl tsoracle status -n {self.namespace}` lists "
                                  "them") from None
            raise PluginError(f"the API server refused: {exc.reason}") from None

    def list(self, all_namespaces: bool) -> list[dict[str, Any]]:
        try:
            if all_namespaces:
                found = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            else:
                found = self.custom.list_namespaced_custom_object(GROUP, VERSION,
                                                                  self.namespace, PLURAL)
        except ApiException as exc:
            raise PluginError(f"the API server refused to list TimestampOracles: "
                              f"{exc.reason}") from None
        items = found.get("items") or []
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       name, {"spec": spec})
        except ApiException as exc:
            body = json.loads(exc.body or "{}") if exc.body else {}
            raise PluginError(f"the API server refused the change: "
                              f"{body.get('message', exc.reason)}") from None


# --- reading a resource --------------------------------------------------------------------

def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


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
    ready = _condition(obj, "Ready")
    return {
        "name": meta["name"], "namespace": meta["namespace"],
        "implementation": st.get("activeImplementation"),
        "desiredImplementation": spec.get("implementation"),
        # In force, as the CRD's printer column shows it (none before the first reconcile).
        "epoch": st.get("epoch"), "fencing": st.get("fencing"),
        "desiredFencing": spec.get("fencing"),
        "rollout": _condition(obj, "RolloutInProgress").get("status") == "True",
        "ready": ready.get("status"), "reason": ready.get("reason"),
        "message": ready.get("message", ""), "age": age(meta.get("creationTimestamp")),
        "created": meta.get("creationTimestamp"),
        "schema": (spec.get("backend") or {}).get("schema"),
        "timelines": st.get("timelines") or [],
        "conditions": st.get("conditions") or [],
        "spec": spec, "status": st,
    }


LIST_COLUMNS = ("NAME", "IMPLEMENTATION", "DESIRED", "EPOCH", "FENCING", "READY", "REASON",
                "TIMELINES", "AGE")


def _list_text(data: dict[str, Any]) -> str:
    items, every = data["items"], data["allNamespaces"]
    if not items:
        where = "any namespace" if every else f"namespace {data['namespace']}"
        return f"No TimestampOracle in {where}."
    rows = [([s["namespace"]] if every else [])
            + [s["name"], s["implementation"], s["desiredImplementation"], s["epoch"],
               s["fencing"], s["ready"], s["reason"], len(s["timelines"]), s["age"]]
            for s in items]
    return table((("NAMESPACE",) if every else ()) + LIST_COLUMNS, rows)


def _one_text(s: dict[str, Any]) -> str:
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
           "", "Timelines"]
    rows = [(t.get("name"), t.get("readTs"), t.get("writeTs"), t.get("lagMs"))
            for t in s["timelines"]]
    out.append(table(("TIMELINE", "READ_TS", "WRITE_TS", "LAG_MS"), rows, indent=2)
               if rows else "  none reported yet")
    out += ["", "Conditions"]
    rows = [(c.get("type"), c.get("status"), c.get("reason", ""), c.get("message", ""))
            for c in s["conditions"]]
    out.append(table(("CONDITION", "STATUS", "REASON", "MESSAGE"), rows, indent=2)
               if rows else "  none reported yet (is the operator running?)")
    return "\n".join(out)


def status(api: Api, name: str | None, all_namespaces: bool, output: str) -> int:
    if name is None:
        items = [summary(o) for o in api.list(all_namespaces)]
        brief = [{k: v for k, v in s.items() if k not in ("spec", "status")} for s in items]
        emit({"namespace": None if all_namespaces else api.namespace,
              "allNamespaces": all_namespaces, "items": brief}, output, _list_text)
        return 0
    if all_namespaces:
        raise PluginError("-A lists every namespace's oracles; to show one, give its "
                          "namespace with -n instead")
    emit(summary(api.get(name)), output, _one_text)  # spec and status kept whole for scripts
    return 0


# --- changing a resource -------------------------------------------------------------------

def flip(api: Api, name: str, to: str, timeout: float, output: str) -> int:
    # Progress goes to stdout in text, to stderr when stdout carries json or yaml.
    progress = sys.stdout if output == "text" else sys.stderr
    obj = api.get(name)
    st = obj.get("status") or {}
    if st.get("activeImplementation") == to and obj["spec"].get("implementation") == to:
        emit({"name": name, "namespace": api.namespace, "implementation": to,
              "epoch": st.get("epoch"), "changed": False}, output,
             lambda d: f"{name} already runs {to} at epoch {d['epoch']}; nothing to do")
        return 0
    before = int(st.get("epoch") or 0)
    api.patch_spec(name, {"implementation": to})
    print(f"spec.implementation set to {to}; waiting for the operator (epoch {before})...",
          file=progress, flush=True)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = api.get(name)
        st = obj.get("status") or {}
        ready = _condition(obj, "Ready")
        line = (f"  epoch {st.get('epoch')}  implementation {st.get('activeImplementation')}  "
                f"Ready={ready.get('status')} {ready.get('reason', '')}")
        if line != last:
            print(line, file=progress, flush=True)
            last = line
        if (st.get("activeImplementation") == to and int(st.get("epoch") or 0) > before
                and ready.get("status") == "True"):
            boot = st.get("bootstrapTimestamp") or {}
            emit({"name": name, "namespace": api.namespace, "implementation": to,
                  "epoch": st["epoch"], "changed": True, "bootstrapTimestamp": boot}, output,
                 lambda d: f"flipped to {to} at epoch {d['epoch']}; bootstrap "
                           + ", ".join(f"{k}={v}" for k, v in
                                       sorted(d["bootstrapTimestamp"].items())))
            return 0
        time.sleep(0.5)
    raise PluginError(f"the flip did not complete within {timeout:.0f}s; see "
                      f"`kubectl tsoracle status {name}` and the operator's logs")


def fencing_args(first: str, second: str) -> tuple[str, str]:
    """(name, mode) from `fencing NAME MODE`, or the older `fencing on|off NAME`."""
    if second in MODES:
        return first, MODES[second]
    if first in MODES:
        return second, MODES[first]
    raise PluginError(f"fencing takes a resource and a mode: kubectl tsoracle fencing NAME "
                      f"Always|Rollout|Disabled (on = Always, off = Disabled); got {first!r} "
                      f"and {second!r}")


def fencing(api: Api, name: str, mode: str, output: str) -> int:
    api.get(name)
    api.patch_spec(name, {"fencing": mode})
    emit({"name": name, "namespace": api.namespace, "fencing": mode}, output,
         lambda d: f"{name}: spec.fencing set to {mode}; the operator applies it")
    if mode == "Disabled":
        print("warning: with fencing off a superseded legacy leader can serve stale reads "
              "for up to a second (timestamps stay unique)", file=sys.stderr)
    if mode == "Rollout":
        print("note: after each flip, processes on the old epoch are fenced only for "
              "spec.rolloutWindowSeconds", file=sys.stderr)
    return 0


# --- report --------------------------------------------------------------------------------

def secret_texts(values: Iterable[str]) -> list[str]:
    """Every form in which a Secret's values may appear in text: each value (raw, trimmed,
    percent-encoded and -decoded, base64) and, for a backend URL, its password. Hosts and
    other addresses are not secrets and stay readable."""
    found: set[str] = set()
    for value in values:
        for v in {value, value.strip()}:
            if not v:
                continue
            found |= {v, quote(v, safe=""), unquote(v), base64.b64encode(v.encode()).decode()}
            try:
                parsed = parse_url(v)
            except ConfigError:
                continue
            for secret in {parsed.password, *parsed.secrets}:
                found.update(secret_forms(secret))
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """Replace every secret form (from `secret_texts`) with `<redacted>`."""
    for s in secrets:
        text = re.sub(re.escape(s), REDACTED, text, flags=re.IGNORECASE)
    return text


def redacted_secret(secret: dict[str, Any]) -> dict[str, Any]:
    """A Secret as the report keeps it: its keys and metadata, never a value (annotations
    too: `kubectl apply` copies the whole Secret into one)."""
    meta = secret.get("metadata") or {}
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                     "labels": meta.get("labels") or {},
                     "annotations": {k: REDACTED for k in meta.get("annotations") or {}},
                     "creationTimestamp": meta.get("creationTimestamp")},
        "type": secret.get("type"),
        "data": {k: REDACTED for k in sorted(secret.get("data") or {})},
    }


def report(api: Api, name: str, file: str | None, operator_logs: list[str],
           output: str) -> int:
    obj = api.get(name)
    ref = ((obj.get("spec") or {}).get("backend") or {}).get("urlSecretRef") or {}
    manifest = "json" if output == "json" else "yaml"
    files: dict[str, str] = {}
    values: list[str] = []
    keys: list[str] = []

    def put(fname: str, value: Any) -> None:
        files[f"{fname}.{manifest}"] = render(value, manifest)

    resource = dict(obj)
    resource["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    put("timestamporacle", resource)
    try:
        secret = api.client.sanitize_for_serialization(
            api.core.read_namespaced_secret(ref.get("name", ""), api.namespace))
        data = secret.get("data") or {}
        keys = sorted(data)
        values = [base64.b64decode(v).decode(errors="replace") for v in data.values()]
        put("secret", redacted_secret(secret))
    except ApiException as exc:
        files["secret.txt"] = (f"Secret {api.namespace}/{ref.get('name')} could not be read "
                               f"({exc.status} {exc.reason}); nothing of it is included\n")
    events = api.core.list_namespaced_event(
        api.namespace, field_selector=f"involvedObject.name={name}")
    put("events", [api.client.sanitize_for_serialization(e) for e in events.items])
    try:
        pods = api.core.list_pod_for_all_namespaces(label_selector=OPERATOR_PODS).items
    except ApiException:
        pods = []  # may not list pods cluster-wide: the logs given with --operator-log remain
    for pod in pods:
        try:
            log = api.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace,
                                                   tail_lines=5000)
        except ApiException as exc:
            log = f"(logs unavailable: {exc.reason})"
        files[f"operator-{pod.metadata.namespace}-{pod.metadata.name}.log"] = log
    for i, path in enumerate(operator_logs):
        try:
            with open(path, errors="replace") as f:
                files[f"operator-local-{i}.log"] = f.read()
        except OSError as exc:
            raise PluginError(f"cannot read --operator-log {path}: {exc.strerror}") from None
    if not any(k.startswith("operator-") for k in files):
        files["operator-logs.txt"] = "no operator pod found (pass --operator-log FILE)\n"
    secrets = secret_texts(values)
    out = file or f"tsoracle-report-{api.namespace}-{name}.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for fname, text in sorted(files.items()):
            z.writestr(fname, redact(text, secrets))
    with open(out, "wb") as f:
        f.write(buf.getvalue())
    emit({"file": out, "entries": sorted(files), "secretKeysRedacted": keys}, output,
         lambda d: f"wrote {out}: {', '.join(d['entries'])} (Secret values redacted, keys "
                   "kept)")
    return 0


def _output(text: str) -> str:
    """-o's type: a format; an older `--output FILE.zip` gets pointed at -f."""
    if text in FORMATS:
        return text
    hint = "; name the report's zip file with -f/--file" if text.endswith(".zip") else ""
    raise argparse.ArgumentTypeError(f"-o/--output is the format: text, json or yaml{hint}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl tsoracle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.add_argument("-n", "--namespace", dest="ns_sub", help="namespace")
        c.add_argument("-o", "--output", type=_output, default="text",
                       help="text, json or yaml (default: text)")
        return c

    s = cmd("status", "list the namespace's TimestampOracles, or show one: implementation, "
                      "epoch, fencing, timelines, conditions")
    s.add_argument("name", nargs="?", help="one resource (default: list them all)")
    s.add_argument("-A", "--all-namespaces", action="store_true",
                   help="list the TimestampOracles of every namespace")
    f = cmd("flip", "switch the implementation and wait for the operator")
    f.add_argument("name")
    f.add_argument("--to", required=True, choices=["legacy", "distributed"])
    f.add_argument("--timeout", type=float, default=120, help="seconds (default: 120)")
    fe = cmd("fencing", "set spec.fencing: Always, Rollout or Disabled (on = Always, "
                        "off = Disabled)")
    fe.add_argument("first", metavar="NAME", help="the resource")
    fe.add_argument("second", metavar="MODE",
                    help="Always, Rollout, Disabled, on or off (`fencing on|off NAME` works too)")
    r = cmd("report", "zip the resource, its Secret's keys (never its values), Events and "
                      "operator logs, with the Secret's values redacted")
    r.add_argument("name")
    r.add_argument("-f", "--file", help="the zip to write "
                                        "(default: tsoracle-report-NAMESPACE-NAME.zip)")
    r.add_argument("--operator-log", action="append", default=[], metavar="FILE",
                   help="also include this operator log file (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = Api(args.kubeconfig, args.ns_sub or args.namespace)
        if args.cmd == "status":
            return status(api, args.name, args.all_namespaces, args.output)
        if args.cmd == "flip":
            return flip(api, args.name, args.to, args.timeout, args.output)
        if args.cmd == "fencing":
            name, mode = fencing_args(args.first, args.second)
            return fencing(api, name, mode, args.output)
        return report(api, args.name, args.file, args.operator_log, args.output)
    except PluginError as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
