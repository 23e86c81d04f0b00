"""The `tsoracle` command as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time

import pytest

import tsoracle

# Starts tsoracle's own processes or HTTP servers: the full suite's, not `make test-fast`'s.
pytestmark = pytest.mark.served


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
    assert r.returncode == 1 and "--take-leadership" in r.stderr
    assert "tsoracle ts read --stored" in r.stderr
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


def test_errors_speak_flags_not_keyword_arguments(tmp_path):
    # Before the fix: "open with implementation='distributed' or None", "(--initial-ts,
    # initial_ts)", "raise max_clock_skew_ms", "(2**64 - 1)".
    url = f"sqlite:///{tmp_path / 'w.db'}"
    ahead = time.time_ns() // 1_000_000 + 10**9  # 11 days ahead of the wall clock
    assert tso("init", "--initial-ts", str(ahead), url=url).returncode == 0
    assert tso("init", "--timeline", "counter:end", "--initial-ts", str(2**64 - 1),
               url=url).returncode == 0
    expected = {
        ("ts", "write", "--implementation", "legacy", "--take-leadership"):
            "not 'legacy'; use --implementation distributed, or omit --implementation to "
            "follow the active implementation",
        ("init", "--initial-ts", "-1"): "the initial timestamp (--initial-ts) must be",
        ("ts", "write"): "check the clocks of the writers, or raise --max-clock-skew-ms",
        ("ts", "write", "--timeline", "counter:end"):
            "reached the largest timestamp (18446744073709551615)",
        ("ts", "apply", str(2**64)): "is not an integer in [0, 18446744073709551615]",
    }
    for args, wording in expected.items():
        r = tso(*args, url=url)
        assert r.returncode == 1, (args, r.stdout)
        assert wording in r.stderr, (args, r.stderr)
        assert not re.search(r"\w='|=None|\*\*|read_only|_ms\b", r.stderr), r.stderr
    # The flag it names works.
    r = tso("ts", "write", "--max-clock-skew-ms", str(2 * 10**9), url=url)
    assert r.returncode == 0 and int(r.stdout) >= ahead


async def test_library_errors_keep_python_wording_and_carry_the_cli_one(url):
    await tsoracle.init(url, timelines=["counter:c"])
    with pytest.raises(tsoracle.Fenced) as err:
        await tsoracle.open_oracle(url, timeline="counter:c", implementation="legacy")
    assert "use implementation='distributed', or implementation=None" in str(err.value)
    assert "use --implementation distributed, or omit --implementation" in err.value.for_cli()
    with pytest.raises(tsoracle.ConfigError) as err:
        await tsoracle.open_oracle(url, timeline="counter:c", implementation="legacy",
                                   read_only=True)
    assert "implementation='distributed'" in str(err.value)
    assert "--implementation distributed" in err.value.for_cli()
    async with tsoracle.connect(url, timeline="counter:c") as oracle:
        await tsoracle.flip(url, to="legacy")
        with pytest.raises(tsoracle.Fenced) as err:
            await oracle.write_ts()
    assert str(err.value).endswith("reopen it with implementation='legacy'")
    assert err.value.for_cli().endswith("reopen it with --implementation legacy")


def test_no_error_message_in_the_package_spells_keyword_syntax():
    # An error that names an argument goes through errors.Arg, which words it for each
    # audience; a literal `name='value'`, `name=None` or `2**64` would reach `tsoracle` users.
    import ast
    from pathlib import Path

    package = Path(tsoracle.__file__).parent
    error_names = {n for n in dir(tsoracle.errors) if isinstance(getattr(tsoracle.errors, n), type)
                   and issubclass(getattr(tsoracle.errors, n), Exception)}
    bad = re.compile(r"\b[a-z_]+=(\{|'|None\b|True\b|False\b)|\*\*")
    found = []
    for path in package.rglob("*.py"):
        if "operator" in path.parts:
            continue  # its messages go to Kubernetes (status, Events), not to the command line
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in error_names and name != "worded":
                continue
            for arg in node.args[:1]:
                text = "".join(part.value for part in ast.walk(arg)
                               if isinstance(part, ast.Constant) and isinstance(part.value, str))
                if bad.search(text):
                    found.append(f"{path.name}:{node.lineno}: {text}")
    assert found == []


def test_help_shows_every_default_and_never_the_url_it_holds(tmp_path):
    from tsoracle.cli import build_parser

    env = {**os.environ, "TSORACLE_URL": "postgresql://app:pw-in-env-xyz@db.internal/app"}
    parser = build_parser()
    commands: list[tuple[list[str], argparse.ArgumentParser]] = []
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        if sub._subparsers is None:
            commands.append(([name], sub))
        else:  # `tsoracle catalog serve`: the actions of a command group
            commands += [([name, action], p) for action, p in
                         sub._subparsers._group_actions[0].choices.items()]
    for argv, sub in commands:
        name = " ".join(argv)
        out = subprocess.run([sys.executable, "-m", "tsoracle.cli", *argv, "--help"],
                             capture_output=True, text=True, env=env, timeout=60).stdout
        flat = " ".join(out.split())
        assert "pw-in-env-xyz" not in out and "db.internal" not in out
        if name not in ("demo", "operator"):
            assert "backend URL (default: $TSORACLE_URL or sqlite:///tsoracle.db)" in flat
        for action in sub._actions:
            if (action.option_strings and action.default is not None
                    and action.default is not False and action.dest != "help"):
                shown = (",".join(map(str, action.default)) if isinstance(action.default, list)
                         else str(action.default))
                assert f"(default: {shown})" in flat or "default:" in (action.help or ""), \
                    (name, action.dest, flat)
    # The variable still decides the URL when --url is not given.
    db = tmp_path / "env.db"
    r = subprocess.run([sys.executable, "-m", "tsoracle.cli", "init"], capture_output=True,
                       text=True, env={**os.environ, "TSORACLE_URL": f"sqlite:///{db}"},
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and db.exists()


def test_output_formats(tmp_path):
    import yaml

    url = f"sqlite:///{tmp_path / 'o.db'}"
    init = yaml.safe_load(tso("init", "-o", "yaml", url=url).stdout)
    assert init["deployment"]["implementation"] == "distributed"
    assert init["created"] == ["EpochMilliseconds"]
    as_json = json.loads(tso("status", "-o", "json", url=url).stdout)
    assert as_json == json.loads(tso("status", "--json", url=url).stdout)
    assert yaml.safe_load(tso("status", "-o", "yaml", url=url).stdout) == as_json
    w = json.loads(tso("ts", "write", "-o", "json", url=url).stdout)
    assert w["operation"] == "write" and w["timestamp"] > 0 and w["stored"] is False
    flipped = yaml.safe_load(tso("flip", "--to", "legacy", "-o", "yaml", url=url).stdout)
    assert flipped["epoch"] == 2 and flipped["changed"] is True
    fenced = json.loads(tso("fencing", "Rollout", "-o", "json", url=url).stdout)
    assert fenced["deployment"]["fence"] == "Rollout"
    assert "fencing is now Rollout" in tso("fencing", "Rollout", url=url).stdout


async def test_stored_values_of_a_legacy_deployment_leave_its_leader_alone(url):
    # Before: `ts read` on legacy refused, and its suggestion --take-leadership fenced the
    # running leader. --stored reads the backend's row as `status` does.
    await tsoracle.init(url, timelines=["counter:c"], implementation="legacy")
    async with tsoracle.connect(url, timeline="counter:c", implementation="legacy") as leader:
        w = await leader.write_ts()
        await leader.apply_write(w.timestamp)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return tso("ts", *args, "--timeline", "counter:c", url=url)

        read = await asyncio.to_thread(cli, "read", "--stored")
        assert read.returncode == 0, read.stderr
        assert int(read.stdout) == w.timestamp
        assert "stored read_ts of legacy timeline counter:c" in read.stderr
        peek = json.loads((await asyncio.to_thread(cli, "peek", "--stored", "-o", "json")).stdout)
        assert peek["stored"] is True and peek["timestamp"] >= w.timestamp
        assert peek["implementation"] == "legacy"
        # The leader is still the leader: its next operations confirm against the storage.
        await leader.confirm_leadership()
        assert await leader.read_ts() == w.timestamp
        assert (await leader.write_ts()).timestamp > w.timestamp
        # What --stored avoids: a one-shot command that takes over fences the leader.
        taken = await asyncio.to_thread(cli, "read", "--take-leadership")
        assert taken.returncode == 0, taken.stderr
        with pytest.raises(tsoracle.errors.LeadershipLost):
            await leader.confirm_leadership()


def test_bench_reports_progress_on_stderr_and_names_its_columns(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    r = tso("bench", "--duration", "1", "--concurrency", "1,2", url=url)
    assert r.returncode == 0, r.stderr
    progress = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert [p.split(",")[0] for p in progress] == ["[1/2", "[2/2"]
    assert re.match(r"\[1/2, \d+\.\d s\] read distributed batched, 1 client: ", progress[0])
    assert "ops/s" in progress[0] and "ceiling=" not in r.stdout and "q/op=" not in r.stdout
    header = r.stdout.splitlines()[1].split()
    assert header[:5] == ["MODE", "IMPLEMENTATION", "READ_TS", "CLIENTS", "OPS/S"]
    assert "SHARE_OF_NO_IO_LIMIT" in r.stdout
    for column in ("QUERIES/OP", "CALLERS/BATCH", "NO_IO_LIMIT_OPS/S"):  # explained below
        assert column in header and f"\n{column}: " in r.stdout, column
    quiet = tso("bench", "--duration", "1", "--concurrency", "1,2", "--json", url=url)
    report = json.loads(quiet.stdout)  # stdout is only the JSON; progress went to stderr
    assert "[2/2" in quiet.stderr
    assert {"asyncio_ceiling_ops_per_s"} <= set(report["results"][0]["extra"])
    assert "share_of_asyncio_ceiling" in report["summary"]["read/distributed/c1"]


def test_the_papercuts_a_newcomer_met(url):
    """Issue 28, item 5: each of these printed something unhelpful before."""
    assert tso("init", url=url).returncode == 0
    # A bad flag is told with the command's own usage, not the top-level one.
    bad = tso("status", "--bogus", url=url)
    assert bad.returncode == 2 and "usage: tsoracle status" in bad.stderr
    assert "unrecognized arguments: --bogus" in bad.stderr
    # Modes in any case, and on/off as the plugin takes them; what Disabled gives up is said.
    for typed, mode in (("always", "Always"), ("ROLLOUT", "Rollout"), ("off", "Disabled")):
        done = tso("fencing", typed, url=url)
        assert done.returncode == 0 and f"fencing is now {mode}" in done.stdout, done.stderr
    assert "stale reads" in tso("fencing", "disabled", url=url).stderr
    assert "stale reads" not in tso("fencing", "always", url=url).stderr
    init_off = tso("init", "--fencing", "off", url=url)  # init sets a mode too, and says so
    assert init_off.returncode == 0 and "fencing Disabled" in init_off.stdout, init_off.stderr
    assert "stale reads" in init_off.stderr
    refused = tso("fencing", "sometimes", url=url)
    assert refused.returncode == 2 and "Always, Rollout, Disabled" in refused.stderr
    # Status names the database (password masked) and a rollout state that matches the mode.
    assert tso("fencing", "rollout", url=url).returncode == 0
    text = tso("status", url=url).stdout
    assert "rollout: no window open (the next flip opens one)" in text
    assert "schema: " in text and "database: " in text
    assert "tsoracle-test-pw" not in text
    # finish-rollout with no window open says so instead of "rollout finished".
    nothing = tso("finish-rollout", url=url)
    assert nothing.returncode == 0 and "no rollout window is open" in nothing.stdout
    assert tso("flip", "--to", "legacy", url=url).returncode == 0
    assert "rollout: window open" in tso("status", url=url).stdout
    assert "rollout finished" in tso("finish-rollout", url=url).stdout
