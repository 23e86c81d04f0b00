"""The kubectl plugin's printer, views and argument handling, and the redactor it shares with
the operator: pure functions, no API server (tests/test_kubectl_plugin.py runs the plugin)."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tsoracle.fencing import IMPLEMENTATIONS, MODES
from tsoracle.kubectl import build_parser
from tsoracle.kubectl.api import Api, PluginError, condition
from tsoracle.kubectl.connection import Connection
from tsoracle.kubectl.fencing import fencing_args
from tsoracle.kubectl.printer import print_, progress
from tsoracle.kubectl.report import _pod_logs
from tsoracle.kubectl.status import list_text, one_text, summary
from tsoracle.operator.redact import redact
from tsoracle.redact import (
    REDACTED,
    password_forms,
    redact_texts,
    redacted_secret,
    secret_texts,
)

ORDERS = {
    "metadata": {"name": "orders", "namespace": "shop"},
    "spec": {"implementation": "legacy", "fencing": "Always", "backend": {"schema": "tso"}},
    "status": {"activeImplementation": "distributed", "epoch": 3, "fencing": "Always",
               "timelines": [{"name": "counter:orders", "readTs": 7, "writeTs": 9,
                              "lagMs": 1}],
               "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}]},
}


# --- the printer ---------------------------------------------------------------------------

def test_one_value_prints_in_every_format(capsys):
    value = {"name": "orders", "epoch": 3, "timelines": ["a", "b"]}

    def printed(fmt: str) -> str:
        print_(value, fmt, lambda d: f"{d['name']} at epoch {d['epoch']}")
        return capsys.readouterr().out

    assert json.loads(printed("json")) == value
    assert yaml.safe_load(printed("yaml")) == value
    assert printed("text") == "orders at epoch 3\n"


def test_progress_leaves_stdout_to_json_and_yaml():
    assert progress("text") is sys.stdout
    assert progress("json") is sys.stderr and progress("yaml") is sys.stderr


@pytest.mark.parametrize("command", [["status"], ["flip", "x", "--to", "legacy"],
                                     ["fencing", "x", "on"], ["report", "x"]])
def test_every_command_takes_the_output_flag(command, capsys):
    for fmt in ("text", "json", "yaml"):
        assert build_parser().parse_args([*command, "-o", fmt]).output == fmt
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*command, "-o", "wide"])
    assert exit_.value.code == 2
    assert "-o/--output is the format: text, json or yaml" in capsys.readouterr().err


def test_an_old_output_file_is_pointed_at_the_file_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "x", "--output", "r.zip"])
    assert "name the report's zip file with -f/--file" in capsys.readouterr().err


# --- the views and arguments ---------------------------------------------------------------

def test_one_oracle_in_text():
    text = one_text(summary(ORDERS))
    assert text.splitlines()[0] == "TimestampOracle shop/orders"
    assert "  implementation  distributed (flipping to legacy)" in text
    assert "  ready           True (Reconciled)" in text
    assert "  counter:orders  7        9         1" in text


def test_the_list_in_text():
    brief = {k: v for k, v in summary(ORDERS).items() if k not in ("spec", "status")}
    one_ns = list_text({"namespace": "shop", "allNamespaces": False, "items": [brief]})
    assert one_ns.split("\n")[1].split() == ["orders", "distributed", "legacy", "3", "Always",
                                             "True", "Reconciled", "1", "-"]
    every = list_text({"namespace": None, "allNamespaces": True, "items": [brief]})
    assert every.split()[:2] == ["NAMESPACE", "NAME"]
    assert list_text({"namespace": "x", "allNamespaces": False, "items": []}) == \
        "No TimestampOracle in namespace x."
    assert condition(ORDERS, "Degraded") == {}


def test_names_come_from_the_fencing_module():
    # One list, any case, for the CLI and the plugin (`tsoracle fencing always` was refused).
    for mode in MODES:
        for typed in (mode, mode.lower(), mode.upper()):
            assert fencing_args("orders", typed) == ("orders", mode)
            assert fencing_args(typed, "orders") == ("orders", mode)
    assert fencing_args("ON", "orders") == ("orders", "Always")
    assert fencing_args("orders", "off") == ("orders", "Disabled")
    flip = next(a for a in build_parser()._subparsers._group_actions[0].choices["flip"]._actions
                if a.dest == "to")
    assert tuple(flip.choices) == IMPLEMENTATIONS
    with pytest.raises(PluginError, match=r"NAME Always\|Rollout\|Disabled \(on = Always"):
        fencing_args("orders", "sometimes")


# --- the redactor --------------------------------------------------------------------------

URL = "postgresql://app:s3cret%2Fpw@db.internal:5432/app"


def test_a_url_password_in_its_forms():
    assert set(password_forms(URL)) >= {"s3cret/pw", "s3cret%2Fpw"}
    assert password_forms("not a url") == []


def test_texts_are_replaced_longest_first_in_any_case():
    assert redact_texts("ABCDEF abc", ["abc", "abcdef"]) == f"{REDACTED} {REDACTED}"
    assert redact_texts("ab stays", ["ab"]) == "ab stays"  # too short to mask
    assert redact_texts("url=X", ["x"], "<backend>") == "url=X"
    assert redact_texts("token Tok-123", ["tok-123"], "<backend>") == "token <backend>"


def test_every_encoding_of_a_secret_value_is_found():
    forms = secret_texts([f" {URL}\n"])
    assert URL in forms and "s3cret/pw" in forms
    assert base64.b64encode(URL.encode()).decode() in forms
    assert forms == sorted(forms, key=len, reverse=True)


def test_the_report_keeps_addresses_the_operator_hides():
    text = f"connecting to {URL} on db.internal with s3cret/pw"
    for_report = redact_texts(text, secret_texts([URL]))
    assert for_report == f"connecting to {REDACTED} on db.internal with {REDACTED}"
    for_status = redact(text, URL)
    assert "db.internal" not in for_status and "s3cret" not in for_status


def test_a_secret_keeps_its_keys_only():
    kept = redacted_secret({"metadata": {"name": "db", "annotations": {"applied": URL}},
                            "data": {"url": "eA=="}, "type": "Opaque"})
    assert kept["data"] == {"url": REDACTED}
    assert kept["metadata"]["annotations"] == {"applied": REDACTED}
    assert URL not in json.dumps(kept)


def test_operator_pod_logs_are_named_by_namespace_and_pod():
    # No test cluster runs the operator in a pod, so the report's pod path is checked here.
    def log(name: str, namespace: str, tail_lines: int) -> str:
        if name == "op-2":
            raise ApiException(status=403, reason="Forbidden")
        return f"{namespace}/{name}: {tail_lines} lines"

    pods = [client.V1Pod(metadata=client.V1ObjectMeta(name=n, namespace="tso"))
            for n in ("op-1", "op-2")]
    core = SimpleNamespace(list_pod_for_all_namespaces=lambda label_selector: SimpleNamespace(
        items=pods), read_namespaced_pod_log=log)
    api = SimpleNamespace(core=core, plain=client.ApiClient().sanitize_for_serialization)
    assert _pod_logs(api) == {"operator-tso-op-1.log": "tso/op-1: 5000 lines",
                              "operator-tso-op-2.log": "(logs unavailable: Forbidden)"}


@pytest.mark.parametrize(("text", "said"), [
    ("apiVersion: v1\nusers: [{name: u, user: {token: s3cr3t-token}}\nclusters: [",
     "not valid YAML"),
    ("just a string with s3cr3t-token in it\n", "not a kubeconfig"),
    # kubernetes' own message quoted the nameless entry, token and all.
    ("apiVersion: v1\nusers: [{user: {token: s3cr3t-token}}, {user: {token: s3cr3t-2}}]\n",
     "Invalid kube-config file"),
])
def test_a_kubeconfig_that_is_not_one_is_one_line_quoting_none_of_it(tmp_path, text, said):
    """It escaped as yaml's ParserError or a TypeError traceback before."""
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(PluginError) as err:
        Api(str(path), None)
    assert str(err.value).startswith("no usable kubeconfig: ") and said in str(err.value)
    assert "s3cr3t" not in str(err.value)


# --- kubectl's connection flags, failures as one line, completion ---------------------------

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: a
clusters:
- {name: c1, cluster: {server: "https://127.0.0.1:1"}}
- {name: c2, cluster: {server: "https://127.0.0.1:2"}}
users:
- {name: u1, user: {token: tok-one}}
- {name: u2, user: {token: tok-two}}
contexts:
- {name: a, context: {cluster: c1, user: u1, namespace: from-a}}
- {name: b, context: {cluster: c2, user: u2}}
"""


@pytest.fixture
def two_contexts(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


@pytest.mark.parametrize(("flags", "server", "token", "namespace"), [
    ([], "https://127.0.0.1:1", "tok-one", "from-a"),
    (["--context", "b"], "https://127.0.0.1:2", "tok-two", "default"),
    (["--cluster", "c2"], "https://127.0.0.1:2", "tok-one", "from-a"),
    (["--user", "u2", "-n", "mine"], "https://127.0.0.1:1", "tok-two", "mine"),
    (["--context", "b", "--user", "u1", "--namespace", "x"], "https://127.0.0.1:2", "tok-one",
     "x"),
])
def test_connection_flags_choose_as_kubectl_does(two_contexts, flags, server, token,
                                                 namespace):
    from tsoracle.kubectl.connection import connection_of

    # Before the command or after it, as kubectl users write them.
    for argv in (["--kubeconfig", two_contexts, *flags, "status"],
                 ["status", "--kubeconfig", two_contexts, *flags]):
        api = Api(None, None, connection=connection_of(build_parser().parse_args(argv)))
        assert api.client.configuration.host == server
        assert api.client.configuration.api_key == {"BearerToken": f"Bearer {token}"}
        assert api.namespace == namespace


def test_a_flag_after_the_command_never_undoes_one_before_it(two_contexts):
    from tsoracle.kubectl.connection import connection_of

    args = build_parser().parse_args(["-n", "first", "--context", "b", "--kubeconfig",
                                      two_contexts, "status", "-o", "json"])
    assert connection_of(args).namespace == "first" and connection_of(args).context == "b"


@pytest.mark.parametrize(("flags", "said"), [
    (["--context", "nope"], "no context 'nope' in the kubeconfig (its contexts: a, b)"),
    (["--cluster", "nope"], "no cluster 'nope' in the kubeconfig (its clusters: c1, c2)"),
    (["--user", "nope"], "no user 'nope' in the kubeconfig (its users: u1, u2)"),
])
def test_an_unknown_context_cluster_or_user_names_the_ones_there(two_contexts, flags, said):
    from tsoracle.kubectl.connection import connection_of

    args = build_parser().parse_args(["--kubeconfig", two_contexts, *flags, "status"])
    with pytest.raises(PluginError, match=re.escape(said)):
        Api(None, None, connection=connection_of(args))


def test_the_first_kubeconfig_that_names_a_current_context_wins(tmp_path):
    """As kubectl merges $KUBECONFIG: the first file's current-context (the merger kept the
    last one's, so a flip could land in another namespace)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(KUBECONFIG)
    second.write_text(KUBECONFIG.replace("current-context: a", "current-context: b"))
    api = Api(None, None, connection=Connection(kubeconfig=f"{first}:{second}"))
    assert api.namespace == "from-a" and api.client.configuration.host == "https://127.0.0.1:1"


def test_a_relative_certificate_path_is_relative_to_its_kubeconfig(tmp_path, monkeypatch):
    home = tmp_path / "kube"
    home.mkdir()
    (home / "ca.crt").write_text("not checked until a request\n")
    (home / "config").write_text(KUBECONFIG.replace(
        '{server: "https://127.0.0.1:1"}',
        '{server: "https://127.0.0.1:1", certificate-authority: ca.crt}'))
    monkeypatch.chdir(tmp_path)  # anywhere but beside the file
    api = Api(str(home / "config"), None)
    assert Path(api.client.configuration.ssl_ca_cert).read_text() == \
        "not checked until a request\n"


@pytest.mark.parametrize("contexts", ['["a"]', "{a: 1}", "[{name: a, context: text}]"])
def test_a_kubeconfig_whose_entries_are_not_entries_is_one_line(tmp_path, contexts):
    path = tmp_path / "kubeconfig"
    path.write_text(f"current-context: a\ncontexts: {contexts}\n")
    with pytest.raises(PluginError, match="no usable kubeconfig"):
        Api(str(path), None)


def test_an_unreachable_api_server_is_one_line(two_contexts, capsys):
    """It was urllib3's MaxRetryError with a traceback. Nothing listens on port 1 here: the
    failure is the real one, no API server needed to show it."""
    from tsoracle.kubectl import main

    assert main(["status", "--kubeconfig", two_contexts]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "cannot reach the Kubernetes API server (connection refused)" in err
    assert "tok-one" not in err


def test_a_refusal_that_is_not_json_and_a_secret_that_is_not_base64_are_read_as_they_are():
    from tsoracle.kubectl.api import refusal
    from tsoracle.kubectl.report import _decoded

    html = ApiException(status=502, reason="Bad Gateway")
    html.body = "<html><body>upstream down</body></html>"
    assert refusal(html) == "Bad Gateway"
    status = ApiException(status=422, reason="Unprocessable Entity")
    status.body = json.dumps({"kind": "Status", "message": "spec.fencing: Unsupported value"})
    assert refusal(status) == "spec.fencing: Unsupported value"
    assert _decoded(base64.b64encode(b"postgresql://u:pw@h/db").decode()) == \
        "postgresql://u:pw@h/db"
    assert _decoded("not base64: a proxy's doing") == "not base64: a proxy's doing"


def test_a_failed_events_list_leaves_a_note_in_the_report(tmp_path, capsys):
    from tsoracle.kubectl.report import report

    def refused(*_: object, **__: object) -> None:
        raise ApiException(status=403, reason="Forbidden")

    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="db"),
                             data={"url": base64.b64encode(b"postgresql://x").decode()})
    core = SimpleNamespace(read_namespaced_secret=lambda name, ns: secret,
                           list_namespaced_event=refused, list_pod_for_all_namespaces=refused)
    api = SimpleNamespace(namespace="shop", core=core, get=lambda name: ORDERS,
                          plain=client.ApiClient().sanitize_for_serialization)
    out = tmp_path / "r.zip"
    assert report(api, "orders", str(out), [], "text") == 0
    import zipfile

    with zipfile.ZipFile(out) as z:
        assert z.read("events.txt").decode() == "Events could not be listed (403 Forbidden)\n"


def _offered(args: list[str]) -> tuple[list[str], int]:
    from tsoracle.kubectl.complete import candidates

    def names(flags: dict[str, str]) -> list[str]:
        return {"etl": ["orders", "other"]}.get(flags.get("--namespace") or "etl", [])

    def kubeconfig(flags: dict[str, str], kind: str) -> list[str]:
        return {"contexts": ["dev", "prod"], "clusters": ["c1"], "users": ["u1"]}[kind]

    return candidates(build_parser(), args, names=names, kubeconfig=kubeconfig)


@pytest.mark.parametrize(("args", "offered", "directive"), [
    ([""], ["status", "flip", "fencing", "report"], 4),
    (["fl"], ["flip"], 4),
    (["status", ""], ["orders", "other"], 4),
    (["status", "o"], ["orders", "other"], 4),
    (["-n", "etl", "flip", "ot"], ["other"], 4),
    (["status", "-n", "empty", ""], [], 4),
    (["status", "-nempty", ""], [], 4),  # attached, as kubectl takes it
    (["status", "--namespace=empty", ""], [], 4),
    (["-n", "empty", "status", "--namespace", "etl", ""], ["orders", "other"], 4),  # later wins
    (["fencing", "Always", ""], ["orders", "other"], 4),  # a mode first, then the name
    (["flip", "orders", "--to", ""], list(IMPLEMENTATIONS), 4),
    (["fencing", "orders", ""], [*MODES, "on", "off"], 4),
    (["fencing", "off", ""], ["orders", "other"], 4),
    (["status", "-o", "y"], ["yaml"], 4),
    (["--context", ""], ["dev", "prod"], 4),
    (["status", "--cluster", ""], ["c1"], 4),
    (["flip", "--t"], ["--timeout", "--to"], 4),
    (["report", "orders", "-f", ""], [], 0),  # a file: the shell completes it
    (["status", "orders", ""], [], 4),  # status takes one name
])
def test_completion_offers_commands_flags_values_and_names(args, offered, directive):
    assert _offered(args) == (offered, directive)


def test_completion_prints_cobras_format_and_never_a_traceback(two_contexts, capsys):
    from tsoracle.kubectl import main

    # Names need the API server, which is not there: nothing offered, no error shown.
    assert main(["__complete", "--kubeconfig", two_contexts, "status", ""]) == 0
    assert capsys.readouterr() == (":4\n", "")
    assert main(["__complete", "--kubeconfig", two_contexts, "--context", ""]) == 0
    assert capsys.readouterr().out == "a\nb\n:4\n"
