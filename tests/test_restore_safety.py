"""A restored database must not make the oracle hand out a timestamp twice.

A backup is taken while a writer runs and restored under the live oracle objects (pg_dump and
psql in one transaction on PostgreSQL, SQLite's online backup API): they refuse the rewound
rows (TimestampFallback, counted by the metric) instead of repeating timestamps; `advance`
repairs the timeline, and writers after the repair, in this process and in a new one, hand out
only timestamps nobody saw.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import tsoracle
from tsoracle.errors import TimestampFallback
from tsoracle.oracle import advance_timeline, advance_timelines, positions
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.metrics import FALLBACK
from tsoracle.oracle.provision import drop_deployment
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.store import Tx, parse_url

COUNTER = "counter:orders"
EPOCH_MS = tsoracle.EPOCH_MILLISECONDS


COLUMNS = {
    "deployment": ("id", "epoch", "implementation", "fence", "rollout", "incarnation", "owner",
                   "generation"),
    "timestamps": ("timeline", "implementation", "read_ts", "write_ts", "leader_epoch", "epoch",
                   "active", "fence", "rollout", "incarnation"),
}


class Backup:
    """A copy of the oracle's database, taken and restored while the oracles keep running.

    PostgreSQL: pg_dump of the schema, restored with psql in one transaction (DROP SCHEMA, then
    the dump). SQLite: a file cannot be restored under processes that keep it open (they keep
    the old file, or its WAL), so the rows are copied and put back in one transaction through
    the backend, which is what a restore does to them.
    """

    def __init__(self, url: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.url = url
        self.parsed = parse_url(url)
        self.file = tmp_path / "backup.sql"
        self.pg = request.getfixturevalue("pg") if self.parsed.kind == "postgresql" else None
        self.rows: dict[str, list[tuple[object, ...]]] = {}

    async def take(self) -> None:
        if self.pg is not None:
            await asyncio.to_thread(
                subprocess.run, [str(self.pg.bin / "pg_dump"), "-d", self.pg.admin_dsn(),
                                 "-n", self.parsed.schema, "-f", str(self.file)],
                check=True, capture_output=True, text=True, timeout=60)
            return

        async def copy(tx: Tx) -> None:
            for table, columns in COLUMNS.items():
                self.rows[table] = await tx.fetch(f"SELECT {', '.join(columns)} FROM {{{table}}}")

        async with admin_backend(self.url) as backend:
            await backend.transaction(copy)

    async def restore(self) -> None:
        if self.pg is not None:
            # The live oracles' statements wait for the transaction, then find the old rows.
            await asyncio.to_thread(
                subprocess.run, [str(self.pg.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                 "-1", "-d", self.pg.admin_dsn(), "-c",
                                 f'DROP SCHEMA "{self.parsed.schema}" CASCADE',
                                 "-f", str(self.file)],
                check=True, capture_output=True, text=True, timeout=60)
            return

        async def put_back(tx: Tx) -> None:
            for table, columns in COLUMNS.items():
                await tx.fetch(f"DELETE FROM {{{table}}}")
                insert = (f"INSERT INTO {{{table}}} ({', '.join(columns)}) VALUES ("
                          + ", ".join(f"%({c})s" for c in columns) + ")")
                for row in self.rows[table]:
                    await tx.fetch(insert, dict(zip(columns, row, strict=True)))

        async with admin_backend(self.url) as backend:
            await backend.transaction(put_back)


class Writer:
    """write_ts, apply_write, read_ts (or read_ts alone) in a loop, keeping every answer and
    every error."""

    def __init__(self, oracle: tsoracle.TimestampOracle | ReopeningOracle, *,
                 reads_only: bool = False) -> None:
        self.oracle = oracle
        self.reads_only = reads_only
        self.writes: list[int] = []
        self.reads: list[int] = []
        self.errors: Counter[str] = Counter()
        self.fallbacks: list[TimestampFallback] = []
        self.running = asyncio.Event()
        self.running.set()
        self._paused = asyncio.Event()
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Writer:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        self._stop = True
        self.running.set()
        assert self._task is not None
        await self._task

    async def pause(self) -> None:
        """Stop after the step in progress (returns once it finished)."""
        self._paused.clear()
        self.running.clear()
        await self._paused.wait()

    async def _run(self) -> None:
        while not self._stop:
            if not self.running.is_set():
                self._paused.set()
                await self.running.wait()
                continue
            try:
                if not self.reads_only:
                    w = (await self.oracle.write_ts()).timestamp
                    self.writes.append(w)
                    await self.oracle.apply_write(w)
                self.reads.append(await self.oracle.read_ts())
            except tsoracle.OracleError as exc:
                self.errors[type(exc).__name__] += 1
                if isinstance(exc, TimestampFallback):
                    self.fallbacks.append(exc)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)

    async def until(self, done: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, \
                f"{what}: {self.errors}, {len(self.writes)} writes, last {self.writes[-1:]}"
            await asyncio.sleep(0.01)

    def check(self) -> None:
        """One writer: its writes strictly increase, its reads never go back."""
        assert all(a < b for a, b in zip(self.writes, self.writes[1:], strict=False)), \
            self.writes
        assert all(a <= b for a, b in zip(self.reads, self.reads[1:], strict=False)), self.reads


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tsoracle.cli", *args, "--url", url],
                          capture_output=True, text=True, timeout=120)


async def fresh_process_write(url: str, timeline: str, implementation: str) -> int:
    """A writer started after the repair, in a process that saw nothing before."""
    args = ["ts", "write", "--timeline", timeline]
    if implementation == "legacy":
        args.append("--take-leadership")
    done = await asyncio.to_thread(cli, *args, url=url)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def opener(url: str, timeline: str, implementation: str,
           now: Callable[[], int] | None) -> Callable[[], Awaitable[tsoracle.TimestampOracle]]:
    def open_() -> Awaitable[tsoracle.TimestampOracle]:
        return tsoracle.open_oracle(url, timeline=timeline, implementation=implementation,
                                    window=5, now=now)
    return open_


@pytest.mark.parametrize("timeline", [COUNTER, EPOCH_MS])
async def test_a_restore_under_live_writers_repeats_no_timestamp(url, impl, timeline, request,
                                                                 tmp_path):
    # On EpochMilliseconds a clock that stands still makes write_ts count, as it does whenever
    # writes run ahead of the clock: the rewound rows are then all write_ts has to go on.
    frozen = time.time_ns() // 1_000_000
    now = (lambda: frozen) if timeline == EPOCH_MS else None
    await tsoracle.init(url, timelines=[timeline], implementation=impl)
    backup = Backup(url, request, tmp_path)
    fallbacks_before = FALLBACK.total(timeline=timeline)
    live = ReopeningOracle(opener(url, timeline, impl, now), name=timeline, take_over=True)
    writer = Writer(live).start()
    await writer.until(lambda: len(writer.writes) >= 10, "first writes")
    await backup.take()
    async with admin_backend(url) as backend:
        dumped = (await positions(backend))[timeline]
    # Far enough past the backup that the writer reserved (legacy) and handed out timestamps
    # the restore forgets.
    await writer.until(lambda: writer.writes[-1] > dumped + 40, "writes past the backup")

    if impl == "distributed":
        # A reader runs through the restore. The writer waits between two calls: an
        # apply_write in flight across the restore raises the rows back to its own timestamp
        # (apply_write(t) leaves write_ts >= t), a repair for this process that would race
        # with the refusal under test.
        reader = Writer(await tsoracle.open_oracle(url, timeline=timeline, read_only=True,
                                                   now=now), reads_only=True).start()
        await reader.until(lambda: len(reader.reads) >= 5, "first reads")
        await writer.pause()
        await backup.restore()
        await reader.until(lambda: len(reader.fallbacks) >= 1, "reads after the restore")
        await reader.stop()
        reader.check()
        assert reader.fallbacks[0].kind == "read_ts"
        assert set(reader.errors) <= {"TimestampFallback", "OracleUnavailable", "NotInitialized"}
        await reader.oracle.close()
        writer.running.set()
        await writer.until(lambda: len(writer.fallbacks) >= 3, "fallbacks after the restore")
        await writer.pause()
    else:
        # A live legacy leader serves from its reserved window in memory, and its next
        # reservation raises the rows again: it never repeats itself. The danger is a new
        # leader (a failover) starting from the rewound rows: in this process it is refused.
        await writer.pause()
        leader = await live.current()
        if leader._prefetch is not None:  # a reservation in flight would repair the rows
            await asyncio.wait({leader._prefetch})
        await backup.restore()
        with pytest.raises(TimestampFallback) as failover:
            await tsoracle.open_oracle(url, timeline=timeline, implementation="legacy")
        assert failover.value.seen >= writer.writes[-1]
        # The live client, fenced by that attempt, takes the timeline back: refused too.
        writer.running.set()
        await writer.until(lambda: len(writer.fallbacks) >= 2, "fallbacks after the failover")
        await writer.pause()

    seen = max(writer.writes + writer.reads)
    fell = writer.fallbacks[-1]
    assert fell.timeline == timeline and fell.seen >= seen and fell.got <= fell.seen
    assert "tsoracle advance --timeline" in str(fell) and "timestamp-fallback.md" in str(fell)
    assert isinstance(fell, tsoracle.OracleUnavailable) and not isinstance(fell, tsoracle.Fenced)
    assert FALLBACK.total(timeline=timeline) - fallbacks_before >= len(writer.fallbacks)
    writer.check()
    assert set(writer.errors) <= {"TimestampFallback", "OracleUnavailable", "NotInitialized",
                                  "LeadershipLost"}, writer.errors

    # The repair: up to what the clients saw (the error names this process's own mark, which
    # for a legacy leader covers the window it reserved).
    async with admin_backend(url) as backend:
        assert (await positions(backend))[timeline] < fell.seen
        repaired = await advance_timeline(backend, timeline, fell.seen)
    assert repaired.changed and repaired.after == fell.seen
    assert repaired.fenced == (impl == "legacy")
    earlier = set(writer.writes) | set(writer.reads)

    errors_before = sum(writer.errors.values())
    writer.running.set()  # the same live objects go on, above the repair
    await writer.until(lambda: writer.writes[-1] > fell.seen + 5, "writes after the repair")
    await writer.stop()
    after = [w for w in writer.writes if w > seen]
    assert after and min(after) > fell.seen
    assert sum(writer.errors.values()) == errors_before
    writer.check()
    new = await fresh_process_write(url, timeline, impl)
    assert new > max(writer.writes) and new not in earlier
    await live.close()


async def test_the_mark_is_shared_by_the_oracles_of_a_process(url, request, tmp_path):
    await tsoracle.init(url, timelines=[COUNTER])
    backup = Backup(url, request, tmp_path)
    await backup.take()
    async with tsoracle.connect(url, timeline=COUNTER) as first:
        for _ in range(20):
            w = (await first.write_ts()).timestamp
            await first.apply_write(w)
    await backup.restore()
    # Opened after the restore, it never saw the timeline itself: the process did.
    reopening = ReopeningOracle(lambda: tsoracle.open_oracle(url, timeline=COUNTER),
                                name=COUNTER)
    with pytest.raises(TimestampFallback) as err:
        await reopening.write_ts()
    assert err.value.kind == "write_ts" and err.value.seen == w
    with pytest.raises(TimestampFallback) as err:
        await reopening.read_ts()
    assert err.value.kind == "read_ts" and err.value.seen == w and err.value.got == 0
    with pytest.raises(TimestampFallback):
        await reopening.peek_write_ts()
    assert reopening.reopens == 0  # not a fence: reopening would find the same rows
    await reopening.close()
    # A process that saw nothing (the CLI) cannot tell: that is what the operator's mark and
    # `tsoracle advance` are for.
    done = await asyncio.to_thread(cli, "ts", "read", "--timeline", COUNTER, url=url)
    assert done.returncode == 0 and int(done.stdout) == 0


async def test_a_restore_from_before_a_flip_is_refused_after_reopening(url, request, tmp_path):
    # The backup predates a flip: the restore brings back the old epoch and implementation.
    # The live client is fenced, reopens on the implementation the restored rows name, and
    # that fresh oracle is checked against what the process saw before.
    await tsoracle.init(url, timelines=[COUNTER])
    backup = Backup(url, request, tmp_path)
    await backup.take()
    follow = ReopeningOracle(lambda: tsoracle.open_oracle(url, timeline=COUNTER,
                                                          implementation=None), name=COUNTER)
    for _ in range(3):
        await follow.apply_write((await follow.write_ts()).timestamp)
    await tsoracle.flip(url, to="legacy")
    last = (await follow.write_ts()).timestamp
    assert follow.reopens == 1
    await backup.restore()
    with pytest.raises(TimestampFallback) as err:
        await follow.write_ts()
    assert follow.reopens == 2 and err.value.seen >= last
    assert (await tsoracle.status(url)).deployment.implementation == "distributed"
    await follow.close()


async def test_no_fallback_is_reported_under_concurrency_and_flips(url):
    await tsoracle.init(url, timelines=[COUNTER])
    fallbacks_before = FALLBACK.total(timeline=COUNTER)
    follow = ReopeningOracle(lambda: tsoracle.open_oracle(url, timeline=COUNTER,
                                                          implementation=None, window=3),
                             name=COUNTER, take_over=True)
    stop = asyncio.Event()
    seen: list[int] = []

    async def client(i: int) -> None:
        while not stop.is_set():
            w = (await follow.write_ts()).timestamp
            seen.append(w)
            if i % 2:
                await follow.apply_write(w)
            seen.append(await follow.read_ts())
            seen.append(await follow.peek_write_ts())

    async def distributed_reader() -> None:
        # A second oracle of the same timeline in this process, batching reads while the other
        # applies: answers that arrive out of order are no fallback.
        async with tsoracle.connect(url, timeline=COUNTER, read_only=True) as reader:
            while not stop.is_set():
                try:
                    await asyncio.gather(*[reader.read_ts() for _ in range(8)])
                except tsoracle.Fenced:
                    return

    async def answers(n: int) -> None:
        """Until the clients have seen `n` more answers (or one of them failed)."""
        target = len(seen) + n
        while len(seen) < target and not any(t.done() for t in clients):
            await asyncio.sleep(0.01)

    clients = [asyncio.ensure_future(client(i)) for i in range(16)]
    tasks = [*clients, asyncio.ensure_future(distributed_reader())]  # the reader ends fenced
    # Sized by answers, not time: every implementation serves traffic before it is flipped.
    for to in ("legacy", "distributed", "legacy", "distributed"):
        await asyncio.wait_for(answers(30), 120)
        await tsoracle.flip(url, to=to)
    await asyncio.wait_for(answers(30), 120)
    stop.set()
    await asyncio.gather(*tasks)
    await follow.close()
    assert len(seen) >= 150
    assert FALLBACK.total(timeline=COUNTER) == fallbacks_before


async def test_a_reprovisioned_deployment_starts_over_without_fallback(url):
    await tsoracle.init(url, timelines=[COUNTER])
    async with tsoracle.connect(url, timeline=COUNTER) as old:
        for _ in range(5):
            await old.apply_write((await old.write_ts()).timestamp)
    async with admin_backend(url) as backend:
        await drop_deployment(backend)
    await tsoracle.init(url, timelines=[COUNTER])
    # Timestamps restart on purpose in a new incarnation: not the same deployment going back.
    async with tsoracle.connect(url, timeline=COUNTER) as new:
        assert (await new.write_ts()).timestamp == 1
        assert await new.read_ts() == 0


async def test_advance_moves_forward_only_within_bounds(url):
    await tsoracle.init(url, timelines=[COUNTER, EPOCH_MS])
    async with tsoracle.connect(url, timeline=COUNTER) as o:
        await o.apply_write((await o.write_ts()).timestamp)
    async with admin_backend(url) as backend:
        same = await advance_timeline(backend, COUNTER, 1)
        assert (same.before, same.after, same.changed, same.fenced) == (1, 1, False, False)
        up = await advance_timeline(backend, COUNTER, 500)
        assert (up.before, up.after, up.changed) == (1, 500, True)
        with pytest.raises(tsoracle.ConfigError, match="jumps 1000000001 timestamps"):
            await advance_timeline(backend, COUNTER, 500 + 10**9 + 1)
        forced = await advance_timeline(backend, COUNTER, 500 + 10**9 + 1, force=True)
        assert forced.after == 500 + 10**9 + 1
        wall = time.time_ns() // 1_000_000
        with pytest.raises(tsoracle.ConfigError, match="ahead of this machine's wall clock"):
            await advance_timeline(backend, EPOCH_MS, wall + 10 * 60_000)
        near = await advance_timeline(backend, EPOCH_MS, wall)  # however far from 0
        assert near.after == wall
        with pytest.raises(tsoracle.UnknownTimeline):
            await advance_timeline(backend, "counter:nope", 5)
        with pytest.raises(tsoracle.ConfigError, match="not an integer"):
            await advance_timeline(backend, COUNTER, -1)
        assert (await positions(backend)) == {COUNTER: 500 + 10**9 + 1, EPOCH_MS: wall}
    async with tsoracle.connect(url, timeline=COUNTER) as o:
        assert await o.read_ts() == 500 + 10**9 + 1
        assert (await o.write_ts()).timestamp == 500 + 10**9 + 2


async def test_advance_on_a_legacy_deployment_fences_its_leaders(url):
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    live = ReopeningOracle(lambda: tsoracle.open_oracle(url, timeline=COUNTER,
                                                        implementation="legacy"), name=COUNTER)
    w = (await live.write_ts()).timestamp
    async with admin_backend(url) as backend:
        epoch = (await tsoracle.status(url)).deployment.epoch
        done = await advance_timeline(backend, COUNTER, 10_000)
    assert done.fenced and done.epoch == epoch + 1
    # The leader reopens (Fenced, not LeadershipLost) and starts from the advanced row.
    nxt = (await live.write_ts()).timestamp
    assert nxt > 10_000 > w and live.reopens == 1
    # Below the window the process's leader reserved, the reopened leader is refused.
    async with admin_backend(url) as backend:
        await backend.fetch("UPDATE {timestamps} SET read_ts = %(z)s, write_ts = %(z)s",
                            {"z": backend.enc(0)})
        await advance_timeline(backend, COUNTER, 10_000)
    with pytest.raises(TimestampFallback):
        await live.write_ts()
    await live.close()


async def test_several_timelines_move_in_one_transaction_and_one_epoch(url):
    # The operator repairs every timeline of a restored deployment at once: one fence, not one
    # per timeline (five in 30 minutes would page as TsoracleEpochFlapping).
    other = "counter:other"
    await tsoracle.init(url, timelines=[COUNTER, other, EPOCH_MS], implementation="legacy")
    epoch = (await tsoracle.status(url)).deployment.epoch
    async with admin_backend(url) as backend:
        done = await advance_timelines(backend, {COUNTER: 100, other: 200, EPOCH_MS: 0})
        assert {n: (r.before, r.after, r.changed) for n, r in done.items()} == {
            COUNTER: (0, 100, True), other: (0, 200, True), EPOCH_MS: (0, 0, False)}
        assert {r.epoch for r in done.values()} == {epoch + 1}
        assert await positions(backend) == {COUNTER: 100, other: 200, EPOCH_MS: 0}
        # Nothing to move: nothing written, no fence.
        again = await advance_timelines(backend, {COUNTER: 50, other: 200})
        assert not any(r.changed or r.fenced for r in again.values())
        assert {r.epoch for r in again.values()} == {epoch + 1}
        # One refused target refuses them all.
        with pytest.raises(tsoracle.ConfigError):
            await advance_timelines(backend, {COUNTER: 300, other: 10**10})
        assert await positions(backend) == {COUNTER: 100, other: 200, EPOCH_MS: 0}


async def test_the_metric_is_served_from_the_start_and_counts(url):
    from tests.test_metrics import scrape

    port = tsoracle.serve_metrics(0)
    timeline = f"counter:metric-{uuid.uuid4().hex[:8]}"
    await tsoracle.init(url, timelines=[timeline])
    key = f'tsoracle_timestamp_fallback_total{{timeline="{timeline}"}}'
    async with tsoracle.connect(url, timeline=timeline) as o:
        assert scrape(port)[key] == 0  # a rate over it is 0 before anything happens
        await o.apply_write((await o.write_ts()).timestamp)
        async with admin_backend(url) as backend:  # what a restore does to the row
            await backend.fetch("UPDATE {timestamps} SET read_ts = %(z)s, write_ts = %(z)s",
                            {"z": backend.enc(0)})
        for call in (o.write_ts, o.read_ts):
            with pytest.raises(TimestampFallback):
                await call()
    scraped = scrape(port)
    assert scraped[key] == 2
    failed = ('tsoracle_operations_failed_total{error="TimestampFallback",'
              'implementation="distributed",operation="read_ts"}')
    assert scraped[failed] >= 1


# --- tsoracle advance ------------------------------------------------------------------------


@pytest.mark.served  # the CLI in a process of its own
def test_advance_command(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert cli("init", "--timeline", COUNTER, "--implementation", "legacy",
               url=url).returncode == 0
    up = cli("advance", "--timeline", COUNTER, "--to", "1000", url=url)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == (f"advanced {COUNTER} from 0 to 1000; epoch 2: legacy leaders "
                                 "were fenced and reopen above it")
    same = cli("advance", "--timeline", COUNTER, "--to", "999", url=url)
    assert same.returncode == 0
    assert same.stdout.strip() == (f"{COUNTER} is already at 1000, at or above 999: nothing "
                                   "changed")
    as_json = json.loads(cli("advance", "--timeline", COUNTER, "--to", "1001", "-o", "json",
                             url=url).stdout)
    assert as_json == {"timeline": COUNTER, "to": 1001, "before": 1000, "after": 1001,
                       "changed": True, "epoch": 3, "fenced": True}
    far = str(1001 + 10**9 + 1)
    refused = cli("advance", "--timeline", COUNTER, "--to", far, url=url)
    assert refused.returncode == 1
    assert "more than 1000000000; check the target, or pass --force if it is meant" \
        in refused.stderr
    forced = cli("advance", "--timeline", COUNTER, "--to", far, "--force", url=url)
    assert forced.returncode == 0 and far in forced.stdout
    ts = cli("ts", "write", "--timeline", COUNTER, "--take-leadership", url=url)
    assert int(ts.stdout) > int(far)


@pytest.mark.served  # the CLI in a process of its own
@pytest.mark.parametrize("args, needle", [
    (["--timeline", COUNTER, "--to", "ten"], "--to 'ten' is not a timestamp"),
    (["--timeline", COUNTER, "--to", "-5"], "is not an integer in [0, 18446744073709551615]"),
    (["--timeline", "bogus", "--to", "5"], "unknown timeline 'bogus'"),
    (["--timeline", "counter:absent", "--to", "5"], "does not exist in the backend"),
    (["--timeline", EPOCH_MS, "--to", str(2**62)], "ahead of this machine's wall clock"),
])
def test_advance_errors_are_one_line(args, needle, tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert cli("init", "--timeline", COUNTER, "--timeline", EPOCH_MS, url=url).returncode == 0
    r = cli("advance", *args, url=url)
    assert r.returncode == 1, r.stdout
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_advance_help_states_its_limits():
    out = subprocess.run([sys.executable, "-m", "tsoracle.cli", "advance", "--help"],
                         capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(out.split())
    assert "forward only" in flat and "1000000000" in flat and "60000 ms" in flat
    assert "timestamp-fallback.md" in flat
