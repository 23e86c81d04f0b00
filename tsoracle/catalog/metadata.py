"""Table metadata through pyiceberg: checking requirements, applying updates, stamping the
commit timestamp, and reading and writing metadata files in the warehouse."""

from __future__ import annotations

import gzip
import json
import os
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException, ValidationError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.serializers import Compressor, FromInputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    SetLocationUpdate,
    TableRequirement,
    TableUpdate,
    UpgradeFormatVersionUpdate,
    update_table_metadata,
)
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.types import NestedField, StructType

from tsoracle.catalog import boundary
from tsoracle.catalog.errors import BadRequest, CommitFailed, InvalidArgument

# The warehouse's folder of tables whose default folder another holds (spare_location).
SPARE_FOLDER = "_tsoracle_spare"
# Metadata files are immutable: a small cache saves a read per commit.
CACHED_METADATA = 256


class Warehouse:
    """Where tables live: a root URI every table location must be under, and its FileIO."""

    def __init__(self, uri: str, properties: dict[str, str] | None = None,
                 allowed: Sequence[str] = ()) -> None:
        self.uri = _root(uri)
        # Other roots an administrator allows table locations under (--allow-location).
        self.roots = [self.uri, *(_root(a) for a in allowed)]
        self.properties = {"warehouse": self.uri, **(properties or {})}
        self._ios: dict[str, FileIO] = {}
        self._cache: OrderedDict[str, TableMetadata] = OrderedDict()

    def io(self, location: str) -> FileIO:
        scheme = urlparse(location).scheme or "file"
        if scheme not in self._ios:
            # The catalog's own settings only: never a table's properties (a client's), which
            # could name a FileIO class to load.
            self._ios[scheme] = load_file_io(self.properties, location)
        return self._ios[scheme]

    def namespace_folder(self, namespace: Sequence[str],
                         namespace_properties: dict[str, str]) -> str:
        """Where a namespace's tables go by default: its `location` property, or one folder
        per level under the warehouse, each a name no other level maps to."""
        base = namespace_properties.get("location")
        if base:
            return self.inside(base.rstrip("/"))
        return self.inside("/".join([self.uri.rstrip("/"),
                                     *(self._segment(level) for level in namespace)]))

    def table_location(self, namespace: Sequence[str], name: str,
                       namespace_properties: dict[str, str]) -> str:
        """The default: the namespace's folder, then the name as one folder."""
        folder = self.namespace_folder(namespace, namespace_properties)
        return self.inside(f"{folder}/{self._segment(name)}")

    @staticmethod
    def _segment(name: str) -> str:
        folder = boundary.segment(name)
        if len(folder.encode()) > boundary.MAX_NAME_BYTES:
            raise BadRequest(f"the name {name!r} as a folder ({len(folder.encode())} bytes, "
                             f"percent-encoded) is longer than {boundary.MAX_NAME_BYTES} bytes: "
                             "give a shorter name, or a location")
        return folder

    def spare_location(self) -> str:
        """A folder no name maps to, for a table or view whose default folder another holds
        (the table that had the name was renamed, or a table's folder holds the namespace's)."""
        return f"{self.uri.rstrip('/')}/{SPARE_FOLDER}/{uuid.uuid4().hex}"

    def check_own(self, location: str, namespace: Sequence[str],
                  namespace_properties: dict[str, str]) -> None:
        """A location a client chose for a table or view: inside its namespace's folder, or
        inside a root --allow-location names, or one the catalog gave out (`spare_location`);
        never a root itself, or another namespace's folder, where it would stand in every
        later table's way."""
        resolved = self.resolve(location)
        own = self.resolve(self.namespace_folder(namespace, namespace_properties))
        spare = self.resolve(f"{self.uri.rstrip('/')}/{SPARE_FOLDER}")
        if any(resolved != root and boundary.within(resolved, root)
               for root in (*self.roots[1:], spare)):
            return
        if resolved != own and boundary.within(resolved, own):
            return
        raise BadRequest(f"location {location!r} is not inside the namespace's folder {own!r}: "
                         "a table or view goes in its namespace's folder (or under a root the "
                         "catalog's --allow-location names); leave the location out")

    def check_paths(self, location: str, properties: dict[str, str]) -> None:
        """Everything a table or view writes lies in its own folder: the folders its
        properties may point metadata and data files to are inside its location (another
        table's folder, or one outside the warehouse, would take or lose its files)."""
        folder = self.resolve(location)
        for key in boundary.PATH_PROPERTIES:
            if properties.get(key):
                if not boundary.within(self.resolve(properties[key]), folder):
                    raise BadRequest(f"{key} {properties[key]!r} is not inside the folder "
                                     f"{location!r} of its own table or view; leave it out, or "
                                     "give a folder inside that one")

    def resolve(self, location: str) -> str:
        """`location` as the FileIO will write it, if that is within the warehouse (or a root
        --allow-location allows); BadRequest otherwise."""
        resolved = boundary.resolve(location)
        if not any(boundary.within(resolved, root) for root in self.roots):
            raise BadRequest(f"location {location!r} is outside the catalog's warehouse "
                             f"{self.uri!r}; leave the location out, or give one under it (or "
                             "allow its root with the catalog's --allow-location)")
        return resolved

    def inside(self, location: str) -> str:
        """`location` as given, once `resolve` has found it safe and within the warehouse."""
        self.resolve(location)
        return location

    def read(self, location: str) -> TableMetadata:
        found = self._cache.get(location)
        if found is None:
            found = FromInputFile.table_metadata(self.io(location).new_input(location))
            self._remember(location, found)
        return found

    def read_bounded(self, location: str) -> TableMetadata:
        """`read`, for a file a client names: refused above the size limit before reading."""
        self._within_limit(location)
        return self.read(location)

    def _within_limit(self, location: str) -> None:
        size = len(self.io(location).new_input(location))
        if size > boundary.MAX_METADATA_BYTES:
            raise BadRequest(f"the metadata file is {size} bytes, above the catalog's limit of "
                             f"{boundary.MAX_METADATA_BYTES}")

    def write(self, metadata: TableMetadata, location: str) -> None:
        data = Compressor.get_compressor(location).bytes_compressor()(to_json(metadata).encode())
        with self.io(location).new_output(location).create(overwrite=False) as out:
            out.write(data)
        self._remember(location, metadata)

    def exists(self, location: str) -> bool:
        return bool(self.io(location).new_input(location).exists())

    def read_bytes_bounded(self, location: str) -> bytes:
        """`read_bytes`, for a file a client names: refused above the size limit first."""
        self._within_limit(location)
        return self.read_bytes(location)

    def read_bytes(self, location: str) -> bytes:
        with self.io(location).new_input(location).open() as f:
            data: bytes = f.read()
        return gzip.decompress(data) if location.endswith(".gz.metadata.json") else data

    def write_bytes(self, data: bytes, location: str) -> None:
        with self.io(location).new_output(location).create(overwrite=False) as out:
            out.write(data)

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


def to_json(metadata: TableMetadata) -> str:
    """The metadata as JSON, format version 3 too: pyiceberg reads v3 and applies its updates
    but refuses to write it, a guard for its own writers, which the catalog is not."""
    return IcebergBaseModel.model_dump_json(metadata)


def _root(uri: str) -> str:
    """A warehouse or allowed root, which the administrator gives: a local path may be
    relative to the catalog's working directory (the FileIO would write it there)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") and not parsed.netloc:
        return boundary.resolve("file://" + os.path.abspath(parsed.path or "/"))
    return boundary.resolve(uri)


# pyiceberg's words for a failed requirement -> the words of Iceberg's REST spec implementations
# (Java's UpdateRequirement), which engines and the REST Compatibility Kit match on.
_WORDING = (
    ("Table already exists", "Requirement failed: table already exists"),
    ("Table UUID does not match: ", "Requirement failed: UUID does not match: expected "),
    ("last assigned field id has changed", "last assigned field id changed"),
    ("current schema id has changed", "current schema changed"),
    ("last assigned partition id has changed", "last assigned partition id changed"),
    ("default spec id has changed", "default partition spec changed"),
    ("default sort order id has changed", "default sort order changed"),
)


def check(requirements: Sequence[TableRequirement], base: TableMetadata | None) -> None:
    for requirement in requirements:
        try:
            requirement.validate(base)
        except CommitFailedException as exc:
            message = str(exc)
            for theirs, ours in _WORDING:
                message = message.replace(theirs, ours)
            raise CommitFailed(message) from None


def needed_for_reads(base: TableMetadata, horizon: int) -> set[int]:
    """The snapshots a read at any timestamp T >= `horizon` may use: the one main had at
    `horizon`, every one it had after, every ref's current one, and any made after it."""
    keep = {e.snapshot_id for e in base.snapshot_log if e.timestamp_ms > horizon}
    earlier = [e for e in base.snapshot_log if e.timestamp_ms <= horizon]
    if earlier:
        keep.add(earlier[-1].snapshot_id)
    keep |= {ref.snapshot_id for ref in base.refs.values()}
    keep |= {s.snapshot_id for s in base.snapshots if s.timestamp_ms > horizon}
    if base.current_snapshot_id is not None:
        keep.add(base.current_snapshot_id)
    return keep


def _content(item: Any, key: str) -> str:
    """A schema, spec or sort order apart from its id (`key`): equal for the same one."""
    return str(item.model_copy(update={key: 0}).model_dump_json())


_SET_ID: dict[type, str] = {SetCurrentSchemaUpdate: "schema_id", SetDefaultSpecUpdate: "spec_id",
                            SetDefaultSortOrderUpdate: "sort_order_id"}


def renumber(base: TableMetadata | None, updates: Sequence[TableUpdate]) -> list[TableUpdate]:
    """`updates` with the ids of added schemas, specs and sort orders settled the way Iceberg's
    own metadata builder settles them (which pyiceberg does not): one equal to an existing one
    is that one; one whose id is taken gets the next free id; and "-1" (the last one added)
    in the set-current/default update that follows names the id it got.

    Two writers that replaced a table concurrently both send "sort order 1", for example; the
    second, retried on the first's metadata, must add a sort order 2, not fail."""
    kinds = {  # add update -> (field, id attribute, what base holds, the setter that follows)
        AddSchemaUpdate: ("schema_", "schema_id", "schemas", SetCurrentSchemaUpdate),
        AddPartitionSpecUpdate: ("spec", "spec_id", "partition_specs", SetDefaultSpecUpdate),
        AddSortOrderUpdate: ("sort_order", "order_id", "sort_orders", SetDefaultSortOrderUpdate),
    }
    known = {add: list(getattr(base, held)) if base is not None else []
             for add, (_, _, held, _) in kinds.items()}
    # Each kind's items by their content apart from the id (a key computed once per item, so
    # that a commit adding many is linear, not quadratic), and the ids taken.
    by_content = {add: {_content(k, kinds[add][1]): getattr(k, kinds[add][1]) for k in items}
                  for add, items in known.items()}
    taken = {add: {getattr(k, kinds[add][1]) for k in items} for add, items in known.items()}
    last: dict[type, int] = {}  # setter -> the id the last add got
    out: list[TableUpdate] = []
    for update in updates:
        kind = kinds.get(type(update))
        if kind is not None:
            field, key, _, setter = kind
            item = getattr(update, field)
            content = _content(item, key)
            if content in by_content[type(update)]:
                last[setter] = by_content[type(update)][content]
                continue  # already there: nothing to add
            ids = taken[type(update)]
            if getattr(item, key) in ids:
                item = item.model_copy(update={key: max(ids) + 1})
                update = type(update)(**{field: item})
            by_content[type(update)].setdefault(content, getattr(item, key))
            ids.add(getattr(item, key))
            last[setter] = getattr(item, key)
        else:
            target = next((k for k in last if isinstance(update, k)), None)
            if target is not None and getattr(update, _SET_ID[target]) == -1:
                update = target(**{_SET_ID[target]: last[target]})
        out.append(update)
    return out


def apply(base: TableMetadata | None, base_location: str | None,
          updates: Sequence[TableUpdate], ts: int, warehouse: Warehouse) -> TableMetadata:
    """`base` with `updates` applied as of `ts`: new snapshots and the log entries this commit
    adds carry `ts`, and so does last-updated-ms."""
    updates = renumber(base, updates)
    # pyiceberg applies updates to format version 3 tables but will not upgrade one to it: the
    # updates are applied at version 2 and the result is raised to 3 (as the upgrade is, a
    # change of the version number; next-row-id starts at 0).
    to_v3 = any(isinstance(u, UpgradeFormatVersionUpdate) and u.format_version == 3
                for u in updates) and (base is None or base.format_version < 3)
    if to_v3:
        updates = [UpgradeFormatVersionUpdate.model_validate({"format-version": 2})
                   if isinstance(u, UpgradeFormatVersionUpdate) else u for u in updates]
    stamped = tuple(AddSnapshotUpdate(snapshot=u.snapshot.model_copy(update={"timestamp_ms": ts}))
                    if isinstance(u, AddSnapshotUpdate) else u for u in updates)
    for u in stamped:
        if isinstance(u, SetLocationUpdate):
            warehouse.inside(u.location)
    try:
        new = update_table_metadata(
            base if base is not None else MetastoreCatalog._empty_table_metadata(),
            stamped, enforce_validation=base is None, metadata_location=base_location)
        warehouse.check_paths(new.location, new.properties)
        check_snapshots(stamped, warehouse.resolve(new.location))
        if to_v3:
            new = TableMetadataUtil.parse_obj({**json.loads(to_json(new)), "format-version": 3,
                                               "next-row-id": 0})
        # Serialised once here: metadata that cannot be written is this request's error.
        to_json(new)
    except (ValueError, AttributeError, KeyError, TypeError, IndexError,
            ValidationError) as exc:
        # The requirements held, so the table is what the client built its change on: the
        # updates themselves are wrong, and sending them again would fail again (a 409 would
        # have engines retry forever).
        raise InvalidArgument(f"the table's updates cannot be applied: {exc}") from None
    return stamp(new, base, ts)


LONG = range(-(2**63), 2**63)  # Iceberg's snapshot ids and sequence numbers are Java longs
INT = range(-(2**31), 2**31)  # and its schema ids Java ints


def check_snapshots(updates: Sequence[TableUpdate], folder: str) -> None:
    """A new snapshot's manifest list lies in its table's folder (a purge reads it and
    deletes what it lists), and its ids fit the format's longs."""
    for u in updates:
        if not isinstance(u, AddSnapshotUpdate):
            continue
        snapshot = u.snapshot
        for what, value, bits in (("snapshot-id", snapshot.snapshot_id, LONG),
                                  ("parent-snapshot-id", snapshot.parent_snapshot_id, LONG),
                                  ("sequence-number", snapshot.sequence_number, LONG),
                                  ("schema-id", snapshot.schema_id, INT)):
            if value is not None and value not in bits:
                raise BadRequest(f"add-snapshot: {what} {value} does not fit the format's "
                                 f"{'64' if bits is LONG else '32'}-bit integers")
        if snapshot.manifest_list and not boundary.within(
                boundary.resolve(snapshot.manifest_list), folder):
            raise BadRequest(f"add-snapshot: manifest-list {snapshot.manifest_list!r} is not "
                             f"inside the table's folder {folder!r}; write it there")


def stamp(new: TableMetadata, base: TableMetadata | None, ts: int) -> TableMetadata:
    """Every snapshot-log entry this commit added carries `ts`, whatever the updates were.

    pyiceberg keeps the entries of the base that survive (a removed snapshot takes its own
    out), in order, and appends the new ones (a snapshot added, a rollback or any other move
    of main, stamped with its wall clock): the survivors are the longest run of the new log
    that is an ordered subsequence of the base's, and everything after them is new."""
    old = list(base.snapshot_log) if base is not None else []
    log, j, appended = [], 0, False
    for entry in new.snapshot_log:
        if not appended:
            while j < len(old) and old[j] != entry:
                j += 1
            if j < len(old):
                j += 1
                log.append(entry)
                continue
            appended = True
        log.append(entry.model_copy(update={"timestamp_ms": ts}))
    return _complete(new.model_copy(update={"last_updated_ms": ts, "snapshot_log": log}))


def _complete(metadata: TableMetadata) -> TableMetadata:
    """Format version 3 requires next-row-id, which pyiceberg leaves unset on a new table."""
    if metadata.format_version >= 3 and getattr(metadata, "next_row_id", 0) is None:
        return metadata.model_copy(update={"next_row_id": 0})
    return metadata


def create(schema: Schema, spec: Any, order: Any, location: str, properties: dict[str, str],
           ts: int) -> TableMetadata:
    try:
        metadata = new_table_metadata(schema, spec or UNPARTITIONED_PARTITION_SPEC,
                                      order or UNSORTED_SORT_ORDER, location, dict(properties))
    except (ValueError, AttributeError, KeyError, TypeError, IndexError,
            ValidationError) as exc:
        # A partition spec or sort order on a column the schema lacks, and the like.
        raise InvalidArgument(f"invalid table: {exc}") from None
    fresh = metadata.schemas[0]
    kept = Schema(*_with_defaults(fresh.fields, schema, ""), schema_id=fresh.schema_id,
                  identifier_field_ids=fresh.identifier_field_ids)
    return _complete(metadata.model_copy(update={"last_updated_ms": ts, "schemas": [kept]}))


def _with_defaults(fields: Sequence[NestedField], requested: Schema,
                   prefix: str) -> list[NestedField]:
    """`fields` (renumbered by pyiceberg) with the default values the request gave them, which
    pyiceberg's renumbering drops."""
    out = []
    for f in fields:
        name = f"{prefix}{f.name}"
        given = requested.find_field(name) if name in index_by_name(requested) else None
        field_type = f.field_type
        if isinstance(field_type, StructType):
            field_type = StructType(*_with_defaults(field_type.fields, requested, name + "."))
        update: dict[str, Any] = {"field_type": field_type}
        if given is not None:
            update |= {"initial_default": given.initial_default,
                       "write_default": given.write_default}
        out.append(f.model_copy(update=update))
    return out


def next_location(metadata: TableMetadata, base_location: str | None) -> str:
    """Where the next metadata file goes: the table's metadata folder (`write.metadata.path`,
    else `<location>/metadata`), as Iceberg names the file. Worked out here, never by a
    location provider a table's properties could name."""
    version = MetastoreCatalog._parse_metadata_version(base_location) + 1 if base_location else 0
    folder = metadata.properties.get("write.metadata.path") or \
        f"{metadata.location.rstrip('/')}/metadata"
    # The name carries a fresh UUID: a retried transaction recognises its own commit by it.
    return f"{folder.rstrip('/')}/{version:05d}-{uuid.uuid4()}.metadata.json"
