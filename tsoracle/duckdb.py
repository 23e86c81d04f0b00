"""DuckDB on tsoracle's Iceberg catalog (`pip install 'tsoracle[duckdb]'`).

`DuckCatalog` attaches `tsoracle catalog serve` to a DuckDB connection. A read of any set of
tables as of one T from `read_ts()` (DuckDB's own time travel, `AT (TIMESTAMP => …)`) is one
consistent, repeatable cut, and DuckDB's INSERTs commit through the catalog at oracle
timestamps, like every other engine's (docs/iceberg.md, "DuckDB").

DuckDB's iceberg, httpfs and avro extensions are loaded from the files of their PyPI wheels
(the extra installs them, at DuckDB's own version); DuckDB checks each one's signature as it
loads, and nothing is downloaded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsoracle.catalog.client import Advice, CatalogClient, CatalogUnavailable
from tsoracle.errors import ConfigError
from tsoracle.extras import needs_extra

if TYPE_CHECKING:
    import duckdb

# In load order: the iceberg extension reads manifests with avro and files with httpfs.
EXTENSIONS = ("avro", "httpfs", "iceberg")
_ADVICE = Advice(pass_token="DuckCatalog(..., token=...)", create_table="CREATE TABLE")


def extension_file(name: str, version: str) -> Path:
    """The file of DuckDB extension `name` built for DuckDB `version` (`1.5.5`), from the
    installed `duckdb-extension-<name>` wheel."""
    with needs_extra("duckdb", "tsoracle.duckdb"):
        module = importlib.import_module(f"duckdb_extension_{name}")
    path = Path(module.__file__ or "").parent / "extensions" / f"v{version}" / \
        f"{name}.duckdb_extension"
    if not path.is_file():
        raise ConfigError(
            f"tsoracle.duckdb needs DuckDB's {name} extension built for DuckDB {version}, and "
            f"the installed duckdb-extension-{name} is for another version: pip install "
            f"'duckdb-extension-{name}=={version}' (or 'tsoracle[duckdb]', whose versions "
            "match)")
    return path


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


class DuckCatalog:
    """tsoracle's catalog at `catalog_uri`, attached as `alias` to `connection` (default: a new
    in-memory DuckDB). `token`: the catalog's bearer token, if it was started with one."""

    def __init__(self, catalog_uri: str, *, token: str | None = None, alias: str = "tso",
                 connection: duckdb.DuckDBPyConnection | None = None,
                 timeout_s: float = 30.0) -> None:
        with needs_extra("duckdb", "tsoracle.duckdb"):
            import duckdb
        self.alias = alias
        self.client = CatalogClient(catalog_uri, advice=_ADVICE, token=token, name=alias,
                                    timeout_s=timeout_s)
        self.client.closed_ts()  # reachable, and the token right: said in the catalog's terms
        self.con = connection if connection is not None else duckdb.connect(config={
            "autoinstall_known_extensions": False, "autoload_known_extensions": False})
        for name in EXTENSIONS:
            self.con.execute(f"LOAD {_sql_string(str(extension_file(name, duckdb.__version__)))}")
        options = [f"TYPE iceberg, ENDPOINT {_sql_string(self.client.uri)}"]
        if token:
            secret = _identifier(f"tsoracle_{alias}")
            # A temporary secret: in this connection's memory only, shown redacted.
            self.con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {secret} "
                             f"(TYPE iceberg, TOKEN {_sql_string(token)})")
            options.append(f"SECRET {secret}")
        else:
            options.append("AUTHORIZATION_TYPE 'none'")
        try:
            self.con.execute(f"ATTACH '' AS {_identifier(alias)} ({', '.join(options)})")
        except duckdb.Error as exc:
            raise CatalogUnavailable(f"DuckDB could not attach the catalog at "
                                     f"{self.client.shown_uri}: "
                                     f"{self.client.scrub(str(exc))[:300]}") from None

    def read_ts(self) -> int:
        """A linearizable read timestamp: every commit acknowledged before this call is at or
        below it, and nothing commits at or below it any more."""
        return self.client.read_ts()

    def closed_ts(self) -> int:
        """A timestamp nothing can commit at or below any more (no oracle round trip)."""
        return self.client.closed_ts()

    def table(self, name: str, as_of: int | None = None) -> str:
        """SQL naming table `name` (`namespace.table`) for a FROM clause; with `as_of` (ms
        since the epoch, a timestamp from read_ts), the table as of that timestamp."""
        namespace, sep, table = name.rpartition(".")
        if not sep or not namespace or not table:
            raise ConfigError(f"table {name!r}: name it as namespace.table")
        sql = f"{_identifier(self.alias)}.{_identifier(namespace)}.{_identifier(table)}"
        if as_of is None:
            return sql
        if not isinstance(as_of, int) or isinstance(as_of, bool) or as_of < 0:
            raise ConfigError(f"as_of {as_of!r}: a timestamp from read_ts() (milliseconds "
                              "since the epoch)")
        # make_timestamp(µs) is the UTC instant the snapshots' timestamp-ms are compared with.
        return f"{sql} AT (TIMESTAMP => make_timestamp({as_of * 1000}))"

    def sql(self, query: str, parameters: Any = None) -> duckdb.DuckDBPyConnection:
        """`query` on this connection (write table names with `table()`)."""
        return self.con.execute(query, parameters)

    def close(self) -> None:
        self.con.close()
