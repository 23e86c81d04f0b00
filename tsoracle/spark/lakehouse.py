"""Spark on Iceberg through tsoracle's catalog: the one way tsoracle stores tables.

`Lakehouse` is synchronous driver code around a SparkSession whose catalog is `tsoracle catalog
serve`. Every commit (append, MERGE, DELETE, compaction, DDL) lands at an oracle timestamp W,
which is also the snapshot's `timestamp-ms` (docs/iceberg.md, "The guarantee"); so a read of
any set of tables as of one T from `read_ts()` or `closed_ts()` is one consistent, repeatable
cut, done with Spark's own time travel (`timestampAsOf`).

PySpark is imported inside the methods: `import tsoracle.spark` works without it.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tsoracle.catalog.client import (
    Advice,
    CatalogClient,
    CatalogUnavailable,
    TableNotFound,
    without_userinfo,
)
from tsoracle.errors import ConfigError
from tsoracle.spark.session import _has_iceberg, iceberg_conf, iceberg_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

T = TypeVar("T")
AsOf = int | Literal["linearized", "serializable"]
# The snapshot summary key an append is found by afterwards (its commit timestamp W).
APPEND_ID = "tsoracle.append-id"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NO_SNAPSHOT = "Cannot find a snapshot older than"  # Iceberg's SnapshotUtil, for a T too early
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ADVICE = Advice(pass_token="Lakehouse(..., token=...)", create_table="Lakehouse.create_table")
__all__ = ["APPEND_ID", "AsOf", "CatalogUnavailable", "Cut", "HistoryExpired", "Lakehouse",
           "TableExists", "TableNotFound"]


class TableExists(ConfigError):
    """`create_table` of a name that exists already."""


class HistoryExpired(ConfigError):
    """A read at a timestamp whose snapshot was removed by snapshot expiry."""


@dataclass(frozen=True)
class Cut:
    """Several tables read as of one timestamp `ts`: `cut["shop.orders"]` is a DataFrame."""

    ts: int
    frames: dict[str, DataFrame]

    def __getitem__(self, table: str) -> DataFrame:
        return self.frames[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self.frames)


class Lakehouse:
    """Tables in the Iceberg REST catalog at `catalog_uri`, read and written through `spark`.

    `spark` must have started with Iceberg (its jar and SQL extensions: `iceberg_session`, or
    `Lakehouse.start`); a catalog `catalog_name` it does not know yet is registered on it here.
    `staleness_s`: how old the closed timestamp of a serializable read may be.
    `read_window_s` (at least `staleness_s`): how long after a timestamp was handed out reads at
    it must keep working (repeated reads, long queries); snapshot expiry and orphan removal
    refuse a shorter retention.
    """

    def __init__(self, spark: SparkSession, catalog_uri: str, *, catalog_name: str = "tso",
                 token: str | None = None, staleness_s: float = 1.0,
                 read_window_s: float = 3600.0, timeout_s: float = 30.0) -> None:
        if staleness_s < 0 or read_window_s < staleness_s:
            raise ConfigError(
                f"read_window_s ({read_window_s:g}) must be at least staleness_s "
                f"({staleness_s:g}), and staleness_s at least 0: a serializable read may be "
                "that stale, so its history must be kept at least that long")
        self.spark = spark
        self.catalog_uri = catalog_uri.rstrip("/")
        self.catalog_name = catalog_name
        self.staleness_s = staleness_s
        self.read_window_s = read_window_s
        self._client = CatalogClient(self.catalog_uri, advice=_ADVICE, token=token,
                                     name=catalog_name, timeout_s=timeout_s)
        self._lock = threading.Lock()
        self._closed: tuple[float, int] | None = None  # (monotonic time fetched, value)
        self._shown_uri = self._client.shown_uri
        self._attach(iceberg_conf(self.catalog_uri, catalog_name=catalog_name, token=token,
                                  jar=None))

    @classmethod
    def start(cls, catalog_uri: str, *, catalog_name: str = "tso", token: str | None = None,
              staleness_s: float = 1.0, read_window_s: float = 3600.0,
              **session: Any) -> Lakehouse:
        """Start (or join) a SparkSession with Iceberg on the catalog, and a Lakehouse on it.
        `session` goes to `iceberg_session` (master, app_name, warehouse, jar, extra_conf)."""
        spark = iceberg_session(catalog_uri, catalog_name=catalog_name, token=token, **session)
        return cls(spark, catalog_uri, catalog_name=catalog_name, token=token,
                   staleness_s=staleness_s, read_window_s=read_window_s)

    def _attach(self, conf: dict[str, str]) -> None:
        if not _has_iceberg(self.spark):
            raise ConfigError(
                "this SparkSession started without Iceberg (its jar and SQL extensions); start "
                "it with tsoracle.spark.iceberg_session or Lakehouse.start")
        prefix = f"spark.sql.catalog.{self.catalog_name}"
        known = self.spark.conf.get(f"{prefix}.uri", None)
        if known is None:
            # Catalogs are SQL settings Spark reads when a name is first used: one can be
            # added to a running session (the jar and the extensions cannot).
            for key, value in conf.items():
                if key == prefix or key.startswith(prefix + "."):
                    self.spark.conf.set(key, value)
        elif known.rstrip("/") != self.catalog_uri:
            raise ConfigError(
                f"this SparkSession's catalog {self.catalog_name!r} is "
                f"{without_userinfo(known)}, not {self._shown_uri}; pass another catalog_name")

    # --- timestamps ---------------------------------------------------------------------------

    def read_ts(self) -> int:
        """A linearizable read timestamp: every commit acknowledged before this call is at or
        below it, and nothing can commit at or below it any more (one oracle round trip)."""
        ts = self._client.read_ts()
        self._saw_closed(ts)  # the catalog raised its upper to ts
        return ts

    def closed_ts(self) -> int:
        """A timestamp nothing can commit at or below any more, at most `staleness_s` old; no
        oracle round trip. It never moves backwards within this Lakehouse."""
        with self._lock:
            cached = self._closed
        if cached is not None and time.monotonic() - cached[0] <= self.staleness_s:
            return cached[1]
        fetched_at = time.monotonic()
        return self._saw_closed(self._client.closed_ts(), fetched_at)

    def _saw_closed(self, ts: int, at: float | None = None) -> int:
        with self._lock:
            best = ts if self._closed is None else max(ts, self._closed[1])
            self._closed = (time.monotonic() if at is None else at, best)
            return best

    def resolve(self, as_of: AsOf) -> int:
        """The timestamp a read `as_of` is at: "linearized" (`read_ts`), "serializable"
        (`closed_ts`), or a closed timestamp given as an int."""
        if as_of == "linearized":
            return self.read_ts()
        if as_of == "serializable":
            return self.closed_ts()
        if isinstance(as_of, bool) or not isinstance(as_of, int):
            raise ConfigError(f"as_of must be 'linearized', 'serializable' or a timestamp (an "
                              f"int from read_ts() or closed_ts()), not {as_of!r}")
        if as_of < 0:
            raise ConfigError(f"as_of must not be negative, got {as_of}")
        if as_of > self.closed_ts() and as_of > self._fresh_closed():
            raise ConfigError(
                f"as_of={as_of} is above the catalog's closed timestamp: commits may still "
                "land at or below it, so the read would not be repeatable; read at "
                "'linearized', or at a timestamp from read_ts() or closed_ts()")
        return as_of

    def _fresh_closed(self) -> int:
        with self._lock:  # out of date now, but still the floor it never moves below
            if self._closed is not None:
                self._closed = (float("-inf"), self._closed[1])
        return self.closed_ts()

    # --- reads --------------------------------------------------------------------------------

    def read(self, table: str, as_of: AsOf = "linearized") -> DataFrame:
        """`table` ("namespace.name") as of one timestamp. A table with no snapshot at or
        before it (created later, or empty then) reads as empty, with its current schema."""
        return self.cut([table], as_of)[table]

    def cut(self, tables: Sequence[str], as_of: AsOf = "linearized") -> Cut:
        """Several tables as of ONE timestamp: a consistent cut (a commit, or a multi-table
        transaction, is in all of them or in none), the same rows however often it is read."""
        if isinstance(tables, str) or not tables:
            raise ConfigError("tables must be a non-empty list of table names")
        names = {t: self._full(t) for t in tables}  # bad names fail before the oracle call
        ts = self.resolve(as_of)
        return Cut(ts, {t: self._at(t, full, ts) for t, full in names.items()})

    def _at(self, table: str, full: str, ts: int) -> DataFrame:
        from pyspark.errors import IllegalArgumentException

        try:
            return self._spark_call(
                table, lambda: self.spark.read.option("timestampAsOf", _instant(ts)).table(full))
        except IllegalArgumentException as exc:
            if _NO_SNAPSHOT not in str(exc):
                raise
        # No snapshot at or before ts: the table was empty then (or did not exist yet), unless
        # expiry removed the snapshots before its oldest one. Expiry also clears that one's
        # parent id, but not its sequence number: the table's first snapshot has number 1.
        metadata = self._metadata(table)
        log = metadata.get("snapshot-log") or []
        if log:
            snapshots = {s["snapshot-id"]: s for s in metadata.get("snapshots") or []}
            oldest = snapshots.get(log[0]["snapshot-id"]) or {}
            if int(oldest.get("sequence-number") or 1) > 1:
                raise HistoryExpired(
                    f"{table} has no snapshot at or before {ts} any more: snapshot expiry "
                    f"removed that history; read at or after {log[0]['timestamp-ms']}") from None
        schema = self._spark_call(table, lambda: self.spark.table(full).schema)
        return self.spark.createDataFrame([], schema)

    # --- tables -------------------------------------------------------------------------------

    def create_table(self, table: str, schema: str | StructType, *,
                     partitioned_by: Sequence[str] = (),
                     properties: Mapping[str, str] | None = None,
                     if_not_exists: bool = False) -> None:
        """Create `table` ("namespace.name"; the namespace too if missing). `schema` is a DDL
        string ("id BIGINT, item STRING") or a StructType; `partitioned_by` holds Spark
        partition transforms ("days(ts)", "bucket(16, id)", "region")."""
        full = self._full(table)
        columns = schema if isinstance(schema, str) else self._ddl(schema)
        sql = f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{full} ({columns}) " \
              "USING iceberg"
        if partitioned_by:
            sql += f" PARTITIONED BY ({', '.join(partitioned_by)})"
        if properties:
            sql += " TBLPROPERTIES (" + ", ".join(
                f"{_string(k)} = {_string(v)}" for k, v in properties.items()) + ")"
        namespace = full.rsplit(".", 1)[0]
        self._spark_call(table, lambda: self.spark.sql(
            f"CREATE NAMESPACE IF NOT EXISTS {namespace}"))
        self._spark_call(table, lambda: self.spark.sql(sql))

    def drop_table(self, table: str, *, purge: bool = False) -> None:
        """Drop `table`; `purge` also deletes its files (time travel on it ends either way)."""
        full = self._full(table)
        self._spark_call(table, lambda: self.spark.sql(
            f"DROP TABLE {full}{' PURGE' if purge else ''}"))

    def append(self, table: str, df: DataFrame) -> int:
        """Append `df`'s rows in one commit; returns its timestamp W (reads as of W or later
        see the rows, reads below W never do)."""
        full = self._full(table)
        tag = uuid.uuid4().hex
        self._spark_call(table, lambda: df.writeTo(full)
                         .option(f"snapshot-property.{APPEND_ID}", tag).append())
        return self._commit_ts(table, tag)

    def upsert(self, table: str, df: DataFrame, on: Sequence[str]) -> None:
        """Replace the rows whose `on` columns match a row of `df`, insert the others
        (one MERGE INTO, one commit). `df` must hold at most one row per key."""
        full = self._full(table)
        match = self._match(on)
        with self._view(df) as source:
            self._spark_call(table, lambda: self.spark.sql(
                f"MERGE INTO {full} t USING {source} s ON {match} "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"))

    def delete(self, table: str, keys: DataFrame, on: Sequence[str]) -> None:
        """Delete the rows whose `on` columns match a row of `keys` (one commit)."""
        full = self._full(table)
        match = self._match(on)
        with self._view(keys) as source:
            self._spark_call(table, lambda: self.spark.sql(
                f"MERGE INTO {full} t USING {source} s ON {match} WHEN MATCHED THEN DELETE"))

    def delete_where(self, table: str, condition: str) -> None:
        """`DELETE FROM table WHERE condition` (a Spark SQL predicate), in one commit."""
        full = self._full(table)
        self._spark_call(table, lambda: self.spark.sql(f"DELETE FROM {full} WHERE {condition}"))

    # --- maintenance --------------------------------------------------------------------------

    def compact(self, table: str, *, options: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Rewrite small data files into larger ones (`rewrite_data_files`, one commit). Reads
        as of earlier timestamps are unchanged: they read the earlier snapshots' files."""
        self._full(table)
        args = [f"table => {_string(table)}"]
        if options:
            args.append("options => map(" + ", ".join(
                f"{_string(k)}, {_string(v)}" for k, v in options.items()) + ")")
        rows = self._spark_call(table, lambda: self.spark.sql(
            f"CALL {self._catalog()}.system.rewrite_data_files({', '.join(args)})").collect())
        return rows[0].asDict() if rows else {}

    def expire_snapshots(self, table: str, *, retention_s: float) -> dict[str, Any]:
        """Remove the snapshots (and files only they use) that no read at a timestamp within
        the last `retention_s` needs. Refused if `retention_s` is under `read_window_s`."""
        full = self._full(table)
        horizon = self._horizon(retention_s, "expire_snapshots")
        # A read at T needs the last snapshot made current at or before T: keep the last one
        # at or before the horizon and everything after it, expire only what is older.
        keep = self._spark_call(table, lambda: self.spark.sql(
            f"SELECT min(unix_millis(s.committed_at)) AS oldest FROM {full}.history h "
            f"JOIN {full}.snapshots s ON h.snapshot_id = s.snapshot_id "
            f"WHERE unix_millis(h.made_current_at) >= coalesce((SELECT "
            f"max(unix_millis(made_current_at)) FROM {full}.history "
            f"WHERE unix_millis(made_current_at) <= {horizon}), 0)").collect())
        oldest = keep[0].oldest if keep else None
        if oldest is None:
            return {}
        rows = self._spark_call(table, lambda: self.spark.sql(
            f"CALL {self._catalog()}.system.expire_snapshots(table => {_string(table)}, "
            f"older_than => {_timestamp(oldest)}, retain_last => 1)").collect())
        return rows[0].asDict() if rows else {}

    def remove_orphan_files(self, table: str, *, retention_s: float) -> list[str]:
        """Delete files under the table's location that no snapshot references and that are
        older than `retention_s` (in-flight writes are protected by that age). Refused if
        `retention_s` is under `read_window_s`. Returns the deleted locations."""
        full = self._full(table)
        self._horizon(retention_s, "remove_orphan_files")
        # Iceberg's procedure refuses anything under 24 h unless the session is marked as a
        # test; its Action API takes any age, and this Lakehouse's own limit applies instead.
        older_than = int(time.time() * 1000 - retention_s * 1000)
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None  # a started SparkContext has its gateway
        session = self.spark._jsparkSession

        def run() -> list[str]:
            loaded = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, full)
            result = jvm.org.apache.iceberg.spark.actions.SparkActions.get(session) \
                .deleteOrphanFiles(loaded).olderThan(older_than).execute()
            return [str(location) for location in result.orphanFileLocations()]

        return self._spark_call(table, run)

    def _horizon(self, retention_s: float, what: str) -> int:
        if isinstance(retention_s, bool) or not isinstance(retention_s, int | float) \
                or retention_s < self.read_window_s:
            raise ConfigError(
                f"{what}: a retention of {retention_s!r} s is shorter than this Lakehouse's "
                f"read window ({self.read_window_s:g} s; serializable reads lag up to "
                f"staleness_s={self.staleness_s:g} s): reads within the window would lose "
                "their snapshots. Pass retention_s >= read_window_s")
        # Counted back from the earlier of the oracle's now and this machine's clock, so that
        # neither running ahead expires history a reader still holds.
        now = min(self.read_ts(), int(time.time() * 1000))
        return now - int(retention_s * 1000)

    # --- streams ------------------------------------------------------------------------------

    def stream_to(self, table: str, df: DataFrame, *, checkpoint: str,
                  trigger: Mapping[str, Any] | None = None,
                  query_name: str | None = None) -> StreamingQuery:
        """Start a Structured Streaming query appending `df` to `table`, each micro-batch one
        commit. Exactly once per checkpoint: a batch replayed after a restart from the same
        `checkpoint` is recognised by Iceberg (query id and epoch in the snapshot summary) and
        not appended again. A NEW checkpoint is a new query: it starts from the source's
        beginning and appends everything again. `trigger`: DataStreamWriter.trigger's keywords
        ({"availableNow": True}, {"processingTime": "10 seconds"})."""
        full = self._full(table)
        self._spark_call(table, lambda: self.spark.table(full).schema)  # exists, or says so
        writer = df.writeStream.format("iceberg").outputMode("append") \
            .option("checkpointLocation", checkpoint)
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        return self._spark_call(table, lambda: writer.toTable(full))

    # --- helpers ------------------------------------------------------------------------------

    def _catalog(self) -> str:
        return _quote(self.catalog_name)

    def _full(self, table: str) -> str:
        """`table` ("namespace.name", nested namespaces allowed) quoted, in this catalog."""
        parts = table.split(".") if isinstance(table, str) else []
        if len(parts) < 2 or not all(_NAME.fullmatch(p) for p in parts):
            raise ConfigError(f"a table name is 'namespace.name' (letters, digits and _), not "
                              f"{table!r}")
        return ".".join(_quote(p) for p in [self.catalog_name, *parts])

    def _ddl(self, schema: StructType) -> str:
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        return str(jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json()).toDDL())

    def _match(self, on: Sequence[str]) -> str:
        if isinstance(on, str) or not on or not all(isinstance(c, str) and c for c in on):
            raise ConfigError("on must be a non-empty list of column names")
        return " AND ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in on)

    @contextmanager
    def _view(self, df: DataFrame) -> Iterator[str]:
        """`df` as a temporary view of a name of its own (threads share the session)."""
        name = f"tsoracle_source_{uuid.uuid4().hex}"
        df.createOrReplaceTempView(name)
        try:
            yield name
        finally:
            self.spark.catalog.dropTempView(name)

    def _metadata(self, table: str) -> dict[str, Any]:
        """The table's current metadata, from the catalog (no Spark job)."""
        namespace, name = table.rsplit(".", 1)
        path = (f"/v1/namespaces/{urllib.parse.quote(namespace.replace('.', chr(0x1F)), '')}"
                f"/tables/{urllib.parse.quote(name, '')}")
        return dict(self._client.call("GET", path, table=table)["metadata"])

    def _commit_ts(self, table: str, tag: str) -> int:
        metadata = self._metadata(table)
        for snapshot in metadata.get("snapshots") or []:
            if (snapshot.get("summary") or {}).get(APPEND_ID) == tag:
                return int(snapshot["timestamp-ms"])
        raise CatalogUnavailable(f"the append to {table} committed, but its snapshot is not in "
                                 f"the table's metadata at {self._shown_uri} (expired already?)")

    def _spark_call(self, table: str, fn: Callable[[], T]) -> T:
        """`fn()`, with Spark's errors about the table and the catalog in the user's terms."""
        from pyspark.errors import AnalysisException

        try:
            return fn()
        except AnalysisException as exc:
            condition = exc.getCondition() or ""
            if condition.startswith(("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")) or \
                    "NoSuchTableException" in str(exc):
                raise TableNotFound(
                    f"table {table} does not exist in catalog {self.catalog_name!r} at "
                    f"{self._shown_uri}; create it with Lakehouse.create_table") from None
            if condition.startswith("TABLE_OR_VIEW_ALREADY_EXISTS"):
                raise TableExists(f"table {table} exists already in catalog "
                                  f"{self.catalog_name!r} (create_table(..., "
                                  "if_not_exists=True) keeps it)") from None
            raise
        except Exception as exc:
            # py4j's error for a Java exception PySpark has no class of its own for (py4j
            # comes with pyspark; not imported by name, it is not a dependency of ours).
            if type(exc).__name__ != "Py4JJavaError":
                raise
            text = self._client.scrub(str(getattr(exc, "java_exception", exc)))
            if any(m in text for m in ("ConnectException", "Connection refused",
                                       "RESTException", "UnknownHostException",
                                       "ServiceUnavailableException", "HttpHostConnect")):
                raise CatalogUnavailable(
                    f"the catalog at {self._shown_uri} did not answer Spark "
                    f"({text.splitlines()[0][:300]}); is `tsoracle catalog serve` running "
                    "there?") from None
            raise


def _instant(ts: int) -> str:
    """`ts` (ms since the epoch) as the timestamp string Spark's `timestampAsOf` parses."""
    try:
        return (_EPOCH + timedelta(milliseconds=ts)).isoformat(timespec="milliseconds")
    except OverflowError:
        raise ConfigError(f"timestamp {ts} is beyond what Spark can read as of") from None


def _timestamp(ms: int) -> str:
    """A Spark SQL TIMESTAMP literal for `ms`, in UTC (procedures take literals only)."""
    text = (_EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"TIMESTAMP '{text} UTC'"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _string(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
