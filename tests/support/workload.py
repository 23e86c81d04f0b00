"""A history-recording workload: C concurrent callers in one process, for a fixed time.

Run as a script so tests can start several OS processes:
    python tests/support/workload.py URL OUT --seconds 3 --concurrency 32 [--implementation X]
On Fenced (a flip happened) it reopens on the active implementation and goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tools" / "lincheck"))

from history import Op  # noqa: E402

import tsoracle  # noqa: E402


class Recorder:
    def __init__(self, url: str, timeline: str, implementation: str | None, name: str) -> None:
        self.url = url
        self.timeline = timeline
        self.implementation = implementation
        self.name = name
        self.ops: list[Op] = []
        self.fenced = 0
        self.errors = 0
        self.oracle: tsoracle.TimestampOracle | None = None
        self._reopen = asyncio.Lock()
        self._stale: list[tsoracle.TimestampOracle] = []

    async def current(self) -> tsoracle.TimestampOracle:
        if self.oracle is None:
            async with self._reopen:
                if self.oracle is None:
                    self.oracle = await tsoracle.open_oracle(
                        self.url, timeline=self.timeline, implementation=self.implementation)
        return self.oracle

    async def fenced_out(self, stale: tsoracle.TimestampOracle) -> None:
        self.fenced += 1
        async with self._reopen:
            if self.oracle is stale:
                self.oracle = None
                self._stale.append(stale)  # callers may still hold it; close at the end

    async def caller(self, deadline: float, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                oracle = await self.current()
            except tsoracle.Fenced:
                await asyncio.sleep(0.01)  # a flip is mid-way; try again
                continue
            try:
                roll = rng.random()
                start = time.monotonic_ns()
                if roll < 0.45:
                    w = await oracle.write_ts()
                    end = time.monotonic_ns()
                    applied_at = None
                    if rng.random() < 0.7:
                        await asyncio.sleep(rng.random() * 0.002)
                        applied_at = time.monotonic_ns()
                        await oracle.apply_write(w.timestamp)
                        self.ops.append(Op("apply", applied_at, time.monotonic_ns(),
                                           w.timestamp, self.name))
                    self.ops.append(Op("write", start, end, w.timestamp, self.name, applied_at))
                else:
                    r = await oracle.read_ts()
                    self.ops.append(Op("read", start, time.monotonic_ns(), r, self.name))
            except tsoracle.Fenced:
                await self.fenced_out(oracle)
            except tsoracle.OracleUnavailable:
                self.errors += 1

    async def run(self, seconds: float, concurrency: int) -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*[self.caller(deadline, i) for i in range(concurrency)])
        for oracle in [*self._stale, self.oracle]:
            if oracle is not None:
                await oracle.close()


def write_history(ops: list[Op], out: Path) -> None:
    with open(out, "w") as f:
        for op in ops:
            f.write(json.dumps(asdict(op)) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--timeline", default="counter:history")
    p.add_argument("--implementation", default=None)
    a = p.parse_args()
    rec = Recorder(a.url, a.timeline, a.implementation, f"pid{os.getpid()}")
    asyncio.run(rec.run(a.seconds, a.concurrency))
    write_history(rec.ops, a.out)
    print(json.dumps({"ops": len(rec.ops), "fenced": rec.fenced, "errors": rec.errors}))


if __name__ == "__main__":
    main()
