"""Timestamped tables: append-only Parquet changelogs stamped by the oracle.

Each commit writes one Parquet directory holding the rows plus `_ts` (the commit timestamp,
DECIMAL(20,0) because timestamps are unsigned 64-bit) and `_diff` (+1 insert, -1 retraction),
then records it in the catalog with a compare-and-set on the timeline's upper
(`tsoracle/spark/catalog.py`), then `apply_write`s. Readers pick a timestamp, read every
commit at or below it, and let Spark sum the diffs per row.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, IntegerType, StringType, StructField, StructType

from tsoracle.errors import ConfigError, OracleError
from tsoracle.oracle import GroupCommitter, common_timeline
from tsoracle.oracle.api import WriteTimestamp
from tsoracle.oracle.group_commit import Conflict
from tsoracle.spark import catalog
from tsoracle.spark.catalog import TableInfo
from tsoracle.spark.locations import check_table_name

if TYPE_CHECKING:
    from tsoracle.spark.client import OracleClient

log = logging.getLogger(__name__)
TS, DIFF = "_ts", "_diff"
# Columns the reader adds for itself: a prefix of its own, reserved, so no user column collides.
INTERNAL = "__tso_"
COUNT, COPY = INTERNAL + "n", INTERNAL + "copy"
COMMIT = INTERNAL + "commit"  # the directory level that keeps commits at one `_ts` apart


def _reserved(name: str) -> bool:
    # Spark resolves column names case-insensitively by default: `_TS` is `_ts`.
    low = name.lower()
    return low in (TS, DIFF) or low.startswith(INTERNAL)


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """Hadoop's file system for `path` and the path itself: one way to reach files, for local
    paths and URIs (file:, hdfs:, s3a:, ...) alike."""
    # The JVM gateway is not part of PySpark's typed API: reached as Any.
    context: Any = spark.sparkContext
    target = context._jvm.org.apache.hadoop.fs.Path(path)
    return target.getFileSystem(context._jsc.hadoopConfiguration()), target


def _delete(spark: SparkSession, path: str) -> None:
    fs, target = _fs(spark, path)
    fs.delete(target, True)


def _move(spark: SparkSession, source: str, target: str) -> None:
    fs, src = _fs(spark, source)
    dst = _fs(spark, target)[1]
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise OSError(f"could not move {source} to {target}")
    try:
        fs.delete(src.getParent(), False)  # the old `_ts=` directory, if nothing else is in it
    except Exception:  # noqa: BLE001 (py4j wraps Java's "directory not empty")
        pass


def _null_safe(left: DataFrame, right: DataFrame, cols: list[str]) -> Any:
    cond = None
    for c in cols:
        term = left[c].eqNullSafe(right[c])
        cond = term if cond is None else cond & term
    return cond


def _columns(schema: StructType) -> list[dict[str, Any]]:
    return [{"name": f.name, "type": f.dataType.simpleString(), "json": f.jsonValue()}
            for f in schema.fields]


class _Stamper:
    """What the group committer needs from an oracle, routed through the client's reopen logic."""

    def __init__(self, client: OracleClient, timeline: str) -> None:
        self.client, self.timeline = client, timeline

    async def write_ts(self) -> WriteTimestamp:
        return await self.client.acall(lambda o: o.write_ts(), self.timeline)

    async def apply_write(self, ts: int) -> None:
        await self.client.acall(lambda o: o.apply_write(ts), self.timeline)


class _FilesGone(Exception):
    """A committed path is missing on the file system (Spark's PATH_NOT_FOUND)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class TimestampedTable:
    def __init__(self, client: OracleClient, spark: SparkSession, info: TableInfo) -> None:
        self.client, self.spark, self.info = client, spark, info
        self.schema = StructType([StructField.fromJson(c["json"]) for c in info.columns])
        # Tracing / fault-injection hooks, around the catalog commit.
        self.before_commit: Callable[[int], None] | None = None
        self.after_commit: Callable[[int], None] | None = None
        self._written: dict[int, tuple[str, str, object]] = {}  # files kept for a retry
        self._committer = GroupCommitter(_Stamper(client, info.timeline),
                                         self._append_group, durable_appends=True,
                                         abandon=self._abandon)
        client.committers.append(self._committer)

    @classmethod
    def create(cls, client: OracleClient, spark: SparkSession, name: str, schema: StructType,
               *, keys: tuple[str, ...] = (), timeline: str) -> TimestampedTable:
        check_table_name(name)
        clash = [f.name for f in schema.fields if _reserved(f.name)]
        if clash:
            raise ConfigError(f"column names {clash} are reserved by tsoracle (_ts, _diff and "
                              f"names starting with {INTERNAL}, in any letter case); rename them")
        lowered = [f.name.lower() for f in schema.fields]
        dupes = sorted({n for n in lowered if lowered.count(n) > 1})
        if dupes:
            raise ConfigError(f"column names {dupes} differ only in letter case; Spark would "
                              "not tell them apart")
        missing = [k for k in keys if k not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"key columns {missing} are not in the schema of {name!r}")
        info = TableInfo(name, timeline, _columns(schema), list(keys),
                         f"{client.data_dir}/{name}")
        return cls(client, spark, client.run(catalog.register(client.backend, info)))

    @classmethod
    def open(cls, client: OracleClient, spark: SparkSession, name: str) -> TimestampedTable:
        check_table_name(name)
        return cls(client, spark, client.run(catalog.lookup(client.backend, name)))

    def drop(self) -> None:
        """Forget the table in the catalog, then delete its files (readers follow the catalog,
        so none is left pointing at a deleted file)."""
        self.client.run(catalog.drop(self.client.backend, self.name))
        _delete(self.spark, self.info.location)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def timeline(self) -> str:
        return self.info.timeline

    # --- writes ---------------------------------------------------------------------------

    def append(self, df: DataFrame, *, tag: str | None = None) -> int:
        """Insert the rows; returns the commit timestamp. Concurrent calls share a commit,
        except tagged ones (a stream's batches): those commit alone, once per tag."""
        self._check_schema(df)
        self._check_keys(df)
        if tag is not None:
            return self.client.run(self._commit_tagged(df, tag))
        return self.client.run(self._committer.commit((df, +1)))

    def retract(self, df: DataFrame) -> int:
        """Delete one occurrence of each given row. Rows that are not in the table are refused
        (`ConfigError`), checked against the state the retraction commits on top of."""
        self._check_schema(df)
        cols = self.schema.fieldNames()

        def frame(current: DataFrame, ts: int) -> DataFrame:
            need = df.groupBy(*cols).agg(F.count(F.lit(1)).alias(COUNT))
            have = current.groupBy(*cols).agg(F.count(F.lit(1)).alias(COPY))
            short = (need.join(have, _null_safe(need, have, cols), "left")
                     .where(F.coalesce(have[COPY], F.lit(0)) < need[COUNT]))
            if short.limit(1).count():
                raise ConfigError(f"retract from {self.name!r}: some rows are not in the table "
                                  "(or fewer times than given); nothing was retracted")
            return self._stamp(df, -1)

        return self.client.run(self._commit_on_current(frame, "retract"))

    def upsert(self, df: DataFrame) -> int:
        """Replace the rows whose keys appear in `df`; one commit, retried on conflicts."""
        if not self.info.keys:
            raise ConfigError(f"table {self.name!r} has no key columns; upsert needs them")
        self._check_schema(df)
        self._check_keys(df)
        if df.groupBy(*self.info.keys).count().where("count > 1").limit(1).count():
            raise ConfigError(f"upsert into {self.name!r}: duplicate keys in the input")
        keys = df.select(*self.info.keys)

        def frame(current: DataFrame, ts: int) -> DataFrame:
            old = current.join(keys, _null_safe(current, keys, self.info.keys), "left_semi")
            return self._stamp(old, -1).unionByName(self._stamp(df, +1))

        return self.client.run(self._commit_on_current(frame, "upsert"))

    def _check_keys(self, df: DataFrame) -> None:
        if not self.info.keys:
            return
        nulls = functools.reduce(operator.or_, (F.col(k).isNull() for k in self.info.keys))
        if df.where(nulls).limit(1).count():
            raise ConfigError(f"NULL in a key column of {self.name!r} "
                              f"({', '.join(self.info.keys)}); keys must not be NULL")

    async def _commit_on_current(self, build: Callable[[DataFrame, int], DataFrame],
                                 what: str) -> int:
        """Commit a frame computed from the current rows, with a compare-and-set on the upper it
        was computed at: if anyone commits in between, recompute (no blind changes)."""
        stamper = _Stamper(self.client, self.timeline)
        for _ in range(50):
            base = await catalog.upper(self.client.backend, self.timeline)
            ts = (await stamper.write_ts()).timestamp
            current = await asyncio.to_thread(self._read_at, base)
            frame = await asyncio.to_thread(build, current, ts)
            try:
                await self._write_and_commit(frame, ts, expected_upper=base)
            except Conflict:
                continue
            await self._committer.apply(ts)
            return ts
        raise OracleError(f"{what} on {self.name!r} kept conflicting with other writers")

    async def _commit_tagged(self, df: DataFrame, tag: str) -> int:
        stamper = _Stamper(self.client, self.timeline)
        for _ in range(50):
            ts = (await stamper.write_ts()).timestamp
            try:
                await self._write_and_commit(self._stamp(df, +1), ts, tags=(tag,), reuse=tag)
            except Conflict:
                continue
            except catalog.TagExists as done:
                await self._committer.apply(done.ts)  # it may never have been applied
                return done.ts
            await self._committer.apply(ts)
            return ts
        raise OracleError(f"append to {self.name!r} kept conflicting with other writers")

    async def _abandon(self, payloads: object) -> None:
        """A group failed for good: files kept for its retries go (never committed)."""
        kept = self._written.pop(id(payloads), None)
        if kept is not None:
            await asyncio.to_thread(_delete, self.spark, kept[0])

    async def _append_group(self, ts: int, payloads: list[tuple[DataFrame, int]]) -> None:
        frames = [self._stamp(df, diff) for df, diff in payloads]
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        # The committer retries a Conflict with the same list at a fresh timestamp: its files
        # are written once and moved.
        await self._write_and_commit(frame, ts, reuse=payloads)

    async def _write_and_commit(self, frame: DataFrame, ts: int, *, tags: tuple[str, ...] = (),
                                expected_upper: int | None = None, reuse: object = None) -> None:
        """Write (or move, when `reuse` names files an earlier attempt wrote) the frame's files
        under `ts`, then commit them. After a `Conflict` with `reuse`, the files are kept for
        the next attempt; otherwise a refused commit deletes them."""
        # Keyed by identity, holding the key: an id() is never reused while its entry lives.
        earlier = self._written.pop(id(reuse), None) if reuse is not None else None
        uid = earlier[1] if earlier else uuid.uuid4().hex[:12]
        assert earlier is None or earlier[2] is reuse
        path = f"{self.info.location}/data/{TS}={ts}/{COMMIT}={uid}"
        if earlier:
            await asyncio.to_thread(_move, self.spark, earlier[0], path)
        else:
            await asyncio.to_thread(frame.write.mode("error").parquet, path)
        if self.before_commit is not None:
            await asyncio.to_thread(self.before_commit, ts)
        try:
            await catalog.commit(self.client.backend, self.info, ts, path, tags, expected_upper)
        except Conflict:
            if reuse is not None:
                self._written[id(reuse)] = (path, uid, reuse)
            else:  # definitely not committed (the transaction was refused)
                await asyncio.to_thread(_delete, self.spark, path)
            raise
        except catalog.TagExists:
            await asyncio.to_thread(_delete, self.spark, path)
            raise
        except OracleError:
            # Ambiguous (the COMMIT may have landed before the connection failed): ask. Files
            # are never deleted on an ambiguous outcome; unreferenced ones are invisible.
            try:
                done = await catalog.committed(self.client.backend, self.name, path)
            except OracleError:
                done = None
            if done is None:
                raise
            log.info("commit at %d of %s landed despite an error; counted as done", ts, path)
        if self.after_commit is not None:
            await asyncio.to_thread(self.after_commit, ts)

    def _stamp(self, df: DataFrame, diff: int) -> DataFrame:
        # No `_ts` in the files: it is the name of their directory (`_ts=<ts>`), so a commit
        # that lost its compare-and-set moves its files to a fresh timestamp instead of
        # writing them again.
        return (df.select(*self.schema.fieldNames())
                .withColumn(DIFF, F.lit(diff).cast(IntegerType())))

    def _check_schema(self, df: DataFrame) -> None:
        got = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
        want = [(c["name"], c["type"]) for c in self.info.columns]
        if sorted(got) != sorted(want):
            raise ConfigError(
                f"schema mismatch for table {self.name!r}: expected "
                + ", ".join(f"{n} {t}" for n, t in want) + "; got "
                + ", ".join(f"{n} {t}" for n, t in got)
            )

    # --- reads ----------------------------------------------------------------------------

    def resolve(self, as_of: str | int) -> int:
        """The timestamp a read at `as_of` uses (and closes, for linearized reads)."""
        if as_of == "linearized":
            # At least the catalog's upper: a commit is visible once it is in the catalog, even
            # while its apply_write lags (or is being retried); and never below a timestamp this
            # client already read at.
            ts = max(self.client.read_ts(self.timeline),
                     self.client.run(catalog.upper(self.client.backend, self.timeline)))
            self.client.run(catalog.seal(self.client.backend, self.timeline, ts))
            return self.client.saw_closed(self.timeline, ts)
        if as_of == "serializable":
            # The cached closed timestamp may predate a compaction: any closed timestamp at or
            # after `since` is as serializable, and only those can still be read.
            since = self.client.run(catalog.since(self.client.backend, self.name))
            return max(self.client.closed_ts(self.timeline), since)
        if isinstance(as_of, bool) or not isinstance(as_of, int) or as_of < 0:
            raise ConfigError("as_of must be 'linearized', 'serializable' or a timestamp")
        closed = self.client.run(catalog.upper(self.client.backend, self.timeline))
        if as_of > closed:
            raise ConfigError(f"timestamp {as_of} is not closed yet on {self.timeline!r} "
                              f"(closed up to {closed}); read at or below it, or linearized")
        since = self.client.run(catalog.since(self.client.backend, self.name))
        if as_of < since:
            raise ConfigError(f"table {self.name!r} was compacted up to {since}: its history "
                              f"before that is gone; read at or after {since}")
        return as_of

    def read(self, as_of: str | int = "linearized") -> DataFrame:
        """The table's rows as of a timestamp: diffs summed per row, zero rows dropped."""
        return self._read_at(self.resolve(as_of))

    def read_with_ts(self, as_of: str | int = "linearized") -> tuple[int, DataFrame]:
        ts = self.resolve(as_of)
        return ts, self._read_at(ts)

    def changelog(self, as_of: str | int = "linearized") -> DataFrame:
        """The raw updates (rows with `_ts` and `_diff`) at or below the timestamp."""
        return self._changes(self.resolve(as_of))

    def _changes(self, ts: int) -> DataFrame:
        listed = None
        for _ in range(3):
            paths = [p for _, p in self.client.run(
                catalog.commits_as_of(self.client.backend, self.name, ts))]
            # Checked after listing: a compaction that landed before the listing folded
            # commits at or below `ts` away, and the listing would silently miss them.
            since = self.client.run(catalog.since(self.client.backend, self.name))
            if ts < since:
                raise ConfigError(f"table {self.name!r} was compacted up to {since}: its "
                                  f"history before that is gone; read at or after {since}")
            try:
                return self._changes_of(paths)
            except _FilesGone as gone:
                if paths == listed:  # listed twice alike: the files went, not the commits
                    raise ConfigError(
                        f"table {self.name!r} has committed files that are gone ({gone.path}):"
                        f" its folder {self.info.location} was emptied or replaced (a"
                        " different volume mounted there, a new data_dir). Mount the folder"
                        " the table was written to; or, to give up its rows for good, drop it"
                        f" (client.drop_table(spark, {self.name!r})) and create it again"
                    ) from None
                listed = paths  # a compaction may have folded them since: list again
        raise OracleError(f"reading {self.name!r} kept racing with compactions; try again")

    def _changes_of(self, paths: list[str]) -> DataFrame:
        full = StructType(self.schema.fields + [StructField(DIFF, IntegerType()),
                                                StructField(TS, DecimalType(20, 0))])
        placed = [p for p in paths if f"/{TS}=" in p]
        stamped = [p for p in paths if f"/{TS}=" not in p]  # files of earlier releases
        parts = []
        try:
            if placed:
                parted = StructType(full.fields + [StructField(COMMIT, StringType())])
                parts.append(self.spark.read.schema(parted)
                             .option("basePath", f"{self.info.location}/data")
                             .parquet(*placed).drop(COMMIT))
            if stamped:
                parts.append(self.spark.read.schema(full).parquet(*stamped))
        except AnalysisException as exc:
            if exc.getCondition() != "PATH_NOT_FOUND":
                raise
            raise _FilesGone((exc.getMessageParameters() or {}).get("path", "?")) from exc
        if not parts:
            return self.spark.createDataFrame([], full)
        return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])

    def _read_at(self, ts: int) -> DataFrame:
        cols = self.schema.fieldNames()
        summed = (self._changes(ts).groupBy(*cols).agg(F.sum(DIFF).alias(COUNT))
                  .where(F.col(COUNT) > 0))
        return (summed.withColumn(COPY, F.explode(F.sequence(F.lit(1), F.col(COUNT))))
                .select(*cols))

    # --- maintenance ----------------------------------------------------------------------

    def compact(self, below: int | None = None) -> int:
        """Fold every commit at or below `below` (default: the closed timestamp) into one, so
        that reads plan over few commits. Reads at or after `below` return the same rows as
        before; explicit reads before it are refused from then on. Returns the commits folded.
        """
        return self.client.run(self._compact(below))

    async def _compact(self, below: int | None) -> int:
        backend = self.client.backend
        for _ in range(10):
            top = await catalog.upper(backend, self.timeline)
            target = top if below is None else below
            if target > top:
                raise ConfigError(f"cannot compact {self.name!r} up to {target}: it is not "
                                  f"closed yet (closed up to {top})")
            since = await catalog.since(backend, self.name)
            if target <= since:
                return 0
            folded = await catalog.commits_as_of(backend, self.name, target)
            if len(folded) <= 1:
                return 0
            cols = self.schema.fieldNames()
            state = (self._changes_of([p for _, p in folded]).groupBy(*cols)
                     .agg(F.sum(DIFF).alias(DIFF))
                     .where(F.col(DIFF) != 0)
                     .withColumn(DIFF, F.col(DIFF).cast(IntegerType())))
            uid = "c" + uuid.uuid4().hex[:11]
            path = f"{self.info.location}/data/{TS}={target}/{COMMIT}={uid}"
            await asyncio.to_thread(state.write.mode("error").parquet, path)
            try:
                await catalog.compact(backend, self.info, target, path,
                                      [p for _, p in folded], since)
            except Conflict:
                await asyncio.to_thread(_delete, self.spark, path)
                continue
            return len(folded)
        raise OracleError(f"compaction of {self.name!r} kept conflicting with another one")

    def collect_garbage(self, older_than_s: float = 3600.0) -> int:
        """Delete data directories no commit refers to (folded by `compact`, or left by writers
        that failed before committing), once they are older than `older_than_s`: a writer's
        files are unreferenced until its commit lands, and a reader may still be reading files
        it listed before a compaction. Returns how many directories went."""
        fs, root = _fs(self.spark, f"{self.info.location}/data")
        if not fs.exists(root):
            return 0
        # As the file system names them (`file:/x` for a local `/x`), to compare with listings.
        referenced = {fs.makeQualified(_fs(self.spark, p)[1]).toString()
                      for p in self.client.run(catalog.all_paths(self.client.backend,
                                                                 self.name))}
        cutoff = (time.time() - older_than_s) * 1000
        removed = 0
        for level1 in fs.listStatus(root):
            candidates = ([s for s in fs.listStatus(level1.getPath()) if s.isDirectory()]
                          if level1.getPath().getName().startswith(f"{TS}=") else [level1])
            for status in candidates:
                path = status.getPath()
                if path.toString() in referenced or status.getModificationTime() > cutoff:
                    continue
                fs.delete(path, True)
                removed += 1
            if level1.getPath().getName().startswith(f"{TS}="):
                try:
                    fs.delete(level1.getPath(), False)  # only if now empty
                except Exception:  # noqa: BLE001 (py4j: "directory not empty")
                    pass
        return removed

    # --- streaming ------------------------------------------------------------------------

    def streaming_sink(self, query_name: str) -> Callable[[DataFrame, int], None]:
        """For `writeStream.foreachBatch(...)`: each micro-batch is one group-committed append;
        a replayed batch id is skipped, so a restarted query does not duplicate rows."""

        def sink(batch: DataFrame, batch_id: int) -> None:
            # A replay after a crash between the commit and its apply_write finds the tag and
            # applies it; a replay of a finished batch does nothing. Either way, never twice.
            self.append(batch, tag=f"{query_name}:{batch_id}")

        return sink


def join(left: TimestampedTable, right: TimestampedTable, on: Any, how: str = "inner",
         as_of: str | int = "linearized") -> DataFrame:
    """Join two tables at one timestamp; tables on different timelines cannot be joined."""
    common_timeline([left.timeline, right.timeline])  # raises before any Spark job runs
    ts = left.resolve(as_of)  # one timeline, one upper: sealing it once covers both tables
    return left._read_at(ts).join(right._read_at(ts), on=on, how=how)
