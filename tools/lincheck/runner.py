"""Linearizability runs: a multi-process workload under a nemesis, checked by Porcupine.

    python tools/lincheck/runner.py run --scenario flips --implementation legacy --duration 8
    python tools/lincheck/runner.py all --duration 8          # every scenario, both implementations
    python tools/lincheck/runner.py soak --duration 600       # long; not for CI

Workers are separate OS processes with many asyncio clients each. Every operation is recorded
as a "call" line (flushed before the operation starts, so SIGKILL cannot hide it) and a "ret"
line, on CLOCK_MONOTONIC, which all processes of one host share. Legacy leader take-overs are
recorded as `reset` operations and flips as `flip` operations, because both legitimately move
read_ts. The histories go to the Go checker (tools/lincheck, Porcupine) and to the fast Python
invariant checks in history.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(HERE.parent), str(HERE)]

from history import Op, check  # noqa: E402
from localpg import LocalPostgres, free_port  # noqa: E402

import tsoracle  # noqa: E402

SCENARIOS = ("none", "postgres", "client-kill", "pause", "flips", "clock", "partition")
TIMELINES = ("EpochMilliseconds", "counter:lin", "counter:lin2")
CACHE = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))


# --- the worker process --------------------------------------------------------------------

class Recorder:
    def __init__(self, path: Path, proc: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.proc = proc
        self.seq = 0

    def call(self, client: int, timeline: str, op: str, arg: int | None = None) -> str:
        self.seq += 1
        op_id = f"{self.proc}-{self.seq}"
        rec: dict[str, Any] = {"k": "call", "id": op_id, "client": client,
                               "timeline": timeline, "op": op, "t": time.monotonic_ns()}
        if arg is not None:
            rec["arg"] = arg
        os.write(self.fd, (json.dumps(rec) + "\n").encode())
        return op_id

    def ret(self, op_id: str, ok: bool, value: int | None = None) -> None:
        rec: dict[str, Any] = {"k": "ret", "id": op_id, "ok": ok, "t": time.monotonic_ns()}
        if value is not None:
            rec["value"] = value
        os.write(self.fd, (json.dumps(rec) + "\n").encode())


class Clock:
    """Wall-clock milliseconds plus an offset that follows a plan of (seconds, offset_ms)."""

    def __init__(self, plan: list[tuple[float, int]]) -> None:
        self.start = time.monotonic()
        self.plan = sorted(plan)

    def __call__(self) -> int:
        elapsed = time.monotonic() - self.start
        offset = 0
        for at, off in self.plan:
            if elapsed >= at:
                offset = off
        return time.time_ns() // 1_000_000 + offset


async def proxy(listen_port: int, target: tuple[str, int], flag: Path) -> None:
    """A TCP relay that drops every connection while `flag` exists (a partition)."""
    live: set[asyncio.StreamWriter] = set()

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if flag.exists():
            w.close()
            return
        try:
            ur, uw = await asyncio.open_connection(*target)
        except OSError:
            w.close()
            return
        live.update((w, uw))
        await asyncio.gather(pipe(r, uw), pipe(ur, w))
        live.difference_update((w, uw))

    async def cutter() -> None:
        while True:
            if flag.exists():
                for w in list(live):
                    w.transport.abort()
                live.clear()
            await asyncio.sleep(0.05)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    asyncio.get_running_loop().create_task(cutter())
    await server.start_serving()


async def worker(args: argparse.Namespace) -> None:
    url = args.url
    if args.partition_flag:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        port = free_port()
        await proxy(port, (parts.hostname or "127.0.0.1", parts.port or 5432),
                    Path(args.partition_flag))
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        url = urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2
                                        else host))
    extra: dict[str, Any] = {}
    if args.broken:
        from broken import install

        extra = install(args.broken)
    rec = Recorder(Path(args.out), args.proc)
    clock = Clock(json.loads(args.clock_plan) if args.clock_plan else [])
    oracles: dict[str, tsoracle.TimestampOracle] = {}
    locks = {tl: asyncio.Lock() for tl in TIMELINES}
    deadline = time.monotonic() + args.duration
    stats = {"ok": 0, "failed": 0}

    async def get(tl: str, client: int) -> tsoracle.TimestampOracle:
        async with locks[tl]:
            if tl not in oracles:
                op = rec.call(client, tl, "reset")
                try:
                    o = await tsoracle.open_oracle(url, timeline=tl, implementation=None,
                                                   now=clock, **extra)
                except tsoracle.OracleError:
                    rec.ret(op, False)
                    raise
                if o.implementation == "legacy":
                    rec.ret(op, True, o.resumed_at)  # type: ignore[attr-defined]
                else:
                    rec.ret(op, False)  # opening a distributed oracle changes no state
                oracles[tl] = o
            return oracles[tl]

    async def drop(tl: str, o: tsoracle.TimestampOracle) -> None:
        async with locks[tl]:
            if oracles.get(tl) is o:
                del oracles[tl]
                await o.close()

    async def client(cid: int) -> None:
        rng = random.Random(cid)
        while time.monotonic() < deadline:
            tl = rng.choice(TIMELINES)
            try:
                o = await get(tl, cid)
            except tsoracle.OracleError:
                await asyncio.sleep(0.05 + rng.random() * 0.2)
                continue
            roll = rng.random()
            op_name = "write" if roll < 0.4 else "peek" if roll < 0.5 else "read"
            op = rec.call(cid, tl, op_name)
            try:
                if op_name == "write":
                    w = (await o.write_ts()).timestamp
                    rec.ret(op, True, w)
                    if rng.random() < 0.7:
                        await asyncio.sleep(rng.random() * 0.002)
                        op = rec.call(cid, tl, "apply", w)
                        await o.apply_write(w)
                        rec.ret(op, True, 0)
                elif op_name == "peek":
                    rec.ret(op, True, await o.peek_write_ts())
                else:
                    rec.ret(op, True, await o.read_ts())
                stats["ok"] += 1
            except tsoracle.Fenced:
                rec.ret(op, False)
                stats["failed"] += 1
                await drop(tl, o)
                await asyncio.sleep(0.3 + rng.random() * 0.7)  # let the new leader serve a while
            except tsoracle.OracleError:
                rec.ret(op, False)
                stats["failed"] += 1
                await asyncio.sleep(0.01)

    await asyncio.gather(*[client(args.proc * 100 + i) for i in range(args.clients)])
    for o in list(oracles.values()):
        await o.close()
    print(json.dumps(stats), flush=True)


# --- the orchestrator ----------------------------------------------------------------------

def checker_binary() -> Path:
    out = CACHE / "lincheck"
    sources = sorted(HERE.glob("*.go")) + [HERE / "go.mod", HERE / "go.sum"]
    if not out.exists() or out.stat().st_mtime < max(p.stat().st_mtime for p in sources):
        CACHE.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        subprocess.run(["go", "build", "-o", str(out), "."], cwd=HERE, env=env, check=True)
    return out


def porcupine(paths: list[Path], html: Path, timeout_s: int = 300) -> dict[str, Any]:
    proc = subprocess.run([str(checker_binary()), "-timeout", f"{timeout_s}s", "-html",
                           str(html), *map(str, paths)], capture_output=True, text=True)
    if proc.returncode == 3:
        raise RuntimeError(f"lincheck could not read the histories: {proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["exit"] = proc.returncode
    return result


def invariants(paths: list[Path]) -> tuple[list[str], int]:
    """Fast checks on completed operations; resets and flips count as applies."""
    calls: dict[str, dict[str, Any]] = {}
    rets: dict[str, dict[str, Any]] = {}
    for p in paths:
        for raw in p.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            (calls if rec["k"] == "call" else rets)[rec["id"]] = rec
    by_tl: dict[str, list[Op]] = {}
    for op_id, c in calls.items():
        r = rets.get(op_id)
        if r is None or not r["ok"]:
            continue
        kind = {"write": "write", "read": "read", "peek": None, "apply": "apply",
                "reset": "apply", "flip": "apply"}[c["op"]]
        if kind is None:
            continue
        value = c["arg"] if c["op"] == "apply" else r["value"]
        by_tl.setdefault(c["timeline"], []).append(
            Op(kind, c["t"], r["t"], int(value), str(c["client"])))
    problems: list[str] = []
    total = 0
    for tl, ops in by_tl.items():
        total += len(ops)
        problems += [f"{tl}: {p}" for p in check(ops)]
    return problems, total


def run(scenario: str, implementation: str, *, duration: float, out: Path, url: str | None = None,
        processes: int = 4, clients: int = 4, min_ops: int = 2000,
        broken: str | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    pg = None
    if url is None:
        pg = LocalPostgres(out / "pg")
        url = pg.start()
    url = f"{url}?schema=lin_{scenario.replace('-', '_')}_{implementation}_{os.getpid()}"
    asyncio.run(tsoracle.init(url, timelines=list(TIMELINES), implementation=implementation))
    flag = out / "partitioned"
    faults: list[dict[str, Any]] = []
    procs: dict[int, subprocess.Popen[str]] = {}
    history = [out / f"worker-{i}.jsonl" for i in range(processes)]

    def spawn(i: int, **extra: str) -> None:
        path = out / f"worker-{i}.jsonl"
        if path not in history:
            history.append(path)
        argv = [sys.executable, str(Path(__file__)), "worker", "--url", url, "--out", str(path),
                "--proc", str(i), "--clients", str(clients), "--duration", str(duration)]
        for key, value in extra.items():
            argv += [f"--{key.replace('_', '-')}", value]
        procs[i] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)

    for p in [*history, out / "flips.jsonl"]:
        p.unlink(missing_ok=True)
    clock_plan = json.dumps([[duration * 0.3, -120_000], [duration * 0.55, 30_000],
                             [duration * 0.8, 0]])
    for i in range(processes):
        extra = {}
        if scenario == "partition" and i == 0:
            extra["partition_flag"] = str(flag)
        if scenario == "clock" and i % 2 == 0:
            extra["clock_plan"] = clock_plan
        if broken:
            extra["broken"] = broken
        spawn(i, **extra)
    started = time.monotonic_ns()
    first_fault = [0]

    def fault(kind: str, **info: Any) -> None:
        now = time.monotonic_ns()
        if not first_fault[0]:
            first_fault[0] = now
        faults.append({"fault": kind, "at_s": round((now - started) / 1e9, 2), **info})

    nemesis_errors: list[str] = []

    def guarded() -> None:
        try:
            _nemesis(scenario, duration, url, pg, procs, flag, fault, spawn, out, processes)
        except Exception as exc:  # reported in the verdict: a fault that was not injected
            nemesis_errors.append(f"{type(exc).__name__}: {exc}")

    nemesis = threading.Thread(target=guarded)
    nemesis.start()
    nemesis.join()
    for p in list(procs.values()):
        try:
            p.wait(timeout=duration + 90)
        except subprocess.TimeoutExpired:
            p.kill()
    ended = time.monotonic_ns()
    if pg is not None:
        pg.destroy()
    paths = [p for p in [*history, out / "flips.jsonl"] if p.exists()]
    problems, completed = invariants(paths)
    checked = porcupine(paths, out / "violation.html")
    cutoff = first_fault[0] or ended
    before = 0
    for p in paths:
        for raw in p.read_text().splitlines():
            if '"k": "ret"' in raw and '"ok": true' in raw:
                try:
                    if json.loads(raw)["t"] < cutoff:
                        before += 1
                except json.JSONDecodeError:
                    pass
    seconds_before = max(1e-3, (cutoff - started) / 1e9)
    enough = checked["ops"] >= min_ops
    verdict = "pass" if (checked["exit"] == 0 and not problems and enough
                         and not nemesis_errors) else "FAIL"
    summary = {
        "scenario": scenario, "implementation": implementation, "processes": processes,
        "clients_per_process": clients, "ops_checked": checked["ops"],
        "completed_ops": completed, "faults": faults,
        "throughput_before_faults_ops_s": round(before / seconds_before),
        "porcupine": checked["verdict"], "porcupine_seconds": round(checked["seconds"], 2),
        "invariant_violations": problems[:5], "enough_traffic": enough,
        "nemesis_errors": nemesis_errors, "verdict": verdict,
    }
    if checked["exit"] == 1:
        summary["visualization"] = str(out / "violation.html")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _nemesis(scenario: str, duration: float, url: str, pg: LocalPostgres | None,
             procs: dict[int, subprocess.Popen[str]], flag: Path, fault: Any, spawn: Any,
             out: Path, processes: int) -> None:
    def at(fraction: float) -> None:
        time.sleep(max(0.0, fraction * duration - (time.monotonic() - t0)))

    t0 = time.monotonic()
    if scenario == "postgres":
        assert pg is not None, "the postgres scenario needs the runner's own server"
        at(0.25)
        for _ in range(4):
            pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                   " WHERE usename = 'tsoracle'")
            fault("pg_terminate_backend")
            time.sleep(0.3)
        at(0.5)
        fault("postgres SIGKILL")
        pid = pg.crash_and_restart(down_seconds=1.0)
        fault("postgres restarted after crash recovery", killed_pid=pid)
    elif scenario == "client-kill":
        for n, frac in enumerate((0.3, 0.6)):
            at(frac)
            victim = procs[n]
            victim.send_signal(signal.SIGKILL)
            fault("client SIGKILL", process=n)
            spawn(processes + n)
    elif scenario == "pause":
        at(0.3)
        procs[1].send_signal(signal.SIGSTOP)
        fault("SIGSTOP", process=1)
        time.sleep(3.0)  # longer than a legacy window (1 s): others take over meanwhile
        procs[1].send_signal(signal.SIGCONT)
        fault("SIGCONT", process=1)
    elif scenario == "flips":
        hist = out / "flips.jsonl"
        rec = Recorder(hist, 99)
        first = asyncio.run(tsoracle.status(url)).deployment.implementation
        other = "legacy" if first == "distributed" else "distributed"
        for frac, target in zip((0.2, 0.35, 0.5, 0.65, 0.8),
                                (other, first, other, first, other), strict=True):
            at(frac)
            ids = {tl: rec.call(9999, tl, "flip") for tl in TIMELINES}
            result = asyncio.run(tsoracle.flip(url, to=target))
            for tl, op in ids.items():
                rec.ret(op, True, result.bootstrap[tl])
            fault("flip", to=target, epoch=result.epoch)
    elif scenario == "clock":
        at(0.3)
        fault("clock -120 s on even workers")
        at(0.55)
        fault("clock +30 s on even workers")
        at(0.8)
        fault("clock back to true time")
    elif scenario == "partition":
        at(0.3)
        flag.touch()
        fault("partition worker 0 from PostgreSQL (connection drops)")
        time.sleep(2.5)
        flag.unlink()
        fault("partition healed")


def print_summary(s: dict[str, Any]) -> None:
    print(f"[{s['verdict']}] {s['scenario']:<12} {s['implementation']:<11} "
          f"ops checked {s['ops_checked']:>6}  throughput before faults "
          f"{s['throughput_before_faults_ops_s']:>5}/s  faults {len(s['faults'])}  "
          f"porcupine {s['porcupine']} ({s['porcupine_seconds']} s)  invariants "
          f"{'ok' if not s['invariant_violations'] else s['invariant_violations']}", flush=True)
    for f in s["faults"]:
        print(f"      {f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--proc", type=int, required=True)
    w.add_argument("--clients", type=int, default=8)
    w.add_argument("--duration", type=float, default=8)
    w.add_argument("--partition-flag")
    w.add_argument("--clock-plan")
    w.add_argument("--broken", help="run a deliberately broken oracle (checker self-test)")
    for name in ("run", "all", "soak"):
        r = sub.add_parser(name)
        r.add_argument("--duration", type=float, default=8 if name != "soak" else 600)
        r.add_argument("--out", default=str(ROOT / ".lincheck"))
        r.add_argument("--min-ops", type=int, default=2000)
        r.add_argument("--processes", type=int, default=4)
        r.add_argument("--clients", type=int, default=4)
        if name == "run":
            r.add_argument("--scenario", choices=SCENARIOS, required=True)
            r.add_argument("--implementation", choices=("distributed", "legacy"),
                           required=True)
    a = p.parse_args()
    if a.cmd == "worker":
        asyncio.run(worker(a))
        return 0
    combos = ([(a.scenario, a.implementation)] if a.cmd == "run" else
              [(s, i) for s in SCENARIOS for i in ("distributed", "legacy")])
    failed = 0
    for scenario, impl in combos:
        s = run(scenario, impl, duration=a.duration, out=Path(a.out) / f"{scenario}-{impl}",
                processes=a.processes, clients=a.clients, min_ops=a.min_ops)
        print_summary(s)
        failed += s["verdict"] != "pass"
    print(f"{len(combos) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
