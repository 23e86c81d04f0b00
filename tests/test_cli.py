"""The `tsoracle` command as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def tso(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tsoracle.cli", *args]
    if url is not None:
        cmd += ["--url", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_init_ts_status_flip(url):
    assert tso("init", "--timeline", "EpochMilliseconds", "--timeline", "counter:c",
               url=url).returncode == 0
    w = tso("ts", "write", "--timeline", "counter:c", url=url)
    assert w.returncode == 0 and w.stdout.strip() == "1"
    assert tso("ts", "apply", "1", "--timeline", "counter:c", url=url).stdout.strip() == "1"
    assert tso("ts", "read", "--timeline", "counter:c", url=url).stdout.strip() == "1"
    assert tso("ts", "peek", "--timeline", "counter:c", url=url).stdout.strip() == "1"
    st = json.loads(tso("status", "--json", url=url).stdout)
    assert st["deployment"]["implementation"] == "distributed"
    by_name = {t["timeline"]: t for t in st["timelines"]}
    assert by_name["counter:c"]["read_ts"] == 1 and by_name["counter:c"]["lag_ms"] is None
    # Before the first apply there is no lag to show (it used to say 56 years).
    assert by_name["EpochMilliseconds"]["lag_ms"] is None
    w = tso("ts", "write", "--timeline", "EpochMilliseconds", url=url).stdout.strip()
    assert tso("ts", "apply", w, "--timeline", "EpochMilliseconds", url=url).returncode == 0
    st = json.loads(tso("status", "--json", url=url).stdout)
    lag = {t["timeline"]: t for t in st["timelines"]}["EpochMilliseconds"]["lag_ms"]
    assert lag is not None and lag >= 0
    table = tso("status", url=url).stdout
    assert "counter:c" in table and "epoch: 1" in table
    f = json.loads(tso("flip", "--to", "legacy", "--json", url=url).stdout)
    assert f["epoch"] == 2 and f["bootstrap"]["counter:c"] >= 1
    again = tso("flip", "--to", "legacy", url=url)
    assert again.returncode == 0 and "already on legacy" in again.stdout
    assert tso("fencing", "Rollout", url=url).returncode == 0
    assert json.loads(tso("status", "--json", url=url).stdout)["deployment"]["fence"] == "Rollout"


@pytest.mark.parametrize("args, needle", [
    (["status", "--url", "mysql://h/db"], "unsupported URL scheme"),
    (["status", "--url", "postgresql://u:pw-secret@127.0.0.1:1/db"], "cannot connect"),
    (["ts", "read", "--timeline", "bogus"], "unknown timeline"),
    (["ts", "apply"], "needs the timestamp"),
    (["init", "--initial-ts", "-1"], "must be an integer in [0, 18446744073709551615], got -1"),
    (["init", "--initial-ts", "18446744073709551616"], "must be an integer in [0, "),
    (["ts", "apply", "10000000000000"], "apply only timestamps that write_ts handed out"),
])
def test_errors_are_one_line_without_traceback(args, needle, tmp_path):
    if "--url" not in args:
        tso("init", url=f"sqlite:///{tmp_path / 'x.db'}")
        args = [*args, "--url", f"sqlite:///{tmp_path / 'x.db'}"]
    r = tso(*args)
    assert r.returncode == 1
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "pw-secret" not in r.stderr


def test_unprovisioned_and_unknown_timeline(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    r = tso("status", url=url)
    assert r.returncode == 1 and "tsoracle init" in r.stderr
    tso("init", url=url)
    r = tso("ts", "read", "--timeline", "counter:nope", url=url)
    assert r.returncode == 1 and "counter:nope" in r.stderr and "Traceback" not in r.stderr


def test_one_shot_legacy_command_needs_consent(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    tso("init", "--implementation", "legacy", url=url)
    r = tso("ts", "write", url=url)
    assert r.returncode == 1 and "--take-leadership" in r.stderr
    r = tso("ts", "write", "--take-leadership", url=url)
    assert r.returncode == 0 and int(r.stdout) > 0


def test_reading_a_legacy_timeline(tmp_path):
    # Before the fix, the suggested --take-leadership then failed with "cannot be read-only".
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tso("init", "--implementation", "legacy", url=url)
    written = int(tso("ts", "write", "--take-leadership", url=url).stdout)
    r = tso("ts", "read", url=url)
    assert r.returncode == 1 and "--take-leadership" in r.stderr and "tsoracle status" in r.stderr
    for op in ("read", "peek"):
        r = tso("ts", op, "--take-leadership", url=url)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) >= (written if op == "peek" else 0)


def test_bench_never_touches_another_schema(tmp_path):
    # Before the fix, a bench on ?schema=prod_orders flipped that legacy deployment to
    # distributed at epoch 2 and added timeline counter:bench.
    base = f"sqlite:///{tmp_path / 'p.db'}"
    prod = f"{base}?schema=prod_orders"
    tso("init", "--implementation", "legacy", url=prod)
    r = tso("bench", "--duration", "0.2", "--concurrency", "1", url=prod)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "its own schema 'tsoracle_bench'" in r.stderr and "prod_orders" in r.stderr
    after = json.loads(tso("status", "--json", url=prod).stdout)
    assert after["deployment"]["implementation"] == "legacy"
    assert after["deployment"]["epoch"] == 1
    assert [t["timeline"] for t in after["timelines"]] == ["EpochMilliseconds"]
    r = tso("bench", "--duration", "0.2", "--concurrency", "1", url=base)
    assert r.returncode == 0, r.stderr  # its own schema, next to prod_orders in the same file


def test_version_names_the_installed_release():
    import importlib.metadata

    out = tso("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"tsoracle {importlib.metadata.version('tsoracle')}"
