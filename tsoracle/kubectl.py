"""`kubectl tsoracle`: day-2 commands for TimestampOracle resources (a kubectl plugin).

    kubectl tsoracle status NAME [-n NS] [-o json]
    kubectl tsoracle flip NAME --to legacy|distributed [--timeout 120]
    kubectl tsoracle fencing on|off NAME
    kubectl tsoracle report NAME [--output FILE.zip] [--operator-log FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import zipfile
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.operator.redact import redact
from tsoracle.resource import GROUP, PLURAL, VERSION, SecretProblem, read_secret_url_sync


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
                raise PluginError(f"TimestampOracle {self.namespace}/{name} not found") from None
            raise PluginError(f"the API server refused: {exc.reason}") from None

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       name, {"spec": spec})
        except ApiException as exc:
            body = json.loads(exc.body or "{}") if exc.body else {}
            raise PluginError(f"the API server refused the change: "
                              f"{body.get('message', exc.reason)}") from None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def status(api: Api, name: str, output: str) -> int:
    obj = api.get(name)
    st = obj.get("status") or {}
    if output == "json":
        print(json.dumps({"name": name, "namespace": api.namespace, "spec": obj.get("spec"),
                          "status": st}, indent=2))
        return 0
    spec = obj.get("spec") or {}
    rollout = _condition(obj, "RolloutInProgress").get("status") == "True"
    print(f"TimestampOracle {api.namespace}/{name}")
    print(f"  implementation  {st.get('activeImplementation', '-')} "
          f"(spec: {spec.get('implementation')})")
    print(f"  epoch           {st.get('epoch', '-')}")
    print(f"  fencing         {spec.get('fencing')}{'  (rollout in progress)' if rollout else ''}")
    rows = [("TIMELINE", "READ_TS", "WRITE_TS", "LAG_MS")]
    for t in st.get("timelines") or []:
        lag = t.get("lagMs")
        rows.append((t["name"], t["readTs"], t["writeTs"], "-" if lag is None else str(lag)))
    _table(rows, indent=2)
    rows = [("CONDITION", "STATUS", "REASON", "MESSAGE")]
    for c in st.get("conditions") or []:
        rows.append((c["type"], c["status"], c.get("reason", ""), c.get("message", "")))
    _table(rows, indent=2)
    return 0


def _table(rows: list[tuple[str, ...]], indent: int) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(" " * indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
              .rstrip())


def flip(api: Api, name: str, to: str, timeout: float) -> int:
    obj = api.get(name)
    st = obj.get("status") or {}
    if st.get("activeImplementation") == to and obj["spec"].get("implementation") == to:
        print(f"{name} already runs {to} at epoch {st.get('epoch')}; nothing to do")
        return 0
    before = int(st.get("epoch") or 0)
    api.patch_spec(name, {"implementation": to})
    print(f"spec.implementation set to {to}; waiting for the operator (epoch {before})...",
          flush=True)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = api.get(name)
        st = obj.get("status") or {}
        ready = _condition(obj, "Ready")
        line = (f"  epoch {st.get('epoch')}  implementation {st.get('activeImplementation')}  "
                f"Ready={ready.get('status')} {ready.get('reason', '')}")
        if line != last:
            print(line, flush=True)
            last = line
        if (st.get("activeImplementation") == to and int(st.get("epoch") or 0) > before
                and ready.get("status") == "True"):
            boot = st.get("bootstrapTimestamp") or {}
            print(f"flipped to {to} at epoch {st['epoch']}; bootstrap "
                  + ", ".join(f"{k}={v}" for k, v in sorted(boot.items())))
            return 0
        time.sleep(0.5)
    raise PluginError(f"the flip did not complete within {timeout:.0f}s; see "
                      f"`kubectl tsoracle status {name}` and the operator's logs")


def fencing(api: Api, name: str, state: str) -> int:
    mode = "Always" if state == "on" else "Disabled"
    api.get(name)
    api.patch_spec(name, {"fencing": mode})
    print(f"{name}: fencing {state} (spec.fencing={mode})")
    if mode == "Disabled":
        print("warning: with fencing off a superseded legacy leader can serve stale reads "
              "for up to a second (timestamps stay unique)",
              file=sys.stderr)
    return 0


def report(api: Api, name: str, output: str | None, operator_logs: list[str]) -> int:
    obj = api.get(name)
    spec = obj.get("spec") or {}
    ref = (spec.get("backend") or {}).get("urlSecretRef") or {}
    secret_value = None
    try:
        secret_value = read_secret_url_sync(api.client, api.namespace, ref.get("name", ""),
                                            ref.get("key", "url"))
    except (SecretProblem, ApiException):
        pass  # nothing to redact if we cannot read it

    def clean(text: str) -> str:
        return redact(text, secret_value)

    events = api.core.list_namespaced_event(
        api.namespace, field_selector=f"involvedObject.name={name}")
    files: dict[str, str] = {
        "timestamporacle.json": json.dumps(obj, indent=2, default=str),
        "events.json": json.dumps([api.client.sanitize_for_serialization(e)
                                   for e in events.items], indent=2, default=str),
    }
    pods = api.core.list_pod_for_all_namespaces(
        label_selector="app.kubernetes.io/name=tsoracle,app.kubernetes.io/component=operator")
    for pod in pods.items:
        try:
            log = api.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace,
                                                   tail_lines=5000)
        except ApiException as exc:
            log = f"(logs unavailable: {exc.reason})"
        files[f"operator-{pod.metadata.namespace}-{pod.metadata.name}.log"] = log
    for i, path in enumerate(operator_logs):
        with open(path) as f:
            files[f"operator-local-{i}.log"] = f.read()
    if not any(k.startswith("operator-") for k in files):
        files["operator-logs.txt"] = "no operator pod found (pass --operator-log FILE)"
    out = output or f"tsoracle-report-{api.namespace}-{name}.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for fname, text in files.items():
            z.writestr(fname, clean(text))
    with open(out, "wb") as f:
        f.write(buf.getvalue())
    print(f"wrote {out}: {', '.join(sorted(files))} (backend URL redacted)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl tsoracle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--namespace")
    p.add_argument("--kubeconfig")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status", help="implementation, epoch, fencing, timelines, conditions")
    s.add_argument("name")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    f = sub.add_parser("flip", help="switch the implementation and wait for the operator")
    f.add_argument("name")
    f.add_argument("--to", required=True, choices=["legacy", "distributed"])
    f.add_argument("--timeout", type=float, default=120)
    fe = sub.add_parser("fencing", help="turn epoch fencing on (Always) or off (Disabled)")
    fe.add_argument("state", choices=["on", "off"])
    fe.add_argument("name")
    r = sub.add_parser("report", help="zip the resource, its Events and operator logs")
    r.add_argument("name")
    r.add_argument("--output")
    r.add_argument("--operator-log", action="append", default=[])
    for sp in (s, f, fe, r):
        sp.add_argument("-n", "--namespace", dest="ns_sub")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = Api(args.kubeconfig, args.ns_sub or args.namespace)
        if args.cmd == "status":
            return status(api, args.name, args.output)
        if args.cmd == "flip":
            return flip(api, args.name, args.to, args.timeout)
        if args.cmd == "fencing":
            return fencing(api, args.name, args.state)
        return report(api, args.name, args.output, args.operator_log)
    except PluginError as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
