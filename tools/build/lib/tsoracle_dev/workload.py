"""A history-recording workload: C concurrent callers in one process, sized by work done.

Run as a script so tests can start several OS processes (`Workload` below does that):
    python -m tsoracle_dev.workload URL OUT --concurrency 32 [--min-ops N] [--stop-file F]
        [--progress-file F] [--implementation X]
It stops when it has N operations or when the stop file appears; `--cap` seconds only ends a
hang. On Fenced (a flip happened) it reopens on the active implementation and goes on
(oracle/reopening.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tsoracle
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle_dev.lincheck.history import Op

CAP_S = 300.0  # seconds; only a hang reaches it


class Recorder:
    def __init__(self, url: str, timeline: str, implementation: str | None, name: str) -> None:
        self.url = url
        self.timeline = timeline
        self.implementation = implementation
        self.name = name
        self.ops: list[Op] = []
        self.errors = 0
        self.error_messages: list[str] = []  # the first few, for a failing test to show
        self.gave_up = 0  # calls that stayed fenced through every reopening
        self.oracle = ReopeningOracle(
            lambda: tsoracle.open_oracle(url, timeline=timeline, implementation=implementation),
            name=timeline, take_over=True)  # two recorders may share a legacy timeline
        self.capped = False

    @property
    def fenced(self) -> int:
        """How often a flip or take-over fenced this recorder's oracle (each time reopened)."""
        return self.oracle.reopens + self.gave_up

    async def caller(self, done: Callable[[], bool], seed: int) -> None:
        rng = random.Random(seed)
        oracle = self.oracle
        while not done():
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
                self.gave_up += 1  # the implementation asked for is not active: wait for it
                await asyncio.sleep(0.01)
            except tsoracle.OracleUnavailable as exc:
                self.errors += 1
                if len(self.error_messages) < 5:
                    self.error_messages.append(f"{type(exc).__name__}: {exc}")

    async def run(self, concurrency: int, *, min_ops: int | None = None,
                  stop: Callable[[], bool] | None = None, cap: float = CAP_S) -> None:
        """Run until `min_ops` operations are recorded or `stop()` is true; `cap` seconds is
        only for a hang (then `capped` is set and the test fails on it)."""
        deadline = time.monotonic() + cap

        def done() -> bool:
            if min_ops is not None and len(self.ops) >= min_ops:
                return True
            if stop is not None and stop():
                return True
            if time.monotonic() > deadline:
                self.capped = True
                return True
            return False

        await asyncio.gather(*[self.caller(done, i) for i in range(concurrency)])
        await self.oracle.close()


def write_history(ops: list[Op], out: Path) -> None:
    with open(out, "w") as f:
        for op in ops:
            f.write(json.dumps(asdict(op)) + "\n")


class Workload:
    """The script above as a separate OS process, steered through files."""

    def __init__(self, url: str, out: Path, *, concurrency: int, timeline: str,
                 implementation: str | None = None, min_ops: int | None = None) -> None:
        self.out = out
        self.stop_file = out.with_suffix(".stop")
        self.progress_file = out.with_suffix(".progress")
        self.log = out.with_suffix(".log")
        argv = [sys.executable, "-m", "tsoracle_dev.workload", url, str(out),
                "--concurrency", str(concurrency), "--timeline", timeline,
                "--stop-file", str(self.stop_file), "--progress-file", str(self.progress_file)]
        if implementation:
            argv += ["--implementation", implementation]
        if min_ops is not None:
            argv += ["--min-ops", str(min_ops)]
        with open(self.log, "wb") as log:  # a pipe nobody reads could fill and stall it
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def ops(self) -> int:
        try:
            return int(self.progress_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def wait_for_ops(self, n: int, cap: float = CAP_S) -> None:
        """Block until the process has recorded `n` operations (fails on exit or a hang)."""
        deadline = time.monotonic() + cap
        while self.ops() < n:
            if self.proc.poll() is not None:
                raise AssertionError(f"workload exited early: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"workload stuck at {self.ops()} of {n} operations")
            time.sleep(0.02)

    def finish(self) -> dict[str, Any]:
        """Ask it to stop; returns its summary (ops, fenced, errors, capped)."""
        self.stop_file.touch()
        return self.wait()

    def wait(self) -> dict[str, Any]:
        returncode = self.proc.wait(timeout=CAP_S)
        text = self.log.read_text()
        assert returncode == 0, text[-3000:]
        summary: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
        assert not summary["capped"], "the workload hit its time cap: a hang"
        return summary


async def _report_progress(rec: Recorder, path: Path) -> None:
    while True:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(len(rec.ops)))
        os.replace(tmp, path)
        await asyncio.sleep(0.02)


async def _main(a: argparse.Namespace) -> Recorder:
    rec = Recorder(a.url, a.timeline, a.implementation, f"pid{os.getpid()}")
    reporter = None
    if a.progress_file:
        reporter = asyncio.get_running_loop().create_task(_report_progress(rec, a.progress_file))
    stop = (lambda: a.stop_file.exists()) if a.stop_file else None
    await rec.run(a.concurrency, min_ops=a.min_ops, stop=stop, cap=a.cap)
    if reporter is not None:
        reporter.cancel()
    return rec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--min-ops", type=int)
    p.add_argument("--stop-file", type=Path)
    p.add_argument("--progress-file", type=Path)
    p.add_argument("--cap", type=float, default=CAP_S)
    p.add_argument("--timeline", default="counter:history")
    p.add_argument("--implementation", default=None)
    a = p.parse_args()
    if a.min_ops is None and a.stop_file is None:
        p.error("give --min-ops or --stop-file: the run is sized by work, not time")
    rec = asyncio.run(_main(a))
    write_history(rec.ops, a.out)
    print(json.dumps({"ops": len(rec.ops), "fenced": rec.fenced, "errors": rec.errors,
                      "capped": rec.capped}))


if __name__ == "__main__":
    main()
