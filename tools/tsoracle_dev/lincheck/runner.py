"""Linearizability runs: a multi-process workload under a nemesis, checked by Porcupine.

    tsoracle-lincheck run --scenario flips --implementation legacy --min-ops 3000
    tsoracle-lincheck run --scenario cancelled-transactions --implementation legacy --backend sqlite
    tsoracle-lincheck all --min-ops 3000     # every scenario, both implementations
    tsoracle-lincheck soak --min-ops 100000  # long; not for CI
    (or: python -m tsoracle_dev.lincheck.runner ...)

A run is sized by work, not time: workers run until the history holds `--min-ops` completed
operations, and the nemesis injects its faults at fractions of that count, so a slow machine
gives a longer run, never a smaller one. `--cap` (seconds) is only for a hang.

Workers are separate OS processes with many asyncio clients each. Every operation is recorded
as a "call" line (flushed before the operation starts, so SIGKILL cannot hide it) and a "ret"
line, on CLOCK_MONOTONIC, which all processes of one host share. Each history file starts with
the run's id, and the checker refuses files from different runs or readings outside the run.

The orchestrator steers workers through `control.json` (leader designation, clock offset,
stop). With the legacy implementation one designated worker leads at a time, as in
production; take-overs are discrete nemesis events (recorded as `reset` operations), and a
deposed leader serves until the storage fences it. Flips are recorded as `flip` operations.

Three scenarios relax or re-key what they record, each for a documented reason:
- `fencing-modes`: while the mode is (or was, within the staleness bound) `Disabled`, a legacy
  worker's reads are recorded as `stale-read`, which the checker accepts at or below the read
  frontier: that is exactly what Disabled gives up. Writes, applies and flips stay strict.
- `reprovision`: the deployment is dropped and provisioned again under live clients. Timelines
  restart, so each incarnation is its own history (timeline keys carry the incarnation), and a
  separate check fails the run if any operation on the old incarnation succeeded after the drop.
- `spark-client`: worker 0 is a Spark driver's `OracleClient` (threads, transparent reopening)
  across flips; the other workers are the usual asyncio clients.
The histories go to the Go checker (main.go beside this file, Porcupine) and to the fast Python
invariant checks in history.py.

`cancelled-transactions` cancels calls at every point of a transaction (issue 34): the nemesis
holds the write path from another process (SQLite's write lock, PostgreSQL row locks on the
timelines) again and again, each time until a transaction was cancelled waiting for it; one
client per worker runs transactions on its oracle's own backend (so the statements after them
share the connection) and cancels them waiting for the lock, in the body and at COMMIT, each
followed by recorded operations on that oracle; the other clients cancel some of their calls
at random points (recorded as failed: their outcome is unknown). It is sized by the
cancellations seen at each point as well as by operations, runs on SQLite too, and ends with
another process opening every timeline: its first timestamps must be above everything handed
out (a transaction left open by a cancellation would have taken them back at close).

The clock scenarios (`clock`, `clock-jump-forward`, `clock-jump-back`) shift the clock the even
workers' oracles read (`now`). Writes on EpochMilliseconds record that clock around the call and
failures record their error type, so `clock_report` can check every run: no write handed out
more than the allowed skew ahead of its own clock, ClockSkew only on the wall-clock timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import contextvars
import functools
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
from psycopg import sql

import tsoracle
from tsoracle.oracle.options import DEFAULT_MAX_CLOCK_SKEW_MS
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.store import parse_url
from tsoracle_dev import CHECKOUT, hosttools
from tsoracle_dev.lincheck.history import Op, check
from tsoracle_dev.lincheck.netns import NamespaceUnavailable, NetNamespace
from tsoracle_dev.localpg import LocalPostgres
from tsoracle_dev.pgfaults import LossyRelay, SerializationFaults

HERE = Path(__file__).resolve().parent  # the Go checker's sources and the corpus

SCENARIOS = ("none", "postgres", "async-commit-crash", "client-kill", "pause", "flips", "clock",
             "clock-jump-forward", "clock-jump-back", "partition", "takeovers", "fencing-modes",
             "reprovision", "spark-client", "serialization-faults", "lost-replies",
             "cancelled-transactions")
# The scenarios that also run on SQLite (`run(backend="sqlite")`; a file, no server).
SQLITE_SCENARIOS = ("cancelled-transactions",)
BACKENDS = ("postgresql", "sqlite")
# In these the even workers' oracles read a clock the nemesis shifts (the `now` every oracle
# takes; nothing else in the library reads the wall clock, tests/test_lincheck.py checks).
CLOCK_SCENARIOS = ("clock", "clock-jump-forward", "clock-jump-back")
# ±10 minutes: ten times the default allowance, so what ClockSkew refuses is unmistakable.
CLOCK_JUMP_MS = 600_000
# The partition: worker 0 is cut off this long, and is configured to give up on the database
# after PARTITION_BUDGET_S of retries, noticing a silent network after PARTITION_NETWORK_S; every
# operation it starts meanwhile must end (fail) within PARTITION_BOUND_S.
PARTITION_S = 5.0
PARTITION_BUDGET_S = 1.0
PARTITION_NETWORK_S = 1
PARTITION_BOUND_S = PARTITION_BUDGET_S + 2 * PARTITION_NETWORK_S + 1.0
SERVING_OPS = 20  # worker 0 has served this many operations before it is cut off
# CockroachDB's failure shape (tsoracle_dev.pgfaults), at these fractions of statements in turn.
FAULT_RATES = (0.05, 0.30)
ISOLATIONS = ("read committed", "serializable")
LEGACY_ONLY = ("takeovers",)  # leader changes mean nothing to the distributed implementation
# Scenarios that crash, reconfigure or re-address their PostgreSQL: always a server of their own.
OWN_SERVER = ("postgres", "async-commit-crash", "serialization-faults", "partition")
TIMELINES = (EPOCH_MILLISECONDS, "counter:lin", "counter:lin2")
# cancelled-transactions: where a transaction is cancelled. Before its lock: waiting for BEGIN
# (SQLite's BEGIN IMMEDIATE waits for the write lock) or for the body's first statement
# (PostgreSQL waits there for the row lock); in the body; at COMMIT.
CANCEL_POINTS = ("begin", "lock", "body", "commit")
CANCELS_PER_POINT = 50  # at least this many before the lock, in the body and at COMMIT
# The timeline of the clients that cancel transactions: each worker's backend for it serves
# that one client, so its BEGIN is the statement waiting for the lock, not one queued behind
# another client's.
CANCEL_TIMELINE = "counter:cancel"
# The row each worker's cancelled transactions lock and update: one of its own. On a row the
# others update, a SERIALIZABLE transaction that waited for its lock fails on the update it
# waited for, and on a busy machine it failed like that for its whole retry budget (the CI run
# of 99ba11a: 30 s, twenty times over).
# The table the cancelling clients' transactions lock and update, a row per worker, beside
# the oracle's (in its schema, on its backend): on the oracle's own busy `timestamps` table a
# SERIALIZABLE transaction of theirs failed serialization (PostgreSQL's page-level read locks)
# attempt after attempt on a busy machine, and the run stalled (CI, 2026-11-28, three times).
CANCEL_TABLE = "lincheck_cancel"
# A cancelling client's own transaction (not an oracle call) that retries this long is
# cancelled where it is, like the others, and counted as given up.
CANCEL_TX_BUDGET_S = 5.0
CANCEL_SHARE = 0.1  # of the other clients' calls, cancelled at a random point
# A hold of the write lock ends once a transaction was cancelled waiting for it, or after this
# long (a leader still starting, say); HOLD_SPACING operations complete between two holds.
HOLD_MAX_S = 2.0
HOLD_SPACING = 50
CACHE = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))
DEFAULT_CAP_S = 600.0  # a scenario that has not finished by then hangs
# A run sized by take-overs: operations served between two (the old leader then has writes out
# that it has not applied, which is what a bug in the take-over path needs to show).
TAKEOVER_SPACING = 100
# After fencing goes back to Always, a legacy leader may still answer one stale read until its
# next confirmation: DISABLED_MAX_STALENESS_S (1 s) plus that statement, with a wide margin.
STRICT_AGAIN_AFTER_S = 3.0


def combos(implementations: tuple[str, ...] = ("distributed", "legacy"),
           isolations: tuple[str, ...] = ISOLATIONS) -> list[tuple[str, str, str]]:
    """Every (scenario, implementation, isolation) that means something on PostgreSQL."""
    return [(s, i, iso) for s in SCENARIOS for i in implementations for iso in isolations
            if s not in LEGACY_ONLY or i == "legacy"]


def sqlite_combos(implementations: tuple[str, ...] = ("distributed", "legacy")
                  ) -> list[tuple[str, str]]:
    """Every (scenario, implementation) that runs on SQLite (one isolation: serializable)."""
    return [(s, i) for s in SQLITE_SCENARIOS for i in implementations
            if s not in LEGACY_ONLY or i == "legacy"]


# --- the worker process --------------------------------------------------------------------

class Recorder:
    def __init__(self, path: Path, proc: int, run_id: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.proc = proc
        self.seq = 0
        self.lock = threading.Lock()  # the spark-client worker records from many threads
        self._write({"k": "run", "run": run_id, "proc": proc})

    def _write(self, rec: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(rec) + "\n").encode())

    def call(self, client: int, timeline: str, op: str, arg: int | None = None,
             t: int | None = None, clock: tuple[int, int] | None = None) -> str:
        """`clock`: the clock the oracle reads (ms) and its offset from the true time, for
        writes and applies on EpochMilliseconds."""
        with self.lock:
            self.seq += 1
            op_id = f"{self.proc}-{self.seq}"
        rec: dict[str, Any] = {"k": "call", "id": op_id, "client": client,
                               "timeline": timeline, "op": op, "t": t or time.monotonic_ns()}
        if arg is not None:
            rec["arg"] = arg
        if clock is not None:
            rec["wall"], rec["offset"] = clock
        self._write(rec)
        return op_id

    def ret(self, op_id: str, ok: bool, value: int | None = None, *,
            wall: int | None = None, error: str | None = None) -> None:
        """`error`: the type of the OracleError a failed operation raised."""
        rec: dict[str, Any] = {"k": "ret", "id": op_id, "ok": ok, "t": time.monotonic_ns()}
        if value is not None:
            rec["value"] = value
        if wall is not None:
            rec["wall"] = wall
        if error is not None:
            rec["error"] = error
        self._write(rec)


class Control:
    """What the orchestrator tells every worker: who leads, the clock offset, when to stop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state: dict[str, Any] = {"implementation": "distributed", "leader": 0,
                                      "clock_offset_ms": 0, "stop": False, "relaxed": False,
                                      "lost_reply_rate": 0.0, "hold_round": 0, "held": False}

    def write(self, **changes: Any) -> None:
        self.state.update(changes)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)  # workers never see a half-written file

    def read(self) -> dict[str, Any]:
        try:
            self.state = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            pass  # keep the last good state
        return self.state


class Standby(Exception):
    """The legacy implementation is active and another worker is the designated leader."""


async def cancelled_transaction(oracle: ReopeningOracle, target: str, rng: random.Random,
                                table: str, proc: int) -> str | None:
    """Run a transaction on `oracle`'s own backend, on `proc`'s row of `table` (CANCEL_TABLE,
    qualified), and cancel it at `target`: "begin" a moment
    after it started (the nemesis holds the lock it waits for), "body" with its second
    statement in flight, "commit" with its COMMIT in flight. Returns where the cancellation
    landed (CANCEL_POINTS, as the body saw it), or None if the transaction ended first."""
    loop = asyncio.get_running_loop()
    phase = ["begin"]
    landed: list[str] = []
    where = {"proc": proc}

    def cancel(task: asyncio.Task[Any]) -> None:
        if task.cancel():
            landed.append(phase[0])

    def cancel_at(point: str) -> None:
        phase[0] = point
        if target == point:
            # Runs once this task waits for the statement it sends next (or the COMMIT): the
            # callback is queued before that statement's reply can be.
            task = asyncio.current_task()
            assert task is not None
            loop.call_soon(cancel, task)

    async def body(tx: tsoracle.store.Tx) -> None:
        phase[0] = "lock"
        await tx.fetch(f"SELECT n FROM {table} WHERE proc = %(proc)s FOR UPDATE", where)
        cancel_at("body")
        await tx.fetch(f"UPDATE {table} SET n = n + 1 WHERE proc = %(proc)s", where)
        cancel_at("commit")

    async def run(o: tsoracle.TimestampOracle) -> None:
        await o.backend.transaction(body)

    task = loop.create_task(oracle.call(run))
    if target == "begin":
        await asyncio.sleep(0)  # the transaction starts: BEGIN is sent, and waits
        await asyncio.sleep(rng.uniform(0, 0.01))
        cancel(task)
    try:
        await task  # Standby or an OracleError: no transaction ran
    except asyncio.CancelledError:
        if not landed:
            raise  # this client itself was cancelled
        return landed[0]
    return None


async def worker(args: argparse.Namespace) -> None:
    url = args.url
    relay = None
    if args.lossy:
        relay = LossyRelay(urlsplit(url).port or 5432, seed=args.proc)
        url = relay.url(url)
    extra: dict[str, Any] = {}
    if args.retry_budget is not None:
        extra["retry"] = tsoracle.store.RetryPolicy(timeout=args.retry_budget)
    if args.broken:
        from tsoracle_dev.lincheck.broken import install

        extra.update(install(args.broken))
    rec = Recorder(Path(args.out), args.proc, args.run)
    control = Control(Path(args.control))
    state = control.read()
    cancels = Path(args.out).with_name(f"cancels-{args.proc}.jsonl")  # where they landed

    def offset() -> int:
        return state["clock_offset_ms"] if args.clock_skew else 0

    def clock() -> int:
        return time.time_ns() // 1_000_000 + offset()

    deadline = time.monotonic() + args.cap  # only if the orchestrator died
    stats: dict[str, Any] = {"ok": 0, "failed": 0, "cancelled": 0,
                             "cancelled_transactions": dict.fromkeys(CANCEL_POINTS, 0),
                             "gave_up": 0}

    async def follow() -> None:
        nonlocal state
        while not state["stop"]:
            state = control.read()
            if relay is not None:
                relay.rate = state["lost_reply_rate"]
            await asyncio.sleep(0.02)

    def key(tl: str, o: tsoracle.TimestampOracle | None = None) -> str:
        if not args.by_incarnation:
            return tl
        return f"{tl}@{o.deployment.incarnation if o is not None else 'unknown'}"

    caller: contextvars.ContextVar[int] = contextvars.ContextVar("caller", default=0)

    async def open_timeline(tl: str) -> tsoracle.TimestampOracle:
        """What the wrapper calls after a fence: only the designated worker leads legacy."""
        impl = state["implementation"]
        if impl == "legacy" and state["leader"] != args.proc:
            raise Standby
        if impl != "legacy":
            return await tsoracle.open_oracle(url, timeline=tl, implementation=impl,
                                              now=clock, **extra)
        # A take-over, recorded. Re-keyed runs learn the incarnation only from the open: the
        # call line is written after it, with the time the take-over started.
        client, t0 = caller.get(), time.monotonic_ns()
        op = None if args.by_incarnation else rec.call(client, tl, "reset")
        try:
            o = await tsoracle.open_oracle(url, timeline=tl, implementation=impl, now=clock,
                                           **extra)
        except tsoracle.OracleError:
            op = op or rec.call(client, key(tl), "reset", t=t0)
            rec.ret(op, False)  # the take-over may have happened
            raise
        op = op or rec.call(client, key(tl, o), "reset", t=t0)
        rec.ret(op, True, o.resumed_at)  # type: ignore[attr-defined]
        return o

    # One reopening oracle per timeline (oracle/reopening.py): a fenced call is recorded as
    # failed on the oracle that refused it and runs again, recorded anew, on the reopened one.
    timelines = TIMELINES + ((CANCEL_TIMELINE,) if args.cancellations else ())
    oracles = {tl: ReopeningOracle(functools.partial(open_timeline, tl), name=tl,
                                   take_over=True) for tl in timelines}

    async def recorded(o: tsoracle.TimestampOracle, cid: int, tl: str, name: str,
                       arg: int | None = None) -> int:
        if name != "write" and name != "apply" and state["relaxed"] \
                and o.implementation == "legacy":
            name = "stale-read"  # Disabled: a superseded leader may answer stale
        # The clock around each write on the wall-clock timeline bounds what it may return
        # (clock_report); nothing awaits between this reading and the oracle's first one.
        walled = name in ("write", "apply") and tl == EPOCH_MILLISECONDS
        op = rec.call(cid, key(tl, o), name, arg, clock=(clock(), offset()) if walled else None)
        try:
            if name == "write":
                value = (await o.write_ts()).timestamp
            elif name == "apply":
                assert arg is not None
                await o.apply_write(arg)
                value = 0
            elif name == "peek":
                value = await o.peek_write_ts()
            else:  # read, stale-read
                value = await o.read_ts()
        except tsoracle.OracleError as exc:
            rec.ret(op, False, error=type(exc).__name__)
            raise
        except asyncio.CancelledError:
            rec.ret(op, False, error="Cancelled")  # its outcome is unknown
            raise
        rec.ret(op, True, value, wall=clock() if walled else None)
        return value

    async def maybe_cancelled(o: ReopeningOracle, rng: random.Random, **call: Any) -> int:
        """`o.call(recorded)`, cancelled at a random point for CANCEL_SHARE of the calls
        (TimeoutError) in the cancelled-transactions scenario."""
        fn = functools.partial(recorded, **call)
        if not args.cancellations or rng.random() >= CANCEL_SHARE:
            return await o.call(fn)
        async with asyncio.timeout(rng.choice((0.0, rng.uniform(0, 0.002),
                                               rng.uniform(0, 0.02)))):
            return await o.call(fn)

    async def client(cid: int) -> None:
        caller.set(cid)
        rng = random.Random(cid)
        while not state["stop"] and time.monotonic() < deadline:
            tl = rng.choice(TIMELINES)
            roll = rng.random()
            name = "write" if roll < 0.4 else "peek" if roll < 0.5 else "read"
            oracle = oracles[tl]
            try:
                value = await maybe_cancelled(oracle, rng, cid=cid, tl=tl, name=name)
                if name == "write" and rng.random() < 0.7:
                    await asyncio.sleep(rng.random() * 0.002)
                    await maybe_cancelled(oracle, rng, cid=cid, tl=tl, name="apply", arg=value)
                stats["ok"] += 1
            except TimeoutError:
                stats["cancelled"] += 1
            except Standby:
                await asyncio.sleep(0.05)
            except tsoracle.OracleError:
                stats["failed"] += 1
                await asyncio.sleep(0.01)

    async def canceller(cid: int) -> None:
        """cancelled-transactions: transactions on CANCEL_TIMELINE's backend, cancelled before
        their lock while the nemesis holds it, else in the body or at COMMIT in turn; after
        each, a write, its apply and a read on that oracle, which would run inside anything the
        cancellation left open.

        A hold comes in rounds: the nemesis announces one (`hold_round`), this client says it
        is ready (between calls, so that none of its own waits for the lock) and waits for
        `held`; only then does it start the transaction it cancels before the lock."""
        caller.set(cid)
        rng = random.Random(cid)
        later = 0
        oracle = oracles[CANCEL_TIMELINE]
        fd = os.open(cancels, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)

        def note(**line: Any) -> None:
            os.write(fd, (json.dumps({**line, "t": time.monotonic_ns()}) + "\n").encode())

        seen_round = state["hold_round"]
        try:
            while not state["stop"] and time.monotonic() < deadline:
                target = ("body", "commit")[later % 2]
                leading = state["implementation"] != "legacy" or state["leader"] == args.proc
                if state["hold_round"] != seen_round and leading:
                    seen_round = state["hold_round"]
                    note(ready=seen_round)
                    while not state["held"] and state["hold_round"] == seen_round \
                            and not state["stop"]:
                        await asyncio.sleep(0.005)
                    if state["held"]:
                        target = "begin"
                later += target != "begin"
                try:
                    try:
                        async with asyncio.timeout(CANCEL_TX_BUDGET_S):
                            landed = await cancelled_transaction(
                                oracle, target, rng, cancel_table(url), args.proc)
                    except TimeoutError:
                        # This test's own transaction (not an oracle call) retried that long:
                        # cancelled there, wherever it was, and counted apart.
                        stats["gave_up"] += 1
                        landed = None
                    if landed is not None:
                        stats["cancelled_transactions"][landed] += 1
                        note(at=landed, target=target)
                    call = functools.partial(recorded, cid=cid, tl=CANCEL_TIMELINE)
                    value = await oracle.call(functools.partial(call, name="write"))
                    await oracle.call(functools.partial(call, name="apply", arg=value))
                    await oracle.call(functools.partial(call, name="read"))
                    stats["ok"] += 1
                except Standby:
                    await asyncio.sleep(0.05)
                except tsoracle.OracleError:
                    stats["failed"] += 1
                    await asyncio.sleep(0.01)
        finally:
            os.close(fd)

    def dump_tasks() -> None:  # SIGUSR1: where every client waits (the runner asks on a stall)
        for task in asyncio.all_tasks():
            frames, coro = [], task.get_coro()
            while coro is not None and getattr(coro, "cr_frame", None) is not None:
                frames.append(f"{coro.cr_code.co_filename}:{coro.cr_frame.f_lineno}")
                coro = coro.cr_await
            print(f"task {task.get_name()}: " + " <- ".join(reversed(frames)), file=sys.stderr)
        sys.stderr.flush()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    follower = loop.create_task(follow())
    clients = [client(args.proc * 100 + i) for i in range(args.clients)]
    if args.cancellations:
        clients.append(canceller(args.proc * 100 + args.clients))
    await asyncio.gather(*clients)
    follower.cancel()
    for o in oracles.values():
        await o.close()
    from tsoracle.oracle.metrics import FAILED, RETRIES

    stats["retries"] = {r: RETRIES.total(reason=r) for r in
                        ("serialization_failure", "ambiguous_result", "deadlock", "connection",
                         "pool_timeout")}
    # What the metric saw, to hold against what the history recorded.
    stats["clock_skew_counted"] = {op: FAILED.total(operation=op, error="ClockSkew")
                                   for op in ("write_ts", "apply_write")}
    stats["replies_lost"] = relay.lost if relay is not None else 0
    print(json.dumps(stats), flush=True)


def spark_worker(args: argparse.Namespace) -> None:
    """Worker 0 of the spark-client scenario: one OracleClient shared by many threads."""
    from tsoracle.spark.client import OracleClient

    rec = Recorder(Path(args.out), args.proc, args.run)
    control = Control(Path(args.control))
    deadline = time.monotonic() + args.cap
    stats = {"ok": 0, "failed": 0}
    client = OracleClient(args.url)

    def thread(cid: int) -> None:
        rng = random.Random(cid)
        while not control.state["stop"] and time.monotonic() < deadline:
            tl = rng.choice(TIMELINES)
            op_name = "write" if rng.random() < 0.5 else "read"
            op = rec.call(cid, tl, op_name)
            try:
                if op_name == "write":
                    w = client.write_ts(tl).timestamp
                    rec.ret(op, True, w)
                    op = rec.call(cid, tl, "apply", w)
                    client.apply_write(w, tl)
                    rec.ret(op, True, 0)
                else:
                    rec.ret(op, True, client.read_ts(tl))
                stats["ok"] += 1
            except tsoracle.OracleError:
                rec.ret(op, False)
                stats["failed"] += 1
                time.sleep(0.01)

    def follow() -> None:
        while not control.read()["stop"]:
            time.sleep(0.02)

    threads = [threading.Thread(target=thread, args=(args.proc * 100 + i,))
               for i in range(max(8, args.clients))]
    for t in threads:
        t.start()
    follow()
    for t in threads:
        t.join()
    client.close()
    stats["reopens"] = client.reopens
    print(json.dumps(stats), flush=True)


# --- the orchestrator ----------------------------------------------------------------------

class Progress:
    """Counts successful returns in the workers' histories as they grow (never rereads)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.offsets: dict[Path, int] = {}
        self.by_worker: dict[str, int] = {}  # "worker-0": its successful returns

    @property
    def ok(self) -> int:
        """Every worker's successful returns as of the last poll."""
        return sum(self.by_worker.values())

    def poll(self) -> int:
        for path in self.out.glob("worker-*.jsonl"):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            whole = data.rfind(b"\n") + 1  # a line still being written is counted next time
            self.by_worker[path.stem] = (self.by_worker.get(path.stem, 0)
                                         + data[:whole].count(b'"ok": true'))
            self.offsets[path] = self.offsets.get(path, 0) + whole
        return self.ok

    def of(self, proc: int) -> int:
        """Worker `proc`'s successful returns as of the last poll."""
        return self.by_worker.get(f"worker-{proc}", 0)


def checker_path() -> Path:
    """Where the Go checker of these sources and this toolchain is cached (a digest of both)."""
    digest = hashlib.sha256(hosttools.go_version().encode())
    for source in sorted(HERE.glob("*.go")) + [HERE / "go.mod", HERE / "go.sum"]:
        digest.update(source.name.encode() + source.read_bytes())
    return CACHE / f"lincheck-{digest.hexdigest()[:10]}"


def checker_binary() -> Path:
    """The Go checker, built on first use."""
    out = checker_path()
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        subprocess.run(["go", "build", "-o", str(tmp), "."], cwd=HERE, env=env, check=True)
        os.replace(tmp, out)
    return out


def porcupine(paths: list[Path], html: Path, *, run_id: str | None = None,
              window: tuple[int, int] | None = None, timeout_s: int = 300) -> dict[str, Any]:
    argv = [str(checker_binary()), "-timeout", f"{timeout_s}s", "-html", str(html)]
    if run_id:
        argv += ["-run", run_id]
    if window:
        argv += ["-window", f"{window[0]},{window[1]}"]
    proc = subprocess.run([*argv, *map(str, paths)], capture_output=True, text=True)
    if proc.returncode == 3:
        raise RuntimeError(f"lincheck could not read the histories: {proc.stderr}")
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        # Killed (the kernel's OOM killer, a signal) or crashed: a verdict of its own, with
        # what it said, so the run's summary still tells what happened before.
        result = {"verdict": f"checker failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-500:] or 'no output'}",
                  "ops": 0, "seconds": 0.0}
    result["exit"] = proc.returncode
    return result


def invariants(paths: list[Path]) -> tuple[list[str], int]:
    """Fast checks on completed operations (resets and flips move no read frontier)."""
    calls: dict[str, dict[str, Any]] = {}
    rets: dict[str, dict[str, Any]] = {}
    for p in paths:
        for raw in p.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut short by SIGKILL
            if rec["k"] in ("call", "ret"):
                (calls if rec["k"] == "call" else rets)[rec["id"]] = rec
    by_tl: dict[str, list[Op]] = {}
    for op_id, c in calls.items():
        r = rets.get(op_id)
        if r is None or not r["ok"]:
            continue
        kind = {"write": "write", "read": "read", "peek": None, "apply": "apply",
                "reset": None, "flip": None, "stale-read": None}[c["op"]]
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


def shifted(proc: int) -> bool:
    """Whether worker `proc` follows the nemesis's clock offset in the clock scenarios."""
    return proc % 2 == 0


def clock_report(paths: list[Path], phases: list[tuple[int, int]],
                 started: int) -> tuple[list[str], dict[str, Any]]:
    """The clock contract, from the recorded walls and errors: no write on EpochMilliseconds
    returned more than DEFAULT_MAX_CLOCK_SKEW_MS ahead of the clock its oracle read, and
    ClockSkew never came from a counting timeline. Per clock phase (by call time): writes
    served and refused with ClockSkew, on shifted and true-clock workers."""
    calls: dict[str, dict[str, Any]] = {}
    rets: dict[str, dict[str, Any]] = {}
    for p in paths:
        for raw in p.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if rec["k"] in ("call", "ret"):
                (calls if rec["k"] == "call" else rets)[rec["id"]] = rec
    starts = [t for t, _ in phases]
    table = [{"offset_ms": off, "at_s": round((t - started) / 1e9, 2),
              "writes": {"shifted": 0, "true": 0}, "refused": {"shifted": 0, "true": 0},
              "apply_refused": 0, "highest_write": None} for t, off in phases]
    problems: list[str] = []
    allowed = DEFAULT_MAX_CLOCK_SKEW_MS
    for op_id, c in calls.items():
        r = rets.get(op_id)
        if r is None:
            continue
        tl = c["timeline"].partition("@")[0]
        refused = r.get("error") == "ClockSkew"
        if refused and tl != EPOCH_MILLISECONDS:
            problems.append(f"{c['timeline']}: {c['op']} raised ClockSkew on a counting timeline")
        if tl != EPOCH_MILLISECONDS or c["op"] not in ("write", "apply"):
            continue
        moved = shifted(int(op_id.partition("-")[0]))
        who = "shifted" if moved else "true"
        # The phase by call time, or an earlier one if the worker had not yet seen its offset.
        i = max(0, bisect.bisect_right(starts, c["t"]) - 1)
        while moved and i > 0 and table[i]["offset_ms"] != c.get("offset", 0):
            i -= 1
        phase = table[i]
        if c["op"] == "apply":
            phase["apply_refused"] += refused
        elif refused:
            phase["refused"][who] += 1
        elif r["ok"]:
            phase["writes"][who] += 1
            phase["highest_write"] = max(phase["highest_write"] or 0, r["value"])
            if "wall" in c and "wall" in r:
                # The clock may jump once within a call: its highest reading is at most the
                # call's reading plus the time spent (ms, rounded up) or the return's reading.
                spent = -(-(r["t"] - c["t"]) // 1_000_000)
                bound = max(c["wall"] + spent, r["wall"]) + allowed
                if r["value"] > bound:
                    problems.append(f"{c['timeline']}: write {r['value']} is "
                                    f"{r['value'] - bound + allowed} ms ahead of its clock, "
                                    f"more than the allowed {allowed} ms")
    return problems, {"max_clock_skew_ms": allowed, "phases": table}


def served_after_drop(paths: list[Path], dropped: list[tuple[str, int]]) -> list[str]:
    """Operations that succeeded on an incarnation after its tables were dropped."""
    gone = dict(dropped)
    calls: dict[str, dict[str, Any]] = {}
    problems = []
    for p in paths:
        for raw in p.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if rec["k"] == "call":
                calls[rec["id"]] = rec
            elif rec["k"] == "ret" and rec["ok"] and rec["id"] in calls:
                c = calls[rec["id"]]
                inc = c["timeline"].rpartition("@")[2]
                if inc in gone and c["t"] > gone[inc]:
                    problems.append(f"{c['timeline']}: {c['op']} -> {rec.get('value')} "
                                    "succeeded on a dropped incarnation")
    return problems


class Stalled(Exception):
    """The run hit its time cap before the history held enough operations: a hang."""


@contextlib.contextmanager
def write_path_held(url: str, *, wait_s: float) -> Iterator[None]:
    """Hold what every write of the oracle at `url` needs, from this process: SQLite's write
    lock (BEGIN IMMEDIATE), or on PostgreSQL the row locks of every timeline (writers wait;
    plain reads do not). Waits up to `wait_s` for a writer in the way."""
    parsed = parse_url(url)
    if parsed.kind == "sqlite":
        lite = sqlite3.connect(parsed.dsn, timeout=wait_s, isolation_level=None)
        try:
            lite.execute("BEGIN IMMEDIATE")
            yield
            lite.execute("ROLLBACK")
        finally:
            lite.close()
        return
    with psycopg.connect(parsed.dsn) as conn:
        # Not the database's default: a SERIALIZABLE FOR UPDATE fails on a row updated since
        # its snapshot, where READ COMMITTED waits for it and locks the newest version.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
            sql.Literal(f"{int(wait_s * 1000)}ms")))
        conn.execute(sql.SQL("SELECT 1 FROM {} FOR UPDATE").format(
            sql.Identifier(parsed.schema, "timestamps")))
        if _has_cancel_table(conn, parsed.schema):
            conn.execute(f"SELECT 1 FROM {cancel_table(url)} FOR UPDATE")
        yield
        conn.rollback()


def cancel_table(url: str) -> str:
    """CANCEL_TABLE as the run's backend names it (in the oracle's schema on PostgreSQL)."""
    parsed = parse_url(url)
    if parsed.kind == "sqlite":
        return CANCEL_TABLE
    return sql.Identifier(parsed.schema, CANCEL_TABLE).as_string(None)


def make_cancel_table(url: str, processes: int) -> None:
    """CANCEL_TABLE with a row per worker."""
    parsed = parse_url(url)
    ddl = f"CREATE TABLE {cancel_table(url)} (proc INTEGER PRIMARY KEY, n BIGINT NOT NULL)"
    rows = [(i, 0) for i in range(processes)]
    if parsed.kind == "sqlite":
        with contextlib.closing(sqlite3.connect(parsed.dsn)) as lite, lite:
            lite.execute(ddl)
            lite.executemany(f"INSERT INTO {CANCEL_TABLE} VALUES (?, ?)", rows)
        return
    with psycopg.connect(parsed.dsn) as conn:
        conn.execute(ddl)  # type: ignore[arg-type]
        conn.cursor().executemany(
            f"INSERT INTO {cancel_table(url)} VALUES (%s, %s)", rows)  # type: ignore[arg-type]


def _has_cancel_table(conn: psycopg.Connection[Any], schema: str) -> bool:
    return bool(conn.execute("SELECT to_regclass(%s)",
                             (f'"{schema}".{CANCEL_TABLE}',)).fetchone()[0])  # type: ignore[index]


class Nemesis:
    """Faults at fractions of the run's operation count, and the controls workers follow."""

    def __init__(self, scenario: str, implementation: str, *, min_ops: int, cap_s: float,
                 url: str, out: Path, pg: LocalPostgres | None, control: Control,
                 procs: dict[int, subprocess.Popen[bytes]], spawn: Any, processes: int,
                 run_id: str) -> None:
        self.scenario, self.implementation = scenario, implementation
        self.min_ops, self.url, self.out, self.pg = min_ops, url, out, pg
        self.control, self.procs, self.spawn, self.processes = control, procs, spawn, processes
        self.run_id = run_id
        self.progress = Progress(out)
        self.started = time.monotonic_ns()
        self.deadline = time.monotonic() + cap_s
        self.faults: list[dict[str, Any]] = []
        self.first_fault = 0
        self.ns: NetNamespace | None = None  # set by run() for the partition scenario
        self.takeovers: int | None = None  # set by run(): the takeovers scenario by events
        self.led_at = 0  # monotonic ns when lead() last designated a leader
        self.partition_window: tuple[int, int] | None = None
        self.flips: Recorder | None = None
        self.strict_at: float | None = None  # when reads stop being recorded as stale-read
        self.dropped: list[tuple[str, int]] = []  # (incarnation, when its tables were gone)
        self.holds = 0  # cancelled-transactions: times the write path was held
        # (when, offset ms) of the shifted workers' clock, from the start: clock_report()
        self.clock_phases: list[tuple[int, int]] = [(self.started, 0)]
        parts = urlsplit(url)
        self.database = parts.path.lstrip("/")
        self.schema = parse_qs(parts.query)["schema"][0]

    def fault(self, kind: str, **info: Any) -> None:
        now = time.monotonic_ns()
        self.first_fault = self.first_fault or now
        self.faults.append({"fault": kind, "at_s": round((now - self.started) / 1e9, 2),
                            "at_ops": self.progress.ok, **info})

    def at(self, fraction: float) -> None:
        """Wait until `fraction` of the run's operations have completed (and reads are checked
        strictly again after a fencing-mode change: the next fault needs a strict window)."""
        while self.progress.poll() < fraction * self.min_ops or self.strict_at is not None:
            if self.strict_at is not None and time.monotonic() >= self.strict_at:
                self.strict_at = None
                self.control.write(relaxed=False)
                self.fault("reads recorded strictly again")
            if time.monotonic() > self.deadline:
                raise Stalled(f"{self.progress.ok} of {self.min_ops} operations completed "
                              "before the time cap")
            time.sleep(0.02)

    def serving(self, proc: int) -> None:
        """Wait until worker `proc` has served SERVING_OPS operations."""
        while True:
            self.progress.poll()
            if self.progress.of(proc) >= SERVING_OPS:
                return
            if time.monotonic() > self.deadline:
                raise Stalled(f"worker {proc} served {self.progress.of(proc)} operations "
                              "before the time cap")
            time.sleep(0.02)

    @property
    def other(self) -> str:
        return "legacy" if self.implementation == "distributed" else "distributed"

    def flip(self, target: str) -> None:
        if self.flips is None:
            self.flips = Recorder(self.out / "flips.jsonl", 99, self.run_id)
        ids = {tl: self.flips.call(9999, tl, "flip") for tl in TIMELINES}
        result = asyncio.run(tsoracle.flip(self.url, to=target))
        for tl, op in ids.items():
            self.flips.ret(op, True, result.bootstrap[tl])
        self.control.write(implementation=target)
        self.fault("flip", to=target, epoch=result.epoch)

    def fencing(self, mode: str) -> None:
        if mode == "Disabled":
            self.control.write(relaxed=True)  # before any worker can see the mode
            asyncio.run(tsoracle.set_fencing(self.url, mode))
            self.fault("fencing Disabled")
            return
        asyncio.run(tsoracle.set_fencing(self.url, mode))
        self.fault(f"fencing {mode}")
        self.strict_at = time.monotonic() + STRICT_AGAIN_AFTER_S  # see at()

    def _cancel_lines(self) -> list[dict[str, Any]]:
        lines = []
        for path in self.out.glob("cancels-*.jsonl"):
            for raw in path.read_text().splitlines():
                try:
                    lines.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue  # a line still being written
        return lines

    def cancellations(self) -> dict[str, int]:
        """Transactions the workers cancelled so far, by where the cancellation landed."""
        counts = dict.fromkeys(CANCEL_POINTS, 0)
        for line in self._cancel_lines():
            if "at" in line:
                counts[line["at"]] += 1
        return counts

    def ready(self, hold_round: int) -> int:
        """How many cancelling clients are ready for `hold_round`."""
        return sum(line.get("ready") == hold_round for line in self._cancel_lines())

    def enough_cancellations(self) -> bool:
        counts = self.cancellations()
        return (counts["begin"] + counts["lock"] >= CANCELS_PER_POINT
                and counts["body"] >= CANCELS_PER_POINT
                and counts["commit"] >= CANCELS_PER_POINT)

    def hold_write_path(self) -> None:
        """One hold round: announce it, wait until the cancelling clients are ready (legacy:
        the leader's), hold the write path until a transaction was cancelled waiting for it,
        let go. Each wait ends after HOLD_MAX_S at most (a leader still starting, say)."""
        def until(done: Callable[[], bool]) -> None:
            since = time.monotonic()
            while not done() and time.monotonic() - since < HOLD_MAX_S:
                if time.monotonic() > self.deadline:
                    raise Stalled(f"{self.cancellations()} transactions cancelled before the "
                                  "time cap")
                time.sleep(0.01)

        def waiting() -> int:
            counts = self.cancellations()
            return counts["begin"] + counts["lock"]

        rounds = self.holds + 1
        clients = 1 if self.control.state["implementation"] == "legacy" else self.processes
        self.control.write(hold_round=rounds)
        until(lambda: self.ready(rounds) >= clients)
        before = waiting()
        with write_path_held(self.url, wait_s=30.0):
            self.control.write(held=True)
            if not self.holds:
                self.fault("write path held by another process, until a transaction is "
                           "cancelled waiting for it; again and again")
            until(lambda: waiting() > before)
            self.control.write(held=False)
        self.holds = rounds

    def reprovision(self) -> None:
        """deletionPolicy: Delete, then the operator (or `tsoracle init`) provisions it again."""
        from tsoracle.fencing import read_deployment
        from tsoracle.oracle.connect import admin_backend
        from tsoracle.oracle.provision import drop_deployment

        async def drop() -> str:
            async with admin_backend(self.url) as backend:
                old = (await read_deployment(backend)).incarnation
                await drop_deployment(backend)
                return old

        # The current (legacy) leader is paused across the drop and the re-provision, so it
        # wakes after a new leader started on the new rows, holding a leader epoch that the new
        # rows now carry too: only the incarnation tells the two apart.
        paused = self.control.state["leader"]
        self.procs[paused].send_signal(signal.SIGSTOP)
        old = asyncio.run(drop())
        self.dropped.append((old, time.monotonic_ns()))
        self.fault("deployment dropped", incarnation=old, paused=paused)
        self.control.write(leader=(paused + 1) % self.processes)
        time.sleep(0.3)  # live clients meet missing tables
        asyncio.run(tsoracle.init(self.url, timelines=list(TIMELINES),
                                  implementation=self.implementation))
        self.fault("deployment provisioned again")
        self.at(self.progress.poll() / self.min_ops + 0.05)  # the new incarnation serves
        self.procs[paused].send_signal(signal.SIGCONT)
        self.fault("SIGCONT", process=paused)

    def shift_clock(self, offset_ms: int) -> None:
        """Set the shifted workers' clock `offset_ms` from the true time (from 0: a jump)."""
        self.clock_phases.append((time.monotonic_ns(), offset_ms))  # before any worker sees it
        self.control.write(clock_offset_ms=offset_ms)
        what = "back to true time" if offset_ms == 0 else f"{offset_ms / 1000:+g} s"
        self.fault(f"clock {what} on even workers")

    def lead(self, proc: int) -> None:
        """A take-over: `proc` becomes the designated legacy leader (no effect on distributed)."""
        # Before the workers can see it: the new leader may take over before this returns.
        self.led_at = time.monotonic_ns()
        self.control.write(leader=proc)
        if self.control.state["implementation"] == "legacy":
            self.fault("legacy take-over", leader=proc)

    def took_over(self, proc: int) -> None:
        """Wait until `proc`, just designated, has taken EpochMilliseconds over (legacy): the
        next step must find it leading with whatever clock it has, however short the run."""
        if self.control.state["implementation"] != "legacy":
            return
        # From the designation on, not from this call: a take-over quicker than the way here
        # (a busy machine pausing this process) was missed, and the run stalled at its cap.
        since, path = self.led_at, self.out / f"worker-{proc}.jsonl"
        pending: set[str] = set()
        while True:
            try:
                history = path.read_text()
            except FileNotFoundError:  # still starting: a busy machine's imports take seconds
                history = ""
            for raw in history.splitlines():
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if rec["k"] == "call" and rec["op"] == "reset" and rec["t"] >= since \
                        and rec["timeline"] == EPOCH_MILLISECONDS:
                    pending.add(rec["id"])
                elif rec["k"] == "ret" and rec["ok"] and rec["id"] in pending:
                    self.fault("took over", leader=proc)
                    return
            if time.monotonic() > self.deadline:
                raise Stalled(f"worker {proc} never took {EPOCH_MILLISECONDS} over")
            time.sleep(0.02)

    def run(self) -> None:
        scenario = self.scenario
        if scenario == "postgres":
            assert self.pg is not None, "the postgres scenario needs the runner's own server"
            self.at(0.25)
            for _ in range(4):
                self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE usename = 'tsoracle'")
                self.fault("pg_terminate_backend")
                time.sleep(0.3)
            self.at(0.5)
            self.fault("postgres SIGKILL")
            pid = self.pg.crash_and_restart(down_seconds=1.0)
            self.fault("postgres restarted after crash recovery", killed_pid=pid)
        elif scenario == "async-commit-crash":
            # A DBA's database default of synchronous_commit = off (and a WAL writer slow
            # enough that a crash surely loses asynchronously committed rows), then a crash.
            assert self.pg is not None, "this scenario needs the runner's own server"
            self.at(0.2)
            self.pg.sql(f"ALTER DATABASE {self.database} SET synchronous_commit = off",
                        "postgres")
            self.pg.sql("ALTER SYSTEM SET wal_writer_delay = '10s'", "postgres")
            self.pg.sql("SELECT pg_reload_conf()", "postgres")
            self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE usename = 'tsoracle'")  # new sessions get the new default
            self.fault("database default synchronous_commit = off, wal_writer_delay 10 s")
            self.at(0.6)
            self.fault("postgres SIGKILL")
            pid = self.pg.crash_and_restart(down_seconds=0.5)
            self.fault("postgres restarted after crash recovery", killed_pid=pid)
            self.lead(1)  # a legacy successor starts from what survived the crash
        elif scenario == "client-kill":
            for n, frac in enumerate((0.3, 0.6)):
                self.at(frac)
                self.procs[n].send_signal(signal.SIGKILL)  # worker 0 leads first, then 1
                self.fault("client SIGKILL", process=n)
                self.spawn(self.processes + n)
                self.lead(n + 1)
        elif scenario == "pause":
            self.at(0.3)
            self.procs[0].send_signal(signal.SIGSTOP)
            self.fault("SIGSTOP", process=0)
            self.lead(1)
            time.sleep(3.0)  # longer than a legacy window (1 s): the new leader moves on
            self.procs[0].send_signal(signal.SIGCONT)
            self.fault("SIGCONT", process=0)
        elif scenario in ("flips", "spark-client"):
            first, other = self.implementation, self.other
            for frac, target in zip((0.2, 0.35, 0.5, 0.65, 0.8),
                                    (other, first, other, first, other), strict=True):
                self.at(frac)
                self.flip(target)
        elif scenario == "fencing-modes":
            # Always -> Disabled -> Always -> Disabled -> Always, with flips both ways and
            # take-overs while Disabled, whichever implementation starts.
            first, other = self.implementation, self.other
            steps = [(0.1, self.fencing, "Disabled"), (0.2, self.lead, 1),
                     (0.3, self.flip, other), (0.38, self.lead, 2), (0.45, self.flip, first),
                     (0.5, self.fencing, "Always"), (0.6, self.flip, other),
                     (0.65, self.fencing, "Disabled"), (0.7, self.lead, 3),
                     (0.78, self.flip, first), (0.85, self.fencing, "Always")]
            for frac, action, arg in steps:
                self.at(frac)
                action(arg)
        elif scenario == "reprovision":
            for frac in (0.3, 0.65):
                self.at(frac)
                self.reprovision()
        elif scenario == "clock":
            self.at(0.3)
            self.shift_clock(-120_000)
            self.at(0.45)
            self.lead(1)
            self.at(0.55)
            self.shift_clock(30_000)
            self.at(0.65)
            self.lead(2)
            self.at(0.8)
            self.shift_clock(0)
        elif scenario in ("clock-jump-forward", "clock-jump-back"):
            # The jump reaches the legacy leader (worker 0) and the distributed writers on even
            # workers; leadership then moves to a true clock (1), back to a jumped one (2),
            # and, after the jump is undone, to 3.
            jump = CLOCK_JUMP_MS if scenario == "clock-jump-forward" else -CLOCK_JUMP_MS
            for frac, action, arg in ((0.25, self.shift_clock, jump), (0.4, self.lead, 1),
                                      (0.55, self.lead, 2), (0.7, self.shift_clock, 0),
                                      (0.85, self.lead, 3)):
                self.at(frac)
                action(arg)
                if action == self.lead:
                    self.took_over(arg)
        elif scenario == "partition":
            assert self.ns is not None, "the partition scenario needs its network namespace"
            self.at(0.3)
            # Worker 0 starts through its namespace, later than the others: on a busy
            # machine the others once did 30 % of the run before it served a call, and the
            # cut found nothing of its to cut.
            self.serving(0)
            cut = time.monotonic_ns()
            self.ns.cut()
            self.fault("partition: worker 0's network namespace cut from PostgreSQL "
                       "(iptables DROP both ways)")
            time.sleep(1.0)
            self.lead(1)
            time.sleep(PARTITION_S - 1.0)
            self.ns.heal()
            self.partition_window = (cut, time.monotonic_ns())
            self.fault("partition healed")
        elif scenario == "serialization-faults":
            assert self.pg is not None, "this scenario needs the runner's own server"
            faults = SerializationFaults(self.pg, self.database)
            faults.install(self.schema)
            for frac, rate in zip((0.2, 0.5), FAULT_RATES, strict=True):
                self.at(frac)
                faults.set_rate(rate)
                self.fault(f"{rate:.0%} of rows read or written fail with 40001")
            self.at(0.8)
            faults.set_rate(0.0)
            self.fault("no more injected 40001")
        elif scenario == "lost-replies":
            for frac, rate in zip((0.2, 0.5), FAULT_RATES, strict=True):
                self.at(frac)
                self.control.write(lost_reply_rate=rate)
                self.fault(f"{rate:.0%} of replies lost after the server applied the statement")
            self.at(0.8)
            self.control.write(lost_reply_rate=0.0)
            self.fault("no more lost replies")
        elif scenario == "cancelled-transactions":
            self.at(0.1)
            while not self.enough_cancellations():
                self.hold_write_path()
                self.at((self.progress.poll() + HOLD_SPACING) / self.min_ops)
            self.fault("transactions cancelled", holds=self.holds, **self.cancellations())
        elif scenario == "takeovers" and self.takeovers:
            for n in range(1, self.takeovers + 1):
                self.at((self.progress.poll() + TAKEOVER_SPACING) / self.min_ops)
                self.lead(n % self.processes)
                self.took_over(n % self.processes)
        elif scenario == "takeovers":
            for n, frac in enumerate((0.2, 0.4, 0.6, 0.8), start=1):
                self.at(frac)
                self.lead(n % self.processes)
        self.at(1.0)


def run(scenario: str, implementation: str, *, out: Path, url: str | None = None,
        processes: int = 4, clients: int = 4, min_ops: int = 3000,
        cap_s: float = DEFAULT_CAP_S, broken: str | None = None,
        isolation: str = "read committed", takeovers: int | None = None,
        server: LocalPostgres | None = None, backend: str = "postgresql") -> dict[str, Any]:
    """One scenario until `min_ops` operations completed; `out` must be a new, empty folder.

    `backend` "sqlite" runs on a SQLite file in `out` (SQLITE_SCENARIOS; no url or server;
    SQLite's transactions are serializable whatever `isolation` says).

    `server`: a running PostgreSQL to share (a schema of the run's own in it, on its
    SERIALIZABLE database for that isolation); the OWN_SERVER scenarios start their own anyway.

    `takeovers` (the `takeovers` scenario only) sizes the run by take-overs instead: that many,
    each once the leader before it has served TAKEOVER_SPACING operations.

    `isolation` "serializable" runs on the server's database whose transactions default to
    SERIALIZABLE (CockroachDB's only level); it needs the runner's own server (no `url`)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "sqlite" and scenario not in SQLITE_SCENARIOS:
        raise ValueError(f"the {scenario} scenario runs on PostgreSQL only; on SQLite: "
                         f"{', '.join(SQLITE_SCENARIOS)}")
    if backend == "sqlite" and (url is not None or server is not None):
        raise ValueError("a SQLite run makes its own file in `out`: leave out url and server")
    if url is not None and server is not None:
        raise ValueError("give url or server, not both")
    if url is not None and isolation != "read committed":
        raise ValueError("a serializable run starts its own server: leave out url")
    if takeovers is not None and scenario != "takeovers":
        raise ValueError("takeovers sizes only the takeovers scenario")
    if url is not None and scenario == "partition":
        raise ValueError("the partition scenario starts its own server: leave out url")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: every run needs an output folder of its own")
    out.mkdir(parents=True, exist_ok=True)
    ns = None
    if scenario == "partition":
        try:
            ns = NetNamespace().up()
        except NamespaceUnavailable as exc:
            raise ValueError(str(exc)) from None
    try:
        return _run(scenario, implementation, out=out, url=url, processes=processes,
                    clients=clients, min_ops=min_ops, cap_s=cap_s, broken=broken,
                    isolation=isolation, ns=ns, takeovers=takeovers,
                    server=None if scenario in OWN_SERVER else server, backend=backend)
    finally:
        if ns is not None:
            ns.down()


def _run(scenario: str, implementation: str, *, out: Path, url: str | None, processes: int,
         clients: int, min_ops: int, cap_s: float, broken: str | None, isolation: str,
         ns: NetNamespace | None, takeovers: int | None,
         server: LocalPostgres | None, backend: str) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    pg = None
    if backend == "sqlite":
        url = f"sqlite:///{out / 'oracle.db'}"
        isolation = "serializable"  # SQLite's only level
    elif server is not None:
        url = server.serializable_url() if isolation == "serializable" else server.url()
    elif url is None:
        pg = LocalPostgres(out / "pg", extra_listen=((ns.host_ip, ns.subnet),) if ns else ())
        url = pg.start()
        if isolation == "serializable":
            url = pg.serializable_url()
    url = f"{url}?schema=lin_{scenario.replace('-', '_')}_{implementation}_{run_id}"
    cancelling = scenario == "cancelled-transactions"
    timelines = TIMELINES + ((CANCEL_TIMELINE,) if cancelling else ())
    asyncio.run(tsoracle.init(url, timelines=list(timelines), implementation=implementation))
    if cancelling:
        make_cancel_table(url, processes)
    control = Control(out / "control.json")
    control.write(implementation=implementation, leader=0)
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(i: int) -> None:
        worker_url, prefix = url, []
        if ns is not None and i == 0:
            # Through the veth pair, with libpq's network time limits and a retry budget
            # short enough that calls made during the partition end well within it.
            prefix = ns.prefix()
            worker_url = (url.replace("@127.0.0.1:", f"@{ns.host_ip}:")
                          + f"&tcp_user_timeout={PARTITION_NETWORK_S * 1000}&keepalives_idle="
                          f"{PARTITION_NETWORK_S}&keepalives_interval=1&keepalives_count=1"
                          f"&connect_timeout={PARTITION_NETWORK_S}")
        argv = [*prefix, sys.executable, "-m", "tsoracle_dev.lincheck.runner", "worker",
                "--url", worker_url,
                "--out", str(out / f"worker-{i}.jsonl"), "--run", run_id,
                "--control", str(control.path), "--proc", str(i), "--clients", str(clients),
                "--cap", str(cap_s)]
        if ns is not None and i == 0:
            argv += ["--retry-budget", str(PARTITION_BUDGET_S)]
        if scenario in CLOCK_SCENARIOS and shifted(i):
            argv += ["--clock-skew"]
        if scenario == "reprovision":
            argv += ["--by-incarnation"]
        if scenario == "spark-client" and i == 0:
            argv += ["--spark-client"]
        if scenario == "lost-replies":
            argv += ["--lossy"]
        if cancelling:
            argv += ["--cancellations"]
        if broken:
            argv += ["--broken", broken]
        with open(out / f"worker-{i}.log", "ab") as log:  # a pipe nobody reads would fill up
            procs[i] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    started = time.monotonic_ns()
    for i in range(processes):
        spawn(i)
    nemesis = Nemesis(scenario, implementation, min_ops=min_ops, cap_s=cap_s, url=url, out=out,
                      pg=pg, control=control, procs=procs, spawn=spawn, processes=processes,
                      run_id=run_id)
    nemesis.ns, nemesis.takeovers = ns, takeovers
    nemesis_errors: list[str] = []
    stalled = None
    try:
        nemesis.run()
    except Stalled as exc:
        stalled = str(exc)
        for p in procs.values():  # each live worker prints where its clients wait (its log)
            if p.poll() is None:
                p.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    except Exception as exc:  # reported in the verdict: a fault that was not injected
        nemesis_errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        control.write(stop=True)
        for p in list(procs.values()):
            p.send_signal(signal.SIGCONT)  # a paused worker must see the stop
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if cancelling and not stalled:
        try:
            asyncio.run(opened_after_close(
                url, timelines, str(control.state["implementation"]),
                Recorder(out / "after-close.jsonl", 98, run_id)))
        except tsoracle.OracleError as exc:
            nemesis_errors.append(f"opening the timelines after the run: {exc!r}")
    ended = time.monotonic_ns()
    if pg is not None:
        pg.destroy()
    paths = sorted(out.glob("worker-*.jsonl")) + sorted(out.glob("flips.jsonl")) \
        + sorted(out.glob("after-close.jsonl"))
    problems, completed = invariants(paths)
    problems += served_after_drop(paths, nemesis.dropped)
    clock_problems, clock = clock_report(paths, nemesis.clock_phases, started)
    problems += clock_problems
    cut_off = None
    if nemesis.partition_window is not None:
        cut_off = partitioned_calls(out / "worker-0.jsonl", nemesis.partition_window, ended)
        if cut_off["longest_s"] > PARTITION_BOUND_S:
            problems.append(f"a call made during the partition took {cut_off['longest_s']} s, "
                            f"more than the {PARTITION_BOUND_S} s bound")
    checked = porcupine(paths, out / "violation.html", run_id=run_id, window=(started, ended))
    cutoff = nemesis.first_fault or ended
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
    workers = worker_stats(out)
    enough = checked["ops"] >= min_ops
    verdict = "pass" if (checked["exit"] == 0 and not problems and enough and not stalled
                         and not nemesis_errors) else "FAIL"
    summary = {
        "scenario": scenario, "implementation": implementation, "isolation": isolation,
        "backend": backend, "run": run_id,
        "processes": processes, "clients_per_process": clients, "min_ops": min_ops,
        "ops_checked": checked["ops"], "completed_ops": completed,
        "seconds": round((ended - started) / 1e9, 1), "faults": nemesis.faults,
        "throughput_before_faults_ops_s": round(before / seconds_before),
        "porcupine": checked["verdict"], "porcupine_seconds": round(checked["seconds"], 2),
        "invariant_violations": problems[:5], "enough_traffic": enough, "stalled": stalled,
        "nemesis_errors": nemesis_errors, "verdict": verdict,
        # What callers saw fail, and what the backends retried unseen (workers that exited).
        "client_errors": sum(w.get("failed", 0) for w in workers),
        "retries": {r: sum(w.get("retries", {}).get(r, 0) for w in workers)
                    for r in sorted({r for w in workers for r in w.get("retries", {})})},
        "replies_lost": sum(w.get("replies_lost", 0) for w in workers),
        # cancelled-transactions: transactions cancelled by where it landed, write-path holds,
        # and calls recorded as cancelled (their outcome unknown).
        "cancellations": nemesis.cancellations() if cancelling else None,
        "holds": nemesis.holds,
        "cancelled_calls": sum(p.read_text().count('"error": "Cancelled"') for p in paths),
        # The cancelling clients' own transactions that retried past CANCEL_TX_BUDGET_S.
        "cancel_tx_given_up": sum(w.get("gave_up", 0) for w in workers),
        "partitioned_calls": cut_off,
        # Writes served and refused (ClockSkew) per clock phase, and what the metric counted.
        "clock": {**clock, "counted": {op: sum(w.get("clock_skew_counted", {}).get(op, 0)
                                               for w in workers)
                                       for op in ("write_ts", "apply_write")}},
    }
    if checked["exit"] == 1:
        summary["visualization"] = str(out / "violation.html")
    if stalled:  # where the clients waited: what a stall's report needs first
        summary["worker_log_tails"] = {
            log.name: log.read_text(errors="replace").splitlines()[-25:]
            for log in sorted(out.glob("worker-*.log"))}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def opened_after_close(url: str, timelines: tuple[str, ...], implementation: str,
                             rec: Recorder) -> None:
    """Another process opens every timeline once the workers are gone (a legacy one takes it
    over, recorded as a `reset`) and takes one write timestamp: it must be above everything
    handed out, which a transaction left open at close (and rolled back) would have undone."""
    for tl in timelines:
        op = rec.call(9998, tl, "reset") if implementation == "legacy" else None
        o = await tsoracle.open_oracle(url, timeline=tl, implementation=implementation)
        try:
            if op is not None:
                rec.ret(op, True, o.resumed_at)  # type: ignore[attr-defined]
            op = rec.call(9998, tl, "write")
            rec.ret(op, True, (await o.write_ts()).timestamp)
        finally:
            await o.close()


def partitioned_calls(path: Path, window: tuple[int, int], run_end: int) -> dict[str, Any]:
    """The calls worker 0 had in flight or started while it was cut off: how many, how they
    ended, and the longest time one spent cut off (from the later of its start and the cut to
    its return; a call that never returned counts until the run ended)."""
    calls: dict[str, int] = {}
    ended: dict[str, tuple[int, bool]] = {}
    for raw in path.read_text().splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if rec.get("k") == "call":
            calls[rec["id"]] = rec["t"]
        elif rec.get("k") == "ret":
            ended[rec["id"]] = (rec["t"], bool(rec["ok"]))
    cut, healed = window
    hit = {i: t for i, t in calls.items()
           if t <= healed and ended.get(i, (run_end, False))[0] >= cut}
    longest = max((ended.get(i, (run_end, False))[0] - max(t, cut) for i, t in hit.items()),
                  default=0)
    return {"calls": len(hit), "failed": sum(not ended[i][1] for i in hit if i in ended),
            "unfinished": sum(i not in ended for i in hit),
            "longest_s": round(longest / 1e9, 2), "bound_s": PARTITION_BOUND_S}


def worker_stats(out: Path) -> list[dict[str, Any]]:
    """The closing line each worker printed (a killed worker printed none)."""
    found = []
    for log in sorted(out.glob("worker-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        try:
            found.append(json.loads(lines[-1]))
        except (IndexError, json.JSONDecodeError):
            continue
    return [f for f in found if isinstance(f, dict)]


def print_summary(s: dict[str, Any]) -> None:
    retried = {k: int(v) for k, v in s.get("retries", {}).items() if v}
    print(f"[{s['verdict']}] {s['scenario']:<12} {s['implementation']:<11} "
          f"{s.get('backend', 'postgresql'):<10} {s.get('isolation', 'read committed'):<14} "
          f"ops checked {s['ops_checked']:>6} in {s['seconds']:>5} s  throughput before "
          f"faults {s['throughput_before_faults_ops_s']:>5}/s  faults {len(s['faults'])}  "
          f"porcupine {s['porcupine']} ({s['porcupine_seconds']} s)  invariants "
          f"{'ok' if not s['invariant_violations'] else s['invariant_violations']}  client "
          f"errors {s.get('client_errors', 0)}  retried {retried or 0}", flush=True)
    for f in s["faults"]:
        print(f"      {f}", flush=True)
    if s.get("cancellations"):
        print(f"      transactions cancelled {s['cancellations']} over {s['holds']} holds, "
              f"calls cancelled {s['cancelled_calls']}, given up after "
              f"{CANCEL_TX_BUDGET_S:g} s {s['cancel_tx_given_up']}", flush=True)
    if s["stalled"]:
        print(f"      stalled: {s['stalled']}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="tsoracle-lincheck")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--run", required=True)
    w.add_argument("--control", required=True)
    w.add_argument("--proc", type=int, required=True)
    w.add_argument("--clients", type=int, default=4)
    w.add_argument("--cap", type=float, default=DEFAULT_CAP_S)
    w.add_argument("--retry-budget", type=float,
                   help="seconds each call retries a failing database (default: the library's)")
    w.add_argument("--clock-skew", action="store_true", help="follow the control clock offset")
    w.add_argument("--broken", help="run a deliberately broken oracle (checker self-test)")
    w.add_argument("--by-incarnation", action="store_true",
                   help="key every timeline by the incarnation it ran on (reprovision)")
    w.add_argument("--lossy", action="store_true",
                   help="reach PostgreSQL through a relay that loses replies (lost-replies)")
    w.add_argument("--spark-client", action="store_true",
                   help="drive the oracle through the Spark driver's OracleClient")
    w.add_argument("--cancellations", action="store_true",
                   help="cancel calls and transactions (cancelled-transactions)")
    for name in ("run", "all", "soak"):
        r = sub.add_parser(name)
        r.add_argument("--min-ops", type=int, default=3000 if name != "soak" else 100_000,
                       help="operations each scenario completes before it stops")
        r.add_argument("--cap", type=float, default=DEFAULT_CAP_S * (1 if name != "soak" else 20),
                       help="seconds after which a scenario counts as hung")
        r.add_argument("--out", help="a new folder (default: .lincheck/<time>-<pid>)")
        r.add_argument("--processes", type=int, default=4)
        r.add_argument("--clients", type=int, default=4)
        if name == "run":
            r.add_argument("--scenario", choices=SCENARIOS, required=True)
            r.add_argument("--implementation", choices=("distributed", "legacy"),
                           required=True)
            r.add_argument("--isolation", choices=ISOLATIONS, default="read committed")
            r.add_argument("--backend", choices=BACKENDS, default="postgresql",
                           help=f"sqlite: {', '.join(SQLITE_SCENARIOS)} only")
    a = p.parse_args()
    if a.cmd == "worker":
        if a.spark_client:
            spark_worker(a)
        else:
            asyncio.run(worker(a))
        return 0
    todo = ([(a.scenario, a.implementation, a.isolation, a.backend)] if a.cmd == "run" else
            [(*c, "postgresql") for c in combos()]
            + [(s, i, "serializable", "sqlite") for s, i in sqlite_combos()])
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    base = Path(a.out) if a.out else CHECKOUT / ".lincheck" / stamp
    failed = 0
    for scenario, impl, isolation, backend in todo:
        name = f"{scenario}-{impl}" + ("-sqlite" if backend == "sqlite" else
                                       "-serializable" if isolation == "serializable" else "")
        try:
            s = run(scenario, impl, out=base / name, processes=a.processes,
                    clients=a.clients, min_ops=a.min_ops, cap_s=a.cap,
                    isolation="read committed" if backend == "sqlite" else isolation,
                    backend=backend)
        except ValueError as exc:
            print(f"lincheck: error: {exc}", file=sys.stderr)
            return 2
        print_summary(s)
        failed += s["verdict"] != "pass"
    print(f"{len(todo) - failed} passed, {failed} failed; histories in {base}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
