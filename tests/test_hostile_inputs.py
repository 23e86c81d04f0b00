"""Hostile passwords, hosts and names through every surface that prints.

Before the fix: `postgresql://app:s3cr/et@db:5432/app` printed "Port could not be cast to
integer value as 's3cr'"; `postgresql://app:1234/Secret@127.0.0.1:5432/db` printed the whole
password in "cannot connect to …"; an upper-case host stayed in the operator's status.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest

import tsoracle
from tsoracle.operator.redact import redact
from tsoracle.store import parse_url
from tsoracle_dev.kube import Operator, condition

# Starts tsoracle's own processes or HTTP servers: the full suite's, not `make test-fast`'s.
pytestmark = pytest.mark.served

PASSWORDS = ["s3cr/et", "1234/Secret", "pa#ss-word", "wh?at=now", "p@ss:w0rd", "100%sure",
             "Sp ace'quote", "UPPERlowerMix"]
HOST = "DB-Prod.Corp.Example"
CLOSED_PORT = 1  # nothing listens there


def forms(secret: str) -> list[str]:
    return [secret, quote(secret, safe=""), secret.lower(), secret.upper()]


def assert_clean(text: str, *secrets: str) -> None:
    low = text.lower()
    for secret in secrets:
        for form in forms(secret):
            assert form.lower() not in low, f"{form!r} leaked in: {text}"


def tso(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tsoracle.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("password", [p for p in PASSWORDS if any(c in p for c in "/#@%")])
def test_unencoded_special_characters_are_refused_without_echo(password):
    url = f"postgresql://app:{password}@127.0.0.1:5432/app"
    r = tso("status", "--url", url)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "percent-encode" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for fragment in [password, *password.replace("%", "/").split("/"), *password.split("?"),
                     *password.split("#"), *password.split("@")]:
        if len(fragment) >= 3:
            assert fragment not in r.stderr, (fragment, r.stderr)


@pytest.mark.parametrize("password", PASSWORDS)
async def test_encoded_and_key_value_forms_never_leak(password):
    encoded = f"postgresql://app:{quote(password, safe='')}@127.0.0.1:{CLOSED_PORT}/app"
    key_value = (f"host=127.0.0.1 port={CLOSED_PORT} dbname=app user=app "
                 f"password='{password.replace(chr(39), chr(92) + chr(39))}'")
    for url in (encoded, key_value):
        parsed = parse_url(url)
        assert parsed.password == password
        assert_clean(parsed.safe + repr(parsed), password)
        with pytest.raises(tsoracle.OracleUnavailable, match="cannot connect") as err:
            await tsoracle.status(url)
        assert_clean(str(err.value), password)
        r = tso("status", "--url", url)
        assert r.returncode == 1 and "cannot connect" in r.stderr
        assert_clean(r.stderr, password)


async def test_hostile_passwords_really_connect(pg):
    password = "p@ss/w#rd?100% it's"
    pg.sql(f"CREATE ROLE hostile LOGIN PASSWORD '{password.replace(chr(39), chr(39) * 2)}'",
           "postgres")
    pg.sql("GRANT CREATE ON DATABASE tsoracle TO hostile", "postgres")
    encoded = f"postgresql://hostile:{quote(password, safe='')}@127.0.0.1:{pg.port}/tsoracle"
    await tsoracle.init(encoded + "?schema=hostile_a")
    key_value = (f"host=127.0.0.1 port={pg.port} dbname=tsoracle user=hostile "
                 f"password='{password.replace(chr(39), chr(92) + chr(39))}' schema=hostile_b")
    await tsoracle.init(key_value)
    status = await tsoracle.status(key_value)
    assert status.deployment.epoch == 1
    async with tsoracle.connect(key_value) as oracle:
        assert (await oracle.write_ts()).timestamp > 0


def test_redaction_is_case_insensitive_and_survives_unparseable_urls():
    url = f"postgresql://app:{quote('Se/cret', safe='')}@{HOST}:5432/app"
    text = f"could not translate host name \"{HOST.lower()}\" ({HOST.upper()}) Se/cret"
    out = redact(text, url)
    assert_clean(out, HOST, "Se/cret")
    broken = f"postgresql://app:Se/cret@{HOST}:5432/app"  # does not parse
    assert_clean(redact(f"{broken} / {HOST.lower()} / Se/cret", broken), HOST, "Se/cret")


def test_operator_and_plugin_never_show_password_or_host(kube, chart, tmp_path):
    password = "Hunter2/Zebra#Q"
    ns = kube.new_namespace("hostile")
    url = f"postgresql://app:{quote(password, safe='')}@{HOST}:5432/app"
    kube.backend_secret(ns, "db", url)
    op = Operator(chart.kubeconfig, ns, tmp_path / "op.log").start()
    try:
        doc = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
               "metadata": {"name": "h"},
               "spec": {"backend": {"urlSecretRef": {"name": "db"}}}}
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(doc))
        obj = kube.wait_tso(ns, "h", lambda o: condition(o, "Degraded").get("status") == "True",
                            timeout=120, what="Degraded for an unreachable host")
        broken = f"postgresql://app:{password}@{HOST}:5432/app"  # unencoded: does not parse
        patch = {"data": {"url": base64.b64encode(broken.encode()).decode()}}
        kube.kubectl("-n", ns, "patch", "secret", "db", "-p", json.dumps(patch))
        obj = kube.wait_tso(ns, "h", lambda o: condition(o, "Degraded").get("reason")
                            == "BadURL", timeout=120, what="Degraded/BadURL")
        report = tmp_path / "report.zip"
        plugin = subprocess.run(
            [sys.executable, "-c", "import sys; from tsoracle.cli import kubectl_main; "
             "sys.exit(kubectl_main())", "report", "h", "-n", ns, "-f", str(report),
             "--operator-log", str(op.log)],
            capture_output=True, text=True, timeout=180,
            env={**os.environ, **kube.env()})
        assert plugin.returncode == 0, plugin.stderr
        with zipfile.ZipFile(io.BytesIO(report.read_bytes())) as z:
            reported = "".join(z.read(n).decode() for n in z.namelist())
        everything = (json.dumps(obj) + json.dumps(kube.events(ns)) + op.log.read_text()
                      + reported + plugin.stdout + plugin.stderr)
        assert_clean(everything, password, HOST)
    finally:
        op.stop()
        Path(tmp_path / "op.log").unlink(missing_ok=True)


HOSTILE_TIMELINES = ["counter:'; DROP TABLE timestamps; --", 'counter:"quoted" \\ back',
                     "user:ünï 😀 %(epoch)s {deployment}", "external:" + "x" * 246]
REFUSED_TIMELINES = ["counter:line\nbreak", "counter:" + "x" * 300, "counter:", "Counter:x",
                     "epochmilliseconds"]
REFUSED_SCHEMAS = ['x"; DROP SCHEMA public; --', "a" * 64, "ünï", "1abc", "has space",
                   "dash-ed"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_hostile_names_through_the_cli(backend, pg, tmp_path):
    # Names that look like SQL, quoting or format strings are stored and printed verbatim;
    # names the oracle refuses get one line naming the flag, never a traceback.
    base = (f"sqlite:///{tmp_path / 'o.db'}" if backend == "sqlite"
            else f"{pg.url()}")
    url = base + "?schema=hostile_names_" + tmp_path.name[-8:].lower().replace("-", "_")
    args = [a for t in HOSTILE_TIMELINES for a in ("--timeline", t)]
    r = tso("init", "--url", url, *args)
    assert r.returncode == 0, r.stderr
    for t in HOSTILE_TIMELINES:
        r = tso("ts", "write", "--url", url, "--timeline", t)
        assert r.returncode == 0 and r.stdout.strip().isdigit(), (t, r.stdout, r.stderr)
    status = tso("status", "--url", url).stdout
    for t in HOSTILE_TIMELINES:
        assert t in status, (t, status)
    for t in REFUSED_TIMELINES:
        r = tso("ts", "write", "--url", url, "--timeline", t)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (t, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "timeline" in r.stderr
    for schema in REFUSED_SCHEMAS:
        r = tso("init", "--url", f"{base}?schema={quote(schema, safe='')}")
        assert r.returncode != 0 and "Traceback" not in r.stderr, (schema, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "schema" in r.stderr, r.stderr
