"""Histories from several OS processes (and from one legacy leader), checked for the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

import tsoracle
from tsoracle_dev.lincheck.history import Op, check, load
from tsoracle_dev.workload import Recorder, Workload

pytestmark = pytest.mark.serializable  # CockroachDB's isolation too (conftest.py)

TIMELINE = "counter:history"


def run_workers(url: str, tmp: Path, n: int, ops_each: int, concurrency: int) -> list[Op]:
    workers = [Workload(url, tmp / f"history-{i}.jsonl", concurrency=concurrency,
                        timeline=TIMELINE, min_ops=ops_each) for i in range(n)]
    for w in workers:
        assert w.wait()["errors"] == 0
    return load(w.out for w in workers)


async def test_four_processes_share_a_distributed_timeline(url, tmp_path):
    await tsoracle.init(url, timelines=[TIMELINE])
    ops = run_workers(url, tmp_path, n=4, ops_each=300, concurrency=32)
    assert len({o.proc for o in ops}) == 4
    assert len(ops) >= 4 * 300
    assert sum(o.kind == "write" for o in ops) > 200
    assert sum(o.kind == "read" for o in ops) > 200
    assert check(ops) == []


async def test_legacy_leader_history_with_many_callers(url, tmp_path):
    await tsoracle.init(url, timelines=[TIMELINE], implementation="legacy")
    rec = Recorder(url, TIMELINE, "legacy", "leader")
    await rec.run(64, min_ops=600)
    assert not rec.capped
    assert rec.fenced == 0
    assert len(rec.ops) >= 600
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
