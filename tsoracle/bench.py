"""Closed-loop benchmark of the oracle, with two physical-limit probes measured in the same run.

Probes: the bare round trip of one prepared single-row SELECT (the floor of any backend
operation), and the pure-asyncio ceiling: N tasks waiting on futures that a resolver completes a
batch at a time, with no I/O (the most any batched oracle could do in one Python process).
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from tsoracle.oracle import GroupCommitter, flip, init, open_oracle
from tsoracle.oracle import metrics as m
from tsoracle.output import table
from tsoracle.store import open_backend, parse_url, with_schema

TIMELINE = "counter:bench"
BENCH_SCHEMA = "tsoracle_bench"
APPEND_SECONDS = 0.010  # the simulated changelog append of a group commit


@dataclass
class Result:
    mode: str
    implementation: str
    batching: bool
    concurrency: int
    ops: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    queries: int
    queries_per_s: float
    queries_per_op: float
    mean_batch: float
    groups: int = 0  # group commits (write/mixed modes)
    queries_per_commit: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def bench_url(url: str) -> str:
    """The URL of the benchmark's own schema; a URL naming any other schema is refused.

    A benchmark flips its deployment and adds a timeline: run against a production schema
    (say through $TSORACLE_URL) it would move that deployment to another implementation.
    """
    return with_schema(
        url, BENCH_SCHEMA,
        accept=lambda named: named == BENCH_SCHEMA or named.startswith(BENCH_SCHEMA + "_"),
        refusal=f"tsoracle bench runs only in its own schema {BENCH_SCHEMA!r} (or "
                f"{BENCH_SCHEMA}_*), because it flips that deployment; the URL names schema "
                "{named!r}: drop ?schema= from --url or $TSORACLE_URL")


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] * 1000


def _queries(impl: str, statements: tuple[str, ...] = ()) -> int:
    if not statements:
        return int(m.BACKEND_QUERIES.total(implementation=impl))
    return int(sum(m.BACKEND_QUERIES.total(statement=s, implementation=impl)
                   for s in statements))


READ_STATEMENTS = ("read", "confirm_leadership")  # what answers a batch of read_ts callers
COMMIT_STATEMENTS = ("write", "apply", "reserve_window")


async def _closed_loop(op: Callable[[], Awaitable[Any]], concurrency: int,
                       seconds: float) -> tuple[list[float], float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        record = latencies.append
        clock = time.perf_counter
        while True:
            start = clock()
            if start >= deadline:
                return
            await op()
            record(clock() - start)

    began = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return latencies, time.perf_counter() - began


async def run_one(url: str, *, mode: str, implementation: str, batching: bool,
                  concurrency: int, seconds: float, pipeline_depth: int | None = None) -> Result:
    await flip(url, to=implementation)  # the bench schema is ours to flip
    oracle = await open_oracle(url, timeline=TIMELINE, implementation=implementation,
                               batching=batching, fencing="Always",
                               pipeline_depth=pipeline_depth,
                               pool_size=max(10, (pipeline_depth or 1) + 4))
    try:
        groups = 0

        def count_group(_n: int) -> None:
            nonlocal groups
            groups += 1

        async def append(_ts: int, _payloads: list[None]) -> None:
            await asyncio.sleep(APPEND_SECONDS)

        committer = GroupCommitter(oracle, append, on_group=count_group)
        turn = [False]

        async def mixed() -> None:
            turn[0] = not turn[0]
            if turn[0]:
                await oracle.read_ts()
            else:
                await committer.commit(None)

        op: Callable[[], Awaitable[Any]] = {
            "read": oracle.read_ts,
            "write": lambda: committer.commit(None),
            "mixed": mixed,
        }[mode]
        await _closed_loop(op, min(concurrency, 8), 0.2)  # warm the pool and prepared plans
        groups = 0
        q0 = _queries(implementation)
        r0 = _queries(implementation, READ_STATEMENTS)
        c0 = _queries(implementation, COMMIT_STATEMENTS)
        latencies, elapsed = await _closed_loop(op, concurrency, seconds)
        queries = _queries(implementation) - q0
        read_queries = _queries(implementation, READ_STATEMENTS) - r0
        commit_queries = _queries(implementation, COMMIT_STATEMENTS) - c0
        depth = oracle.pipeline_depth
    finally:
        await oracle.close()
    latencies.sort()
    n = len(latencies)
    reads = n if mode == "read" else n // 2 if mode == "mixed" else 0
    return Result(
        mode=mode, implementation=implementation, batching=batching, concurrency=concurrency,
        ops=n, seconds=elapsed, ops_per_s=n / elapsed,
        p50_ms=_pct(latencies, 0.50), p95_ms=_pct(latencies, 0.95),
        p99_ms=_pct(latencies, 0.99), max_ms=(latencies[-1] * 1000 if n else 0.0),
        queries=queries, queries_per_s=queries / elapsed,
        queries_per_op=queries / n if n else 0.0,
        mean_batch=(reads / read_queries) if read_queries and reads else 0.0,
        groups=groups,
        queries_per_commit=((queries if mode == "write" else commit_queries) / groups
                            if groups else 0.0),
        extra={"pipeline_depth": depth},
    )


async def probe_bare_select(url: str, seconds: float = 1.0) -> dict[str, float]:
    """Latency of one single-row SELECT on the backend's own pinned connection (for
    PostgreSQL: one connection, one cursor, a prepared statement, the fastest path)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    backend = open_backend(parse_url(url))
    await backend.open()
    pinned = backend.pinned()
    try:
        query = ("SELECT read_ts FROM {timestamps} WHERE timeline = %(timeline)s"
                 " AND implementation = 'distributed'")
        params = {"timeline": TIMELINE}
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await pinned.fetch(query, params)
            latencies.append(time.perf_counter() - start)
    finally:
        await pinned.close()
        await backend.close()
    latencies.sort()
    return {"p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99),
            "ops_per_s": len(latencies) / seconds}


async def probe_asyncio_ceiling(concurrency: int, seconds: float = 1.0) -> float:
    """Ops/s when N waiters are completed a batch at a time with no I/O at all."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[int]] = []
    wake = asyncio.Event()
    done = 0
    deadline = time.perf_counter() + seconds

    async def resolver() -> None:
        while time.perf_counter() < deadline or waiting:
            await wake.wait()
            wake.clear()
            batch, waiting[:] = list(waiting), []
            for fut in batch:
                fut.set_result(0)
            await asyncio.sleep(0)

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            fut = loop.create_future()
            waiting.append(fut)
            wake.set()
            await fut
            done += 1

    began = time.perf_counter()
    task = asyncio.create_task(resolver())
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    elapsed = time.perf_counter() - began
    wake.set()
    await task
    return done / elapsed


async def run_bench(url: str, *, modes: list[str], implementations: list[str],
                    concurrencies: list[int], seconds: float, batching: list[bool],
                    on_result: Callable[[Result], None] | None = None,
                    pipeline_depth: int | None = None) -> dict[str, Any]:
    url = bench_url(url)
    await init(url, timelines=[TIMELINE])
    results = []
    for mode in modes:
        for impl in implementations:
            for c in concurrencies:
                for b in batching:
                    r = await run_one(url, mode=mode, implementation=impl, batching=b,
                                      concurrency=c, seconds=seconds,
                                      pipeline_depth=pipeline_depth)
                    if mode == "read":
                        r.extra["asyncio_ceiling_ops_per_s"] = await probe_asyncio_ceiling(
                            c, min(seconds, 1.0))
                    results.append(r)
                    if on_result is not None:
                        on_result(r)
    bare = await probe_bare_select(url, min(seconds, 2.0))
    return {"event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "bare_select": bare, "results": [asdict(r) for r in results],
            "summary": summarize(results, bare)}


def summarize(results: list[Result], bare: dict[str, float]) -> dict[str, Any]:
    """The ratios the performance goals are stated in, all from this one run."""
    out: dict[str, Any] = {}
    by_key = {(r.mode, r.implementation, r.batching, r.concurrency): r for r in results}
    for (mode, impl, batching, c), r in by_key.items():
        if mode != "read" or not batching:
            continue
        key = f"read/{impl}/c{c}"
        entry: dict[str, float] = {"queries_per_op": r.queries_per_op}
        raw = by_key.get((mode, impl, False, c))
        if raw is not None and raw.ops_per_s:
            entry["batched_over_raw"] = r.ops_per_s / raw.ops_per_s
        ceiling = r.extra.get("asyncio_ceiling_ops_per_s")
        if ceiling:
            entry["share_of_asyncio_ceiling"] = r.ops_per_s / ceiling
        if c == 1 and bare.get("p50_ms"):
            entry["p50_over_bare_select"] = r.p50_ms / bare["p50_ms"]
        out[key] = entry
    return out


PROGRESS_AFTER_S = 3.0  # runs planned longer than this report each finished measurement


class Progress:
    """A line per finished measurement ("k/N" and the time elapsed) on `file`, for runs planned
    longer than a few seconds; the caller passes stderr so that `-o json` stays clean."""

    def __init__(self, *, modes: list[str], implementations: list[str],
                 concurrencies: list[int], batching: list[bool], seconds: float,
                 file: TextIO) -> None:
        per_mode = len(implementations) * len(concurrencies) * len(batching)
        self.total = len(modes) * per_mode
        reads = per_mode if "read" in modes else 0
        # Each measurement warms up for 0.2 s; reads add the asyncio probe; the run ends with
        # the bare SELECT probe.
        self.planned = (self.total * (seconds + 0.2) + reads * min(seconds, 1.0)
                        + min(seconds, 2.0))
        self.enabled = self.planned > PROGRESS_AFTER_S
        self.file = file
        self.done = 0
        self.started = time.monotonic()
        if self.enabled:
            self._say(f"tsoracle bench: {self.total} measurement(s) of {seconds:g} s, about "
                      f"{self.planned:.0f} s in all")

    def _say(self, line: str) -> None:
        print(line, file=self.file, flush=True)

    def finished(self, r: Result) -> None:
        self.done += 1
        if self.enabled:
            self._say(f"[{self.done}/{self.total}, {time.monotonic() - self.started:.1f} s] "
                      f"{r.mode} {r.implementation} {'batched' if r.batching else 'raw'}, "
                      f"{r.concurrency} client{'s' if r.concurrency > 1 else ''}: "
                      f"{r.ops_per_s:,.0f} ops/s, p50 "
                      f"{r.p50_ms:.3f} ms")


def report_text(report: dict[str, Any], seconds: float) -> str:
    """The report of `run_bench` as tables with plainly named columns and a legend."""
    rows = []
    for r in report["results"]:
        read = r["mode"] == "read"
        limit = r["extra"].get("asyncio_ceiling_ops_per_s")
        rows.append((
            r["mode"], r["implementation"], "batched" if r["batching"] else "raw",
            r["concurrency"], f"{r['ops_per_s']:,.0f}", f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}", f"{r['max_ms']:.1f}", f"{r['queries_per_op']:.4f}",
            f"{r['mean_batch']:.1f}" if r["mean_batch"] else None,
            None if read else r["groups"],
            None if read or not r["groups"] else f"{r['queries_per_commit']:.2f}",
            f"{limit:,.0f}" if limit else None,
        ))
    headers = ("MODE", "IMPLEMENTATION", "READ_TS", "CLIENTS", "OPS/S", "P50_MS", "P99_MS",
               "MAX_MS", "QUERIES/OP", "CALLERS/BATCH", "GROUP_COMMITS", "QUERIES/COMMIT",
               "NO_IO_LIMIT_OPS/S")
    # Columns of modes this run did not measure stay out (a read-only run has no commits).
    keep = [i for i in range(len(headers)) if any(row[i] is not None for row in rows)]
    out = [f"Measurements ({seconds:g} s each; every client calls again as soon as its call "
           "returns)",
           table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows],
                 indent=2)]
    bare = report["bare_select"]
    out.append("")
    out.append(textwrap.fill(
        "Bare SELECT round trip (one prepared single-row SELECT on one connection, the floor of "
        f"any backend call): p50 {bare['p50_ms']:.3f} ms, p99 {bare['p99_ms']:.3f} ms",
        width=100, subsequent_indent="  "))
    summary = report["summary"]
    if summary:
        ratio_rows = []
        for key, e in summary.items():
            _, impl, clients = key.split("/")
            ratio_rows.append((
                impl, clients.lstrip("c"), f"{e['queries_per_op']:.4f}",
                f"{e['batched_over_raw']:.2f}x" if "batched_over_raw" in e else None,
                f"{e['share_of_asyncio_ceiling']:.1%}" if "share_of_asyncio_ceiling" in e
                else None,
                f"{e['p50_over_bare_select']:.2f}x" if "p50_over_bare_select" in e else None,
            ))
        out += ["\nBatched reads against their limits",
                table(("IMPLEMENTATION", "CLIENTS", "QUERIES/OP", "BATCHED/RAW",
                       "SHARE_OF_NO_IO_LIMIT", "P50/BARE_SELECT"), ratio_rows, indent=2)]
    shown = {headers[i] for i in keep} | ({"BATCHED/RAW"} if summary else set())
    out.append("")
    out += [textwrap.fill(f"{column}: {text}", width=100, subsequent_indent="  ")
            for column, text in LEGEND if column.split(",")[0] in shown]
    out.append("`-o json` keeps the original key names (asyncio_ceiling_ops_per_s, "
               "share_of_asyncio_ceiling, ...).")
    return "\n".join(out)


LEGEND = (
    ("READ_TS", "batched lets one backend statement answer every read_ts caller waiting for "
                "it; raw sends one statement per call."),
    ("QUERIES/OP", "backend statements per operation (below 1 when calls share a statement)."),
    ("CALLERS/BATCH", "read_ts calls answered by one statement, on average."),
    ("GROUP_COMMITS, QUERIES/COMMIT", "rounds of one shared write_ts, a simulated 10 ms append "
                                      "and apply_write (write, mixed), and backend statements "
                                      "per round."),
    ("NO_IO_LIMIT_OPS/S", "as many asyncio tasks completed a batch at a time with no I/O at "
                          "all: the most one Python process could do."),
    ("BATCHED/RAW, SHARE_OF_NO_IO_LIMIT, P50/BARE_SELECT",
     "batched ops/s over raw and over the no-I/O limit, and the batched p50 with one client "
     "over the bare SELECT's."),
)
