"""Linearizability under faults: real multi-process histories checked by Porcupine (Go).

Runs are sized by work: each scenario runs until MIN_OPS operations completed (the time cap only
catches a hang), so a slow or busy machine makes a run longer, never a failure.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import tsoracle
from tsoracle_dev.lincheck import runner
from tsoracle_dev.lincheck.broken import VARIANTS

CORPUS = Path(runner.HERE) / "corpus"
# Half of `make lincheck`'s 3,000: every nemesis step happens at any size (they are placed at
# fractions of the run), 1,500 operations leave at least 75 between two steps, and the planted
# bugs below are caught at this size. The suite's lincheck time halves (issue 33).
MIN_OPS = 1500
# A run lasts seconds (tens beside other work); one still running after this hangs, and its
# summary says where the workers wait (a stall costs this long, not the runner's ten minutes).
CAP_S = 240.0
# Tiers: the checker is a Go program, built (a minute or more) on first use, so the tests that
# run it are `slow`; live runs start their own PostgreSQL and last seconds to minutes.


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(runner.checker_binary()), *args], capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_checker_flags_the_regression_corpus(variant, tmp_path):
    html = tmp_path / "violation.html"
    files = sorted((CORPUS / variant).glob("*.jsonl.gz"))
    assert files
    proc = check("-html", str(html), *map(str, files))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a violation, not a timeout
    assert '"verdict":"violation"' in proc.stdout
    assert html.stat().st_size > 1000  # porcupine's visualization was written


def _history(path: Path, run: str, proc: int, t0: int) -> Path:
    lines = [{"k": "run", "run": run, "proc": proc},
             {"k": "call", "id": f"{proc}-1", "client": proc, "timeline": "counter:a",
              "op": "write", "t": t0},
             {"k": "ret", "id": f"{proc}-1", "ok": True, "value": 5, "t": t0 + 10}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.slow
def test_checker_refuses_histories_of_two_runs(tmp_path):
    # The same write timestamp in two runs is no violation; checked together it would be one.
    a = _history(tmp_path / "worker-0.jsonl", "run-a", 0, 1_000)
    b = _history(tmp_path / "worker-4.jsonl", "run-b", 4, 9_000)
    proc = check(str(a), str(b))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "different runs" in proc.stderr
    assert check(str(a)).returncode == 0


@pytest.mark.slow
def test_checker_refuses_clock_readings_outside_the_run(tmp_path):
    a = _history(tmp_path / "worker-0.jsonl", "run-a", 0, 1_000)
    assert check("-window", "500,2000", str(a)).returncode == 0
    proc = check("-window", "5000,9000", str(a))
    assert proc.returncode == 3
    assert "outside the run" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("value", "verdict"), [(3, 0), (7, 1)])
def test_a_stale_read_may_lag_but_never_pass_the_read_frontier(value, verdict, tmp_path):
    # fencing-modes records a legacy leader's reads under Disabled as stale-read: apply(5)
    # finished before it started, so 3 is an allowed stale answer, 7 is a read of the future.
    ops = [("apply", 5, None, 0), ("stale-read", None, value, 100)]
    lines: list[dict[str, object]] = [{"k": "run", "run": "r", "proc": 0}]
    for i, (op, arg, result, t) in enumerate(ops):
        call: dict[str, object] = {"k": "call", "id": f"0-{i}", "client": i,
                                   "timeline": "counter:a", "op": op, "t": 1_000 + t}
        if arg is not None:
            call["arg"] = arg
        lines += [call, {"k": "ret", "id": f"0-{i}", "ok": True, "value": result or 0,
                         "t": 1_010 + t}]
    path = tmp_path / "worker-0.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert check(str(path)).returncode == verdict


@pytest.mark.slow
def test_checker_refuses_a_history_without_its_run(tmp_path):
    plain = tmp_path / "old.jsonl.gz"
    data = gzip.decompress(next((CORPUS / "reuse-after-restart").glob("*.gz")).read_bytes())
    plain.write_bytes(gzip.compress(data.split(b"\n", 1)[1]))  # drop the run line
    proc = check(str(plain))
    assert proc.returncode == 3
    assert "does not start with a run line" in proc.stderr


def test_a_run_needs_an_empty_folder_of_its_own(tmp_path):
    (tmp_path / "worker-4.jsonl").write_text("left over from an earlier run\n")
    with pytest.raises(ValueError, match="not empty"):
        runner.run("none", "distributed", out=tmp_path, min_ops=10)


def test_sqlite_takes_only_its_scenarios(tmp_path):
    with pytest.raises(ValueError, match="PostgreSQL only"):
        runner.run("partition", "distributed", out=tmp_path, min_ops=10, backend="sqlite")
    with pytest.raises(ValueError, match="leave out url"):
        runner.run("cancelled-transactions", "distributed", out=tmp_path, min_ops=10,
                   backend="sqlite", url="postgresql://h/d")


RUNS_TO_CATCH = 4
TAKEOVERS = 12


@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_broken_oracles_are_caught_live(variant, tmp_path, pg):
    impl, scenario = {"read-past-unapplied": ("distributed", "none"),
                      "resume-at-the-clock": ("legacy", "clock-jump-forward")
                      }.get(variant, ("legacy", "takeovers"))
    if scenario == "takeovers":
        # A take-over bug shows only when a take-over meets the old leader with timestamps out
        # (for reuse-after-restart: handed out, not applied), so the run is sized by
        # take-overs, each after the old leader served TAKEOVER_SPACING operations: however
        # slow or busy the machine, every take-over is a chance. A correct oracle never shows
        # a violation (test_scenario_is_linearizable runs this scenario on both).
        out = tmp_path / "run"
        summary = runner.run(scenario, impl, out=out, broken=variant, clients=2,
                             min_ops=runner.TAKEOVER_SPACING, takeovers=TAKEOVERS, server=pg,
                             cap_s=CAP_S)
        assert sum(f["fault"] == "took over" for f in summary["faults"]) == TAKEOVERS, summary
    else:
        # One fault each (a read beside an unapplied write; a take-over after a clock jump):
        # up to RUNS_TO_CATCH runs.
        for attempt in range(RUNS_TO_CATCH):
            out = tmp_path / f"run-{attempt}"
            summary = runner.run(scenario, impl, out=out, broken=variant, clients=2,
                                 min_ops=1500, server=pg, cap_s=CAP_S)
            if summary["porcupine"] == "violation":
                break
    assert summary["porcupine"] == "violation", summary
    assert (out / "violation.html").exists()


@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "implementation", "isolation"), [
    # The partition nemesis picks a free subnet by looking: two at once could pick the same.
    pytest.param(*combo, marks=pytest.mark.xdist_group("netns")) if combo[0] == "partition"
    else combo for combo in runner.combos()])
def test_scenario_is_linearizable(scenario, implementation, isolation, tmp_path, pg):
    # The worker's PostgreSQL, a schema per run (runner.OWN_SERVER scenarios start their own).
    summary = runner.run(scenario, implementation, out=tmp_path, min_ops=MIN_OPS,
                         isolation=isolation, cap_s=CAP_S, server=pg)
    _check_run(scenario, implementation, summary, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "implementation"), runner.sqlite_combos())
def test_scenario_is_linearizable_on_sqlite(scenario, implementation, tmp_path):
    # A SQLite file in the run's folder; no server (SQLite's transactions are serializable).
    summary = runner.run(scenario, implementation, out=tmp_path, min_ops=MIN_OPS, cap_s=CAP_S,
                         backend="sqlite")
    assert summary["backend"] == "sqlite"
    _check_run(scenario, implementation, summary, tmp_path)


def _check_run(scenario: str, implementation: str, summary: dict[str, Any],
               out: Path) -> None:
    runner.print_summary(summary)
    assert summary["stalled"] is None, summary
    assert summary["nemesis_errors"] == [], summary
    assert summary["porcupine"] == "linearizable", summary
    assert summary["invariant_violations"] == [], summary
    assert summary["ops_checked"] >= MIN_OPS, summary
    if scenario != "none":
        assert summary["faults"], "the nemesis injected nothing"
    if implementation == "legacy" and scenario in ("client-kill", "pause", "partition",
                                                   "takeovers", *runner.CLOCK_SCENARIOS):
        assert any(f["fault"] == "legacy take-over" for f in summary["faults"]), summary
    kinds = [f["fault"] for f in summary["faults"]]
    if scenario == "fencing-modes":
        assert kinds.count("reads recorded strictly again") == 2, summary
    if scenario == "reprovision":
        assert kinds.count("deployment provisioned again") == 2, summary
    if scenario == "partition":
        # Calls worker 0 had in flight or made while cut off (iptables DROP in its network
        # namespace) ended within the bound its settings give (an invariant in run()).
        cut = summary["partitioned_calls"]
        assert cut["calls"] > 0 and cut["failed"] > 0 and cut["unfinished"] == 0, cut
    if scenario in ("serialization-faults", "lost-replies"):
        # CockroachDB's failure shape at 5 % and 30 %: retried (and counted), never seen.
        reason = "serialization_failure" if scenario == "serialization-faults" else "connection"
        assert summary["client_errors"] == 0, summary
        assert summary["retries"].get(reason, 0) > 0, summary
        if scenario == "lost-replies":
            assert summary["replies_lost"] > 0, summary
    if scenario == "spark-client":
        # The driver client reopens across every flip and no caller sees an error.
        stats = json.loads((out / "worker-0.log").read_text().splitlines()[-1])
        assert stats["ok"] > 0 and stats["failed"] == 0 and stats["reopens"] >= 5, stats
    if scenario in ("clock-jump-forward", "clock-jump-back"):
        _check_clock_jump(scenario, summary["clock"])
    if scenario == "cancelled-transactions":
        _check_cancellations(implementation, summary, out)
    assert summary["verdict"] == "pass"


def _check_cancellations(implementation: str, summary: dict[str, Any], out: Path) -> None:
    """Transactions were cancelled at every point (before their lock while another process
    held it, in the body, at COMMIT), calls at random points, and nobody saw an error; then
    another process opened every timeline and took timestamps above everything handed out
    (Porcupine checked them with the rest: after-close.jsonl)."""
    counts, enough = summary["cancellations"], runner.CANCELS_PER_POINT
    assert counts["begin"] + counts["lock"] >= enough, summary
    assert counts["body"] >= enough and counts["commit"] >= enough, summary
    assert summary["holds"] > 0 and summary["cancelled_calls"] > 0, summary
    assert summary["client_errors"] == 0, summary
    lines = [json.loads(raw) for raw in (out / "after-close.jsonl").read_text().splitlines()]
    served = {line["id"] for line in lines if line["k"] == "ret" and line["ok"]}
    writes = {line["timeline"] for line in lines if line["k"] == "call"
              and line["op"] == "write" and line["id"] in served}
    assert writes == {*runner.TIMELINES, runner.CANCEL_TIMELINE}, lines


def _check_clock_jump(scenario: str, clock: dict[str, Any]) -> None:
    """ClockSkew where docs/design.md says: a write is refused when the timeline is more than
    max_clock_skew_ms ahead of the clock of the process asking (never on counting timelines,
    and no write returned beyond that: invariant_violations), and counted by the metric.
    Uniqueness and monotonicity across the jumps are Porcupine's and the invariants' part."""
    before, jumped, back = (clock["phases"][i] for i in (0, 1, -1))
    assert [p["offset_ms"] for p in clock["phases"]] == [
        0, runner.CLOCK_JUMP_MS * (1 if scenario == "clock-jump-forward" else -1), 0], clock
    refused = sum(sum(p["refused"].values()) for p in clock["phases"])
    assert clock["counted"]["write_ts"] == refused, clock
    # A refused apply_write is counted too (it was not, before its check moved inside).
    applies = sum(p["apply_refused"] for p in clock["phases"])
    assert clock["counted"]["apply_write"] == applies, clock
    if scenario == "clock-jump-back":
        # Clocks 10 min behind the timeline refuse to write; the others never do, and
        # writing resumes once the clock is back.
        assert sum(before["refused"].values()) == 0, clock
        assert jumped["refused"]["shifted"] > 0 and jumped["writes"]["shifted"] == 0, clock
        assert jumped["refused"]["true"] == 0 and jumped["writes"]["true"] > 0, clock
        assert back["refused"]["true"] == 0 and sum(back["writes"].values()) > 0, clock
    else:
        # The jumped clocks drag the timeline 10 min ahead: they write, true clocks are
        # refused, and after the jump back everyone is, until the real time catches up
        # (writes resuming below what the jump handed out would break monotonicity).
        assert jumped["writes"]["shifted"] > 0 and jumped["refused"]["true"] > 0, clock
        assert jumped["highest_write"] > before["highest_write"] + runner.CLOCK_JUMP_MS // 2
        assert sum(back["refused"].values()) > 0, clock
        assert back["highest_write"] is None or back["highest_write"] > jumped["highest_write"]


# What reads wall time, in Python and in SQL (the server's clock), besides the `now` an oracle
# is opened with.
_CLOCK_CALLS = {"time", "time_ns", "now", "utcnow", "today"}
_SQL_CLOCK = re.compile(r"\bnow\s*\(|'now'|\b(current_(timestamp|date|time)|localtime(stamp)?)\b"
                        r"|\b(clock|statement|transaction)_timestamp\s*\(|\btimeofday\s*\("
                        r"|\b(julianday|unixepoch|strftime)\s*\(", re.IGNORECASE)
_SQL = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE)\b")  # statements, not prose


def test_the_oracle_reads_the_wall_clock_only_through_now():
    # The clock scenarios shift the `now` each oracle is opened with: that covers every wall
    # time the oracle acts on only if nothing reads another clock (the server's included).
    package = Path(tsoracle.__file__).parent
    found, where = [], []
    for floor in ("store", "fencing", "oracle"):
        for path in sorted((package / floor).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in _CLOCK_CALLS \
                        and isinstance(node.value, ast.Name) \
                        and node.value.id in ("time", "datetime", "date", "dt"):
                    found.append(f"{path.relative_to(package)} {node.value.id}.{node.attr}")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and _SQL_CLOCK.search(node.value) and _SQL.search(node.value):
                    found.append(f"{path.relative_to(package)} SQL")
                else:
                    continue
                where.append(f"{path.relative_to(package)}:{node.lineno}")
    # The one reading: api.wall_clock_ms, the default `now`.
    assert found == ["oracle/api.py time.time_ns"], where


def offline_nemesis(tmp_path: Path, scenario: str, implementation: str, *, min_ops: int,
                    cap_s: float) -> runner.Nemesis:
    """A nemesis reading histories in `tmp_path`, with no workers or database behind it."""
    control = runner.Control(tmp_path / "control.json")
    control.write(implementation=implementation, leader=0)
    return runner.Nemesis(scenario, implementation, min_ops=min_ops, cap_s=cap_s,
                          url="postgresql://h/d?schema=s", out=tmp_path, pg=None,
                          control=control, procs={}, spawn=None, processes=4, run_id="r")


def test_a_take_over_quicker_than_the_nemesis_is_seen(tmp_path):
    """Regression: took_over() looked for the new leader's take-over only from its own call on,
    so one that landed between lead() and took_over() (the nemesis paused by a busy machine)
    was never seen and the run stalled at its cap (a CI run: 600 s, then a failed check)."""
    nemesis = offline_nemesis(tmp_path, "takeovers", "legacy", min_ops=1, cap_s=2.0)
    nemesis.lead(1)
    rec = runner.Recorder(tmp_path / "worker-1.jsonl", 1, "r")  # worker 1 takes over at once
    op = rec.call(100, runner.EPOCH_MILLISECONDS, "reset")
    rec.ret(op, True, 42)
    nemesis.took_over(1)  # raised Stalled after the cap before the fix
    assert [f["fault"] for f in nemesis.faults] == ["legacy take-over", "took over"]


def test_the_partition_waits_until_worker_0_serves(tmp_path):
    """Regression: the partition cut worker 0 off at 30 % of the run's operations, which the
    other workers once did alone while worker 0 still connected through its namespace (a CI
    run: no call of worker 0's in the window, a failed check). It now waits for worker 0's
    own operations, counted per worker."""
    nemesis = offline_nemesis(tmp_path, "partition", "distributed", min_ops=10, cap_s=1.0)
    busy = runner.Recorder(tmp_path / "worker-1.jsonl", 1, "r")
    for _ in range(50):
        busy.ret(busy.call(0, runner.EPOCH_MILLISECONDS, "read"), True, 1)
    nemesis.at(0.3)  # the run's share is done: worker 1 alone did it
    with pytest.raises(runner.Stalled, match="worker 0 served 0 operations"):
        nemesis.serving(0)
    late = runner.Recorder(tmp_path / "worker-0.jsonl", 0, "r")
    for _ in range(runner.SERVING_OPS):
        late.ret(late.call(0, runner.EPOCH_MILLISECONDS, "read"), True, 1)
    nemesis.deadline = time.monotonic() + 60
    nemesis.serving(0)  # returns once worker 0 has served its share
    assert nemesis.progress.of(0) == runner.SERVING_OPS and nemesis.progress.of(1) == 50


def test_a_take_over_by_a_worker_still_starting_is_waited_for(tmp_path):
    """Regression: worker 0 alone served the first take-over's spacing while worker 1 was still
    importing (a CI-like parallel run), and waiting for worker 1's take-over read its history
    before the file existed: a nemesis error, no take-over, a planted bug not caught."""
    nemesis = offline_nemesis(tmp_path, "takeovers", "legacy", min_ops=10, cap_s=0.3)
    nemesis.lead(1)
    with pytest.raises(runner.Stalled, match="worker 1 never took"):
        nemesis.took_over(1)  # no history yet: waited for until the cap, not an error
    started = runner.Recorder(tmp_path / "worker-1.jsonl", 1, "r")
    started.ret(started.call(0, runner.EPOCH_MILLISECONDS, "reset"), True, 7)
    nemesis.deadline = time.monotonic() + 60  # a regression fails here, it does not hang
    nemesis.took_over(1)
    assert [f["fault"] for f in nemesis.faults][-1] == "took over"
