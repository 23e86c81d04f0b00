"""`kubectl tsoracle report NAME [-f FILE.zip] [--operator-log FILE]`: a zip for a bug report.

It holds the resource, its backend Secret with keys but no values, the resource's Events and
the operator's logs; the Secret's values are redacted from every file, in any encoding.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import zipfile
from typing import Any

from kubernetes.client.exceptions import ApiException

from tsoracle.kubectl.api import Api, PluginError
from tsoracle.kubectl.printer import print_, render
from tsoracle.redact import redact_texts, redacted_secret, secret_texts

HELP = ("zip the resource, its Secret's keys (never its values), Events and operator logs, "
        "with the Secret's values redacted")
OPERATOR_PODS = "app.kubernetes.io/name=tsoracle,app.kubernetes.io/component=operator"
LOG_LINES = 5000  # the tail of each operator pod's log


def flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("name")
    c.add_argument("-f", "--file",
                   help="the zip to write (default: tsoracle-report-NAMESPACE-NAME.zip)")
    c.add_argument("--operator-log", action="append", default=[], metavar="FILE",
                   help="also include this operator log file (repeatable)")


def run(api: Api, args: argparse.Namespace) -> int:
    return report(api, args.name, args.file, args.operator_log, args.output)


def report(api: Api, name: str, file: str | None, operator_logs: list[str],
           output: str) -> int:
    obj = api.get(name)
    manifest = "json" if output == "json" else "yaml"  # text has no manifest form of its own
    resource = dict(obj)
    resource["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    files = {f"timestamporacle.{manifest}": render(resource, manifest)}
    values, keys = _secret(api, obj, manifest, files)
    try:
        events = api.core.list_namespaced_event(
            api.namespace, field_selector=f"involvedObject.name={name}").items
        files[f"events.{manifest}"] = render([_event(api.plain(e)) for e in events], manifest)
    except ApiException as exc:  # may not list Events: the rest of the report still helps
        files["events.txt"] = f"Events could not be listed ({exc.status} {exc.reason})\n"
    files.update(_pod_logs(api))
    files.update(_local_logs(operator_logs))
    if not any(k.startswith("operator-") for k in files):
        files["operator-logs.txt"] = "no operator pod found (pass --operator-log FILE)\n"
    out = file or f"tsoracle-report-{api.namespace}-{name}.zip"
    _write_zip(out, files, secret_texts(values))
    print_({"file": out, "entries": sorted(files), "secretKeysRedacted": keys}, output,
           lambda d: f"wrote {out}: {', '.join(d['entries'])} (Secret values redacted, keys "
                     "kept)")
    return 0


def _secret(api: Api, obj: dict[str, Any], manifest: str,
            files: dict[str, str]) -> tuple[list[str], list[str]]:
    """Add the backend Secret, keys only, to `files`; return its values and its keys."""
    ref = ((obj.get("spec") or {}).get("backend") or {}).get("urlSecretRef") or {}
    try:
        secret = api.plain(api.core.read_namespaced_secret(ref.get("name", ""), api.namespace))
    except ApiException as exc:
        files["secret.txt"] = (f"Secret {api.namespace}/{ref.get('name')} could not be read "
                               f"({exc.status} {exc.reason}); nothing of it is included\n")
        return [], []
    data = secret.get("data") or {}
    files[f"secret.{manifest}"] = render(redacted_secret(secret), manifest)
    return [_decoded(v) for v in data.values()], sorted(data)


def _decoded(value: str) -> str:
    """A Secret's value as the pods see it; one that is not base64 (the API server checks,
    a proxy or an old cluster may not) is redacted as it stands."""
    try:
        return base64.b64decode(value, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return value


def _pod_logs(api: Api) -> dict[str, str]:
    try:
        pods = api.plain(api.core.list_pod_for_all_namespaces(label_selector=OPERATOR_PODS)
                         .items)
    except ApiException:
        pods = []  # may not list pods cluster-wide: the logs given with --operator-log remain
    logs = {}
    for pod in pods:
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            log = api.core.read_namespaced_pod_log(pod_name, ns, tail_lines=LOG_LINES)
        except ApiException as exc:
            log = f"(logs unavailable: {exc.reason})"
        logs[f"operator-{ns}-{pod_name}.log"] = log
    return logs


def _local_logs(paths: list[str]) -> dict[str, str]:
    logs = {}
    for i, path in enumerate(paths):
        try:
            with open(path, errors="replace") as f:
                logs[f"operator-local-{i}.log"] = f.read()
        except OSError as exc:
            raise PluginError(f"cannot read --operator-log {path}: {exc.strerror}") from None
    return logs


def _write_zip(out: str, files: dict[str, str], secrets: list[str]) -> None:
    # Built in memory first: a failure half way leaves no partial zip behind.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for fname, text in sorted(files.items()):
            z.writestr(fname, redact_texts(text, secrets))
    with open(out, "wb") as f:
        f.write(buf.getvalue())


def _event(e: dict[str, Any]) -> dict[str, Any]:
    """What a reader of an Event needs, oldest-first readable; not the API's bookkeeping (kopf
    fills the required `action` with a placeholder, "Action?")."""
    source = e.get("source") or {}
    return {k: v for k, v in {
        "time": e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"),
        "type": e.get("type"), "reason": e.get("reason"), "message": e.get("message"),
        "count": e.get("count"),
        "from": e.get("reportingComponent") or source.get("component"),
    }.items() if v not in (None, "")}
