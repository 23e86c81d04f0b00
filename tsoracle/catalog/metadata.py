"""Table metadata through pyiceberg: checking requirements, applying updates, stamping the
commit timestamp, and reading and writing metadata files in the warehouse."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    SetLocationUpdate,
    TableRequirement,
    TableUpdate,
    update_table_metadata,
)

from tsoracle.catalog.errors import BadRequest, CommitFailed

CACHED_METADATA = 256  # metadata files are immutable: a small cache saves a read per commit


class Warehouse:
    """Where tables live: a root URI every table location must be under, and its FileIO."""

    def __init__(self, uri: str, properties: dict[str, str] | None = None) -> None:
        self.uri = _normalise(uri)
        self.properties = {"warehouse": self.uri, **(properties or {})}
        self._ios: dict[str, FileIO] = {}
        self._cache: OrderedDict[str, TableMetadata] = OrderedDict()

    def io(self, location: str) -> FileIO:
        scheme = urlparse(location).scheme or "file"
        if scheme not in self._ios:
            self._ios[scheme] = load_file_io(self.properties, location)
        return self._ios[scheme]

    def table_location(self, namespace: Sequence[str], name: str,
                       namespace_properties: dict[str, str]) -> str:
        base = namespace_properties.get("location")
        if base:
            return self.inside(f"{base.rstrip('/')}/{name}")
        return f"{self.uri}/{'/'.join(namespace)}/{name}"

    def inside(self, location: str) -> str:
        """`location`, normalised, if it is within the warehouse; BadRequest otherwise."""
        normal = _normalise(location)
        if normal != self.uri and not normal.startswith(self.uri + "/"):
            raise BadRequest(f"location {location!r} is outside the catalog's warehouse "
                             f"{self.uri!r}; leave the location out, or give one under it")
        return normal

    def read(self, location: str) -> TableMetadata:
        found = self._cache.get(location)
        if found is None:
            found = FromInputFile.table_metadata(self.io(location).new_input(location))
            self._remember(location, found)
        return found

    def write(self, metadata: TableMetadata, location: str) -> None:
        ToOutputFile.table_metadata(metadata, self.io(location).new_output(location))
        self._remember(location, metadata)

    def delete(self, locations: Sequence[str]) -> None:
        for location in locations:
            try:
                self.io(location).delete(location)
            except (FileNotFoundError, OSError):
                pass  # best effort: an orphan file, never a wrong table

    def _remember(self, location: str, metadata: TableMetadata) -> None:
        self._cache[location] = metadata
        self._cache.move_to_end(location)
        while len(self._cache) > CACHED_METADATA:
            self._cache.popitem(last=False)


def _normalise(location: str) -> str:
    """One spelling per place: `file:/x`, `file:///x` and `/x` are all `file:///x`."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = os.path.normpath(parsed.path or "/")
        return "file://" + ("/" if not path.startswith("/") else "") + path.rstrip("/") \
            if path != "/" else "file:///"
    path = os.path.normpath(parsed.path or "/").rstrip("/")
    return f"{parsed.scheme}://{parsed.netloc}{'' if path in ('', '/', '.') else path}"


def check(requirements: Sequence[TableRequirement], base: TableMetadata | None) -> None:
    for requirement in requirements:
        try:
            requirement.validate(base)
        except CommitFailedException as exc:
            raise CommitFailed(str(exc)) from None


def apply(base: TableMetadata | None, base_location: str | None,
          updates: Sequence[TableUpdate], ts: int, warehouse: Warehouse) -> TableMetadata:
    """`base` with `updates` applied as of `ts`: new snapshots and the log entries this commit
    adds carry `ts`, and so does last-updated-ms."""
    stamped = tuple(AddSnapshotUpdate(snapshot=u.snapshot.model_copy(update={"timestamp_ms": ts}))
                    if isinstance(u, AddSnapshotUpdate) else u for u in updates)
    for u in stamped:
        if isinstance(u, SetLocationUpdate):
            warehouse.inside(u.location)
    try:
        new = update_table_metadata(
            base if base is not None else MetastoreCatalog._empty_table_metadata(),
            stamped, enforce_validation=base is None, metadata_location=base_location)
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise BadRequest(f"the table's updates cannot be applied: {exc}") from None
    warehouse.inside(new.location)
    return stamp(new, base, ts)


def stamp(new: TableMetadata, base: TableMetadata | None, ts: int) -> TableMetadata:
    already = len(base.snapshot_log) if base is not None else 0
    log = [*new.snapshot_log[:already],
           *(e.model_copy(update={"timestamp_ms": ts}) for e in new.snapshot_log[already:])]
    return new.model_copy(update={"last_updated_ms": ts, "snapshot_log": log})


def create(schema: Any, spec: Any, order: Any, location: str, properties: dict[str, str],
           ts: int) -> TableMetadata:
    metadata = new_table_metadata(schema, spec or UNPARTITIONED_PARTITION_SPEC,
                                  order or UNSORTED_SORT_ORDER, location, dict(properties))
    return metadata.model_copy(update={"last_updated_ms": ts})


def next_location(metadata: TableMetadata, base_location: str | None) -> str:
    version = MetastoreCatalog._parse_metadata_version(base_location) + 1 if base_location else 0
    provider = load_location_provider(metadata.location, metadata.properties)
    # The name carries a fresh UUID: a retried transaction recognises its own commit by it.
    return str(provider.new_table_metadata_file_location(version))
