"""Timestamped tables: append-only Parquet changelogs stamped by the oracle.

Each commit writes one Parquet directory holding the rows plus `_ts` (the commit timestamp,
DECIMAL(20,0) because timestamps are unsigned 64-bit) and `_diff` (+1 insert, -1 retraction),
then records it in the catalog with a compare-and-set on the timeline's upper
(`tsoracle/spark/catalog.py`), then `apply_write`s. Readers pick a timestamp, read every
commit at or below it, and let Spark sum the diffs per row.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, IntegerType, StructField, StructType

from tsoracle.errors import ConfigError, OracleError
from tsoracle.oracle import GroupCommitter, common_timeline
from tsoracle.oracle.group_commit import Conflict
from tsoracle.spark import catalog
from tsoracle.spark.catalog import TableInfo

if TYPE_CHECKING:
    from tsoracle.spark.client import OracleClient

TS, DIFF = "_ts", "_diff"
RESERVED = (TS, DIFF, "_n")


def _columns(schema: StructType) -> list[dict[str, Any]]:
    return [{"name": f.name, "type": f.dataType.simpleString(), "json": f.jsonValue()}
            for f in schema.fields]


class _Stamper:
    """What the group committer needs from an oracle, routed through the client's reopen logic."""

    def __init__(self, client: OracleClient, timeline: str) -> None:
        self.client, self.timeline = client, timeline

    async def write_ts(self) -> Any:
        return await self.client.acall(lambda o: o.write_ts(), self.timeline)

    async def apply_write(self, ts: int) -> None:
        await self.client.acall(lambda o: o.apply_write(ts), self.timeline)


class TimestampedTable:
    def __init__(self, client: OracleClient, spark: SparkSession, info: TableInfo) -> None:
        self.client, self.spark, self.info = client, spark, info
        self.schema = StructType([StructField.fromJson(c["json"]) for c in info.columns])
        self.before_commit: Callable[[int], None] | None = None  # tracing / fault-injection hook
        self._committer = GroupCommitter(_Stamper(client, info.timeline),  # type: ignore[arg-type]
                                         self._append_group)

    @classmethod
    def create(cls, client: OracleClient, spark: SparkSession, name: str, schema: StructType,
               *, keys: tuple[str, ...] = (), timeline: str) -> TimestampedTable:
        clash = [f.name for f in schema.fields if f.name in RESERVED]
        if clash:
            raise ConfigError(f"column names {clash} are reserved by tsoracle; rename them")
        missing = [k for k in keys if k not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"key columns {missing} are not in the schema of {name!r}")
        info = TableInfo(name, timeline, _columns(schema), list(keys),
                         str(client.data_dir / name))
        return cls(client, spark, client.run(catalog.register(client.backend, info)))

    @classmethod
    def open(cls, client: OracleClient, spark: SparkSession, name: str) -> TimestampedTable:
        return cls(client, spark, client.run(catalog.lookup(client.backend, name)))

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def timeline(self) -> str:
        return self.info.timeline

    # --- writes ---------------------------------------------------------------------------

    def append(self, df: DataFrame, *, tag: str | None = None) -> int:
        """Insert the rows; returns the commit timestamp. Concurrent calls share a commit."""
        return self._commit(df, +1, tag)

    def retract(self, df: DataFrame) -> int:
        """Delete one occurrence of each given row."""
        return self._commit(df, -1, None)

    def _commit(self, df: DataFrame, diff: int, tag: str | None) -> int:
        self._check_schema(df)
        return self.client.run(self._committer.commit((df, diff, tag)))

    def upsert(self, df: DataFrame) -> int:
        """Replace the rows whose keys appear in `df`; one commit, retried on conflicts."""
        if not self.info.keys:
            raise ConfigError(f"table {self.name!r} has no key columns; upsert needs them")
        self._check_schema(df)
        if df.groupBy(*self.info.keys).count().where("count > 1").limit(1).count():
            raise ConfigError(f"upsert into {self.name!r}: duplicate keys in the input")
        return self.client.run(self._upsert(df))

    async def _upsert(self, df: DataFrame) -> int:
        stamper = _Stamper(self.client, self.timeline)
        for _ in range(50):
            base = await catalog.upper(self.client.backend, self.timeline)
            ts = (await stamper.write_ts()).timestamp
            current = await asyncio.to_thread(self._read_at, base)
            old = current.join(df.select(*self.info.keys), on=self.info.keys, how="left_semi")
            frame = self._stamp(old, -1, ts).unionByName(self._stamp(df, +1, ts))
            try:
                await self._write_and_commit(frame, ts, None, expected_upper=base)
            except Conflict:
                continue
            await stamper.apply_write(ts)
            return ts
        raise OracleError(f"upsert into {self.name!r} kept conflicting with other writers")

    async def _append_group(self, ts: int, payloads: list[tuple[DataFrame, int, str | None]]
                            ) -> None:
        frames = [self._stamp(df, diff, ts) for df, diff, _ in payloads]
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        tags = [t for _, _, t in payloads if t]
        await self._write_and_commit(frame, ts, ",".join(tags) or None)

    async def _write_and_commit(self, frame: DataFrame, ts: int, tag: str | None,
                                expected_upper: int | None = None) -> None:
        path = f"{self.info.location}/data/{ts}-{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(frame.write.mode("error").parquet, path)
        if self.before_commit is not None:
            await asyncio.to_thread(self.before_commit, ts)
        try:
            await catalog.commit(self.client.backend, self.info, ts, path, tag, expected_upper)
        except BaseException:
            # Not committed: the files are invisible (readers only follow the catalog).
            shutil.rmtree(path, ignore_errors=True)
            raise

    def _stamp(self, df: DataFrame, diff: int, ts: int) -> DataFrame:
        return (df.select(*self.schema.fieldNames())
                .withColumn(DIFF, F.lit(diff).cast(IntegerType()))
                .withColumn(TS, F.lit(Decimal(ts)).cast(DecimalType(20, 0))))

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
            ts = self.client.read_ts(self.timeline)
            self.client.run(catalog.seal(self.client.backend, self.timeline, ts))
            return ts
        if as_of == "serializable":
            return self.client.closed_ts(self.timeline)
        if isinstance(as_of, bool) or not isinstance(as_of, int) or as_of < 0:
            raise ConfigError("as_of must be 'linearized', 'serializable' or a timestamp")
        closed = self.client.run(catalog.upper(self.client.backend, self.timeline))
        if as_of > closed:
            raise ConfigError(f"timestamp {as_of} is not closed yet on {self.timeline!r} "
                              f"(closed up to {closed}); read at or below it, or linearized")
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
        paths = [p for _, p in self.client.run(catalog.commits_as_of(self.client.backend,
                                                                      self.name, ts))]
        full = StructType(self.schema.fields + [StructField(DIFF, IntegerType()),
                                                StructField(TS, DecimalType(20, 0))])
        if not paths:
            return self.spark.createDataFrame([], full)
        return self.spark.read.schema(full).parquet(*paths)

    def _read_at(self, ts: int) -> DataFrame:
        cols = self.schema.fieldNames()
        summed = (self._changes(ts).groupBy(*cols).agg(F.sum(DIFF).alias("_n"))
                  .where(F.col("_n") > 0))
        return (summed.withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col("_n"))))
                .select(*cols))

    # --- streaming ------------------------------------------------------------------------

    def streaming_sink(self, query_name: str) -> Callable[[DataFrame, int], None]:
        """For `writeStream.foreachBatch(...)`: each micro-batch is one group-committed append;
        a replayed batch id is skipped, so a restarted query does not duplicate rows."""

        def sink(batch: DataFrame, batch_id: int) -> None:
            tag = f"{query_name}:{batch_id}"
            if self.client.run(catalog.has_tag(self.client.backend, self.name, tag)):
                return
            self.append(batch, tag=tag)

        return sink


def join(left: TimestampedTable, right: TimestampedTable, on: Any, how: str = "inner",
         as_of: str | int = "linearized") -> DataFrame:
    """Join two tables at one timestamp; tables on different timelines cannot be joined."""
    common_timeline([left.timeline, right.timeline])  # raises before any Spark job runs
    ts = left.resolve(as_of)  # one timeline, one upper: sealing it once covers both tables
    return left._read_at(ts).join(right._read_at(ts), on=on, how=how)
