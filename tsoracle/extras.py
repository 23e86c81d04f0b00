"""Optional parts of tsoracle (pip extras) and the one error that says which one is missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tsoracle.errors import MissingExtra

# Top-level modules each extra provides, as declared in pyproject.toml.
EXTRAS: dict[str, frozenset[str]] = {
    "operator": frozenset({"kopf", "kubernetes"}),
    "spark": frozenset({"pyspark"}),
    "duckdb": frozenset({"duckdb", "duckdb_extension_iceberg", "duckdb_extension_httpfs",
                         "duckdb_extension_avro"}),
    "iceberg": frozenset({"pyiceberg", "pyarrow", "pydantic", "starlette", "uvicorn"}),
}


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Turn the ImportError of a missing extra into MissingExtra naming it; `what` is the
    user's name for the feature (a command, an option)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in EXTRAS[extra]:
            raise MissingExtra(what, extra, top) from None
        raise
