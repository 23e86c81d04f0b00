"""Histories from several OS processes (and from one legacy leader), checked for the contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from history import Op, check, load
from support.workload import Recorder

import tsoracle

WORKLOAD = Path(__file__).parent / "support" / "workload.py"
TIMELINE = "counter:history"


def run_workers(url: str, tmp: Path, n: int, seconds: float, concurrency: int) -> list[Op]:
    procs = []
    for i in range(n):
        out = tmp / f"history-{i}.jsonl"
        procs.append((out, subprocess.Popen(
            [sys.executable, str(WORKLOAD), url, str(out), "--seconds", str(seconds),
             "--concurrency", str(concurrency), "--timeline", TIMELINE],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for _, p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["errors"] == 0
    return load(out for out, _ in procs)


async def test_four_processes_share_a_distributed_timeline(url, tmp_path):
    await tsoracle.init(url, timelines=[TIMELINE])
    ops = run_workers(url, tmp_path, n=4, seconds=3, concurrency=32)
    assert len({o.proc for o in ops}) == 4
    assert sum(o.kind == "write" for o in ops) > 200
    assert sum(o.kind == "read" for o in ops) > 200
    assert check(ops) == []


async def test_legacy_leader_history_with_many_callers(url, tmp_path):
    await tsoracle.init(url, timelines=[TIMELINE], implementation="legacy")
    rec = Recorder(url, TIMELINE, "legacy", "leader")
    await rec.run(seconds=2, concurrency=64)
    assert rec.fenced == 0
    assert len(rec.ops) > 500
    assert check(rec.ops) == []


def test_checker_finds_planted_violations():
    ok = [Op("write", 0, 10, 5), Op("apply", 11, 12, 5), Op("read", 13, 14, 5)]
    assert check(ok) == []
    dup = ok + [Op("write", 20, 30, 5)]
    assert any("twice" in p for p in check(dup))
    stale = ok + [Op("read", 20, 21, 4)]
    assert any("below apply_write" in p for p in check(stale))
    behind = ok + [Op("write", 20, 21, 3)]
    assert any("not above" in p for p in check(behind))
    passed = [Op("write", 0, 10, 7, applied_at=50), Op("read", 20, 30, 7)]
    assert any("passed unapplied" in p for p in check(passed))
