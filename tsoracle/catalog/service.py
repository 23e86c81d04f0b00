"""The catalog's operations, in the REST spec's terms, over the rows (state.py), the metadata
files (metadata.py) and the oracle's order (ordering.py). HTTP lives in app.py."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import MetastoreCatalog, delete_files
from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import MetadataLogEntry, SnapshotLogEntry
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCreate,
    RemovePropertiesUpdate,
    RemoveSnapshotsUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
    SetStatisticsUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.view.metadata import ViewMetadata

from tsoracle.catalog import boundary, idempotency, metadata, state, views
from tsoracle.catalog.boundary import check_name
from tsoracle.catalog.errors import (
    BadRequest,
    CatalogError,
    NotFound,
    location_taken,
    name_taken,
    namespace_taken,
    no_namespace,
    no_table,
    no_view,
    not_empty,
    rename_taken,
)
from tsoracle.catalog.ordering import Ordering, Plan, based_on
from tsoracle.catalog.state import Namespace
from tsoracle.store import Backend, Tx

log = logging.getLogger("tsoracle.catalog")
TABLE, VIEW = "table", "view"


@dataclass(frozen=True)
class Loaded:
    """A table as the REST spec returns it (`metadata_location` None: staged, not created)."""

    metadata_location: str | None
    metadata: TableMetadata


@dataclass(frozen=True)
class Change:
    """One table's part of a commit."""

    namespace: Namespace
    name: str
    requirements: Sequence[TableRequirement]
    updates: Sequence[TableUpdate]


class Catalog:
    def __init__(self, backend: Backend, ordering: Ordering,
                 warehouse: metadata.Warehouse) -> None:
        self.backend = backend
        self.ordering = ordering
        self.warehouse = warehouse

    async def record_locations(self) -> None:
        """Record the folders of tables and views made before the catalog recorded them (an
        upgrade), so that new ones are kept out of them too."""
        for found in await state.unlocated(self.backend):
            try:
                if found.kind == TABLE:
                    where = (await self._read(found.metadata_location)).location
                else:
                    where = (await self._read_view(found.metadata_location)).location
                resolved = self.warehouse.resolve(where)
            except Exception as exc:  # unreadable or outside: it cannot be protected
                log.warning("the folder of %s could not be recorded: %s",
                            _dotted((*found.namespace, found.name)), exc.__class__.__name__)
                continue

            async def record(tx: Tx, found: state.Pointer = found, at: str = resolved) -> None:
                await state.record_location(tx, found.namespace, found.name, at)

            await self.backend.transaction(record)

    # --- namespaces ---------------------------------------------------------------------------

    async def list_namespaces(self, parent: Namespace | None) -> list[Namespace]:
        known = await state.namespaces(self.backend)
        if parent and parent not in known:
            raise no_namespace(parent)
        depth = len(parent) if parent else 0
        return sorted(ns for ns in known
                      if len(ns) == depth + 1 and ns[:depth] == (parent or ()))

    async def create_namespace(self, ns: Namespace, properties: dict[str, str]) -> None:
        self._check_namespace_properties(ns, properties)

        async def body(tx: Tx) -> bool:
            # The parent first, locked: a namespace whose parent is missing would be in no
            # listing, and the parent's drop takes the same lock before it looks for children.
            if len(ns) > 1 and await state.namespace_for_update(tx, ns[:-1]) is None:
                # A 400: the spec lists no 404 for this operation.
                raise BadRequest(f"{no_namespace(ns[:-1]).message}; create the parent "
                                 "namespace first")
            created = await state.create_namespace(tx, ns, properties)
            if created:
                await idempotency.record(tx)
            return created

        if not await self.backend.transaction(body):
            raise namespace_taken(ns)

    def _check_namespace_properties(self, ns: Namespace, properties: dict[str, str]) -> None:
        boundary.check_properties(properties, "namespace properties")
        if properties.get("location"):
            # Its own default folder or below, or under an --allow-location root: never
            # another namespace's folder, whose tables it would stand in the way of.
            given = properties["location"]
            own = self.warehouse.resolve(self.warehouse.namespace_folder(ns, {}))
            resolved = self.warehouse.resolve(given)
            if not boundary.within(resolved, own) and not any(
                    resolved != root and boundary.within(resolved, root)
                    for root in self.warehouse.roots[1:]):
                raise BadRequest(f"namespace location {given!r} is not inside the "
                                 f"namespace's own folder {own!r} (or under a root the "
                                 "catalog's --allow-location names)")

    async def load_namespace(self, ns: Namespace) -> dict[str, str]:
        found = await state.namespace(self.backend, ns)
        if found is None:
            raise no_namespace(ns)
        return found

    async def drop_namespace(self, ns: Namespace) -> None:
        async def body(tx: Tx) -> None:
            if await state.namespace_for_update(tx, ns) is None:
                raise no_namespace(ns)
            children = [k for k in await state.namespaces(tx)
                        if len(k) > len(ns) and k[:len(ns)] == ns]
            if await state.count_objects(tx, ns) or children:
                raise not_empty(ns)
            await state.drop_namespace(tx, ns)
            await idempotency.record(tx)

        await self.backend.transaction(body)

    async def update_namespace(self, ns: Namespace, removals: Sequence[str],
                               updates: dict[str, str]) -> dict[str, list[str]]:
        boundary.check_keys(removals, "removals")
        self._check_namespace_properties(ns, updates)
        overlap = set(removals) & set(updates)
        if overlap:
            raise BadRequest(f"properties {sorted(overlap)} are both removed and updated")

        async def body(tx: Tx) -> dict[str, list[str]]:
            current = await state.namespace_for_update(tx, ns)
            if current is None:
                raise no_namespace(ns)
            missing = [k for k in removals if k not in current]
            removed = [k for k in removals if k in current]
            merged = {k: v for k, v in current.items() if k not in removed} | updates
            await state.set_namespace_properties(tx, ns, merged)
            result = {"removed": removed, "updated": list(updates), "missing": missing}
            # Its answer with its key: it cannot be told again from the namespace afterwards.
            await idempotency.record(tx, answer=(200, idempotency.as_json(result)))
            return result

        return await self.backend.transaction(body)

    # --- tables -------------------------------------------------------------------------------

    async def list_tables(self, ns: Namespace, after: str | None = None,
                          limit: int | None = None) -> list[str]:
        """Names in the database's order, from just after `after`, `limit` at most."""
        await self.load_namespace(ns)
        return await state.objects(self.backend, ns, TABLE, after, limit)

    async def load_table(self, ns: Namespace, name: str) -> Loaded:
        found = await self._pointer(ns, name)
        # The metadata is answered from the cache, but a table whose current file is gone is
        # broken for every engine that reads the file: said as the file missing.
        if not await asyncio.to_thread(self.warehouse.exists, found.metadata_location):
            raise NotFound(f"Failed to open input stream for file: {found.metadata_location}")
        return Loaded(found.metadata_location, await self._read(found.metadata_location))

    async def table_exists(self, ns: Namespace, name: str) -> bool:
        found = await state.pointer(self.backend, ns, name)
        return found is not None and found.kind == TABLE

    async def create_table(self, ns: Namespace, request: CreateTableRequest) -> Loaded:
        name = check_name(request.name)
        boundary.check_properties(request.properties, "table properties")
        props = await self.load_namespace(ns)
        if request.location:
            self.warehouse.check_own(request.location, ns, props)
        location = request.location or await self._default_location(ns, name, props)
        self.warehouse.check_paths(location, request.properties)
        resolved = self.warehouse.resolve(location)

        def fresh(ts: int) -> TableMetadata:
            return metadata.create(request.table_schema, request.partition_spec,
                                   request.write_order, location, request.properties, ts)

        if request.stage_create:
            await self._free(ns, name, TABLE)
            # Nothing is recorded yet (the create commits later), but an engine writes data
            # files there before then: not in another table's folder.
            user = await state.location_user(self.backend, resolved, ns, name)
            if user is not None:
                raise location_taken(location, (*ns, name), (*user[0], user[1]))
            return Loaded(None, fresh(await self.ordering.closed()))

        async def build(ts: int, attempt: int) -> Plan[Loaded]:
            await self._free(ns, name, TABLE)
            new = fresh(ts)
            target = metadata.next_location(new, None)
            await asyncio.to_thread(self.warehouse.write, new, target)
            return Plan(Loaded(target, new), swaps=[state.Swap(ns, name, None, target)],
                        written=[target], locations=[(ns, name, resolved)])

        return await self.ordering.commit(build)

    async def commit(self, changes: Sequence[Change]) -> list[Loaded]:
        """Several tables' changes at one timestamp, all or nothing."""
        for change in changes:
            self.check_updates(change.updates)
        names = [(c.namespace, c.name) for c in changes]
        if len(set(names)) != len(names):
            raise BadRequest("a transaction names the same table twice; merge its changes")

        async def build(ts: int, attempt: int) -> Plan[list[Loaded]]:
            plan: Plan[list[Loaded]] = Plan([])
            try:
                for change in changes:
                    loaded, swap, moved_to = await self._apply(change, ts, attempt)
                    plan.written.append(swap.new)
                    plan.swaps.append(swap)
                    plan.result.append(loaded)
                    plan.after[(change.namespace, change.name)] = (swap.new, loaded.metadata)
                    if moved_to is not None:
                        plan.locations.append((change.namespace, change.name, moved_to))
            except BaseException:
                await self.discard(plan.written)
                raise
            return plan

        return await self.ordering.commit(build, tables=frozenset(names))

    def check_updates(self, updates: Sequence[TableUpdate]) -> None:
        """What a commit's updates may set, checked before any database work."""
        for update in updates:
            if isinstance(update, SetPropertiesUpdate):
                boundary.check_properties(update.updates, "set-properties")
                self.warehouse.check_paths(self.warehouse.uri, update.updates)
            elif isinstance(update, RemovePropertiesUpdate):
                boundary.check_keys(update.removals, "remove-properties")
            elif isinstance(update, SetLocationUpdate):
                self.warehouse.inside(update.location)
            elif isinstance(update, SetStatisticsUpdate):
                for value in (update.snapshot_id, update.statistics.snapshot_id):
                    if value is not None and value not in metadata.LONG:
                        raise BadRequest(f"set-statistics: snapshot-id {value} does not fit "
                                         "the format's 64-bit integers")

    async def _apply(self, change: Change, ts: int, attempt: int
                     ) -> tuple[Loaded, state.Swap, str | None]:
        """The change on the table's current metadata, written; and the table's new resolved
        location if it has a new one (created, or moved by set-location)."""
        ns, name = change.namespace, check_name(change.name)
        base_location, base = await self._base(change)
        metadata.check(change.requirements, base)
        removed = {i for u in change.updates if isinstance(u, RemoveSnapshotsUpdate)
                   for i in u.snapshot_ids}
        if removed and base is not None:
            await self._keep_for_reads(base, removed, ts, (*ns, name))
        # CPU work that grows with the updates and the table's history: off the event loop.
        new = await asyncio.to_thread(metadata.apply, base, base_location, change.updates, ts,
                                      self.warehouse)
        resolved = self.warehouse.resolve(new.location)
        moved_to = None if base is not None and \
            self.warehouse.resolve(base.location) == resolved else resolved
        if moved_to is not None:  # a create's or set-location's: the client's choice
            self.warehouse.check_own(new.location, ns, await self.load_namespace(ns))
        target = metadata.next_location(new, base_location)
        await asyncio.to_thread(self.warehouse.write, new, target)
        return Loaded(target, new), state.Swap(ns, name, base_location, target), moved_to

    async def _base(self, change: Change) -> tuple[str | None, TableMetadata | None]:
        """Where a table change starts: the metadata an earlier commit of its group leaves
        the table at, else the table's current metadata (None, None: a create)."""
        ns, name = change.namespace, change.name
        chained = based_on((ns, name))
        if chained is not None:
            return chained
        found = await state.pointer(self.backend, ns, name)
        creating = any(isinstance(r, AssertCreate) for r in change.requirements)
        if found is None and not creating:
            await self.load_namespace(ns)
            raise no_table((*ns, name))
        if found is not None and found.kind != TABLE:
            raise name_taken((*ns, name), found.kind, TABLE)
        if found is None:
            await self.load_namespace(ns)
            return None, None
        return found.metadata_location, await self._read(found.metadata_location)

    async def _keep_for_reads(self, base: TableMetadata, removed: set[int], ts: int,
                              ident: tuple[str, ...]) -> None:
        """Refuse snapshot expiry that would take a snapshot from a read at a timestamp
        handed out within the catalog's retention window (whichever engine asks). A
        retention of 0 keeps nothing for reads."""
        if self.ordering.retention_ms <= 0:
            return
        kept = removed & metadata.needed_for_reads(base, await self.ordering.horizon(ts))
        if kept:
            raise BadRequest(
                f"remove-snapshots on {_dotted(ident)} would remove snapshots "
                f"{sorted(kept)}, which reads at timestamps handed out within the catalog's "
                f"retention of {self.ordering.retention_ms / 1000:g} s still need; expire "
                "only snapshots older than that (the catalog's --retention, or "
                "spec.catalog.retentionSeconds)")

    async def drop_table(self, ns: Namespace, name: str, purge: bool) -> None:
        async def build(ts: int, attempt: int) -> Plan[tuple[str, TableMetadata]]:
            found = await self._pointer(ns, name)
            return Plan((found.metadata_location, await self._read(found.metadata_location)),
                        drops=[found])

        current, dropped = await self.ordering.commit(build)
        if purge:
            asyncio.get_running_loop().run_in_executor(None, self._purge, current, dropped)

    def _purge(self, current: str, dropped: TableMetadata) -> None:
        """Delete a dropped table's files: only those inside its own folder. Its metadata was
        written by clients, and a manifest list, manifest or metadata-log entry may name
        another table's files, or files outside the warehouse: those stay."""
        io = self.warehouse.io(dropped.location)
        try:
            folder = self.warehouse.resolve(dropped.location)
        except CatalogError:
            log.warning("a dropped table's folder is not the catalog's to purge; its files stay")
            return

        def own(path: str) -> bool:
            try:
                return boundary.within(boundary.resolve(path), folder)
            except CatalogError:
                return False

        try:
            lists = {s.manifest_list for s in dropped.snapshots if s.manifest_list}
            manifests = [m for s in dropped.snapshots if s.manifest_list and own(s.manifest_list)
                         for m in s.manifests(io) if own(m.manifest_path)]
            data = {e.data_file.file_path for m in manifests
                    for e in m.fetch_manifest_entry(io, discard_deleted=False)}
            for kind, paths in (("data", data), ("manifest", {m.manifest_path for m in manifests}),
                                ("manifest list", lists),
                                # The current file too: registered again, it would be a table
                                # whose data is gone.
                                ("metadata", {current,
                                              *(e.metadata_file for e in dropped.metadata_log)})):
                delete_files(io, {p for p in paths if own(p)}, kind)
        except Exception as exc:  # the table is gone either way; its files become orphans
            log.warning("purging a dropped table's files stopped: %s", exc.__class__.__name__)

    async def rename_table(self, source: Namespace, name: str, dest: Namespace,
                           dest_name: str) -> None:
        check_name(dest_name)

        async def build(ts: int, attempt: int) -> Plan[None]:
            found = await self._pointer(source, name)
            await self._rename_target(found, dest, dest_name)
            return Plan(None, renames=[(found, dest, dest_name)])

        await self.ordering.commit(build)

    async def register_table(self, ns: Namespace, request: RegisterTableRequest) -> Loaded:
        name = check_name(request.name)
        location = self.warehouse.inside(request.metadata_location)
        try:
            registered = await asyncio.to_thread(self.warehouse.read_bounded, location)
        except CatalogError:
            raise
        except Exception:
            raise BadRequest(f"no readable table metadata at {request.metadata_location!r}") \
                from None
        boundary.check_properties(registered.properties, "the registered table's properties")
        self.warehouse.check_paths(registered.location, registered.properties)
        resolved = self.warehouse.resolve(registered.location)

        async def build(ts: int, attempt: int) -> Plan[Loaded]:
            # Its folder, like any a client chooses, is in the namespace's (or an allowed
            # root): a registered table may not stand in another namespace's way.
            self.warehouse.check_own(registered.location, ns, await self.load_namespace(ns))
            found = await state.pointer(self.backend, ns, name)
            if found is not None and (found.kind != TABLE or not request.overwrite):
                raise name_taken((*ns, name), found.kind, TABLE)
            user = await state.metadata_in_use(self.backend, location)
            if user is not None and user != (ns, name):
                raise location_taken(location, (*ns, name), (*user[0], user[1]))
            expected = found.metadata_location if found else None
            if expected is None:
                return Plan(Loaded(location, registered),
                            swaps=[state.Swap(ns, name, None, location)],
                            locations=[(ns, name, resolved)])
            # Overwrite: a commit to the table, from its current metadata to the registered
            # one, written anew with what it adds stamped W, as any commit's is.
            base = await self._read(expected)
            moved = forward_only(base, expected, location, registered, ts, (*ns, name))
            target = metadata.next_location(moved, expected)
            await asyncio.to_thread(self.warehouse.write, moved, target)
            return Plan(Loaded(target, moved), swaps=[state.Swap(ns, name, expected, target)],
                        written=[target], locations=[(ns, name, resolved)])

        return await self.ordering.commit(build)

    # --- views --------------------------------------------------------------------------------

    async def list_views(self, ns: Namespace, after: str | None = None,
                         limit: int | None = None) -> list[str]:
        """Names in the database's order, from just after `after`, `limit` at most."""
        await self.load_namespace(ns)
        return await state.objects(self.backend, ns, VIEW, after, limit)

    async def load_view(self, ns: Namespace, name: str) -> tuple[str, ViewMetadata]:
        found = await self._view(ns, name)
        return found.metadata_location, await self._read_view(found.metadata_location)

    async def view_exists(self, ns: Namespace, name: str) -> bool:
        found = await state.pointer(self.backend, ns, name)
        return found is not None and found.kind == VIEW

    async def create_view(self, ns: Namespace, request: dict[str, Any]
                          ) -> tuple[str, ViewMetadata]:
        name = _view_name(request)
        given_props = request.get("properties") or {}
        if not isinstance(given_props, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in given_props.items()):
            raise BadRequest("a view's `properties` must be an object of strings")
        boundary.check_properties(given_props, "view properties")
        props = await self.load_namespace(ns)
        given = request.get("location")
        if given:
            self.warehouse.check_own(str(given), ns, props)
        location = str(given) if given else await self._default_location(ns, name, props)
        resolved = self.warehouse.resolve(location)

        async def build(ts: int, attempt: int) -> Plan[tuple[str, ViewMetadata]]:
            await self._free(ns, name, VIEW)
            new = views.create(request, location, ts)
            self.warehouse.check_paths(new.location, new.properties)
            target = self._view_file(new, 0)
            await self._write_view(new, target)
            return Plan((target, new), swaps=[state.Swap(ns, name, None, target, VIEW)],
                        written=[target], locations=[(ns, name, resolved)])

        return await self.ordering.commit(build)

    async def register_view(self, ns: Namespace, request: dict[str, Any]
                            ) -> tuple[str, ViewMetadata]:
        """An existing view metadata file as the view `name` (a view dropped, say, registered
        again): the file is the view's current version as it is, nothing written."""
        name = _view_name(request)
        given = request.get("metadata-location")
        if not isinstance(given, str) or not given:
            raise BadRequest("register-view needs `metadata-location`: the view's metadata file")
        location = self.warehouse.inside(given)
        try:
            registered = views.parse(await asyncio.to_thread(self.warehouse.read_bytes_bounded,
                                                             location))
        except CatalogError:
            raise
        except Exception:
            raise BadRequest(f"no readable view metadata at {given!r}") from None
        boundary.check_properties(registered.properties, "the registered view's properties")
        self.warehouse.check_paths(registered.location, registered.properties)
        resolved = self.warehouse.resolve(registered.location)

        async def build(ts: int, attempt: int) -> Plan[tuple[str, ViewMetadata]]:
            self.warehouse.check_own(registered.location, ns, await self.load_namespace(ns))
            await self._free(ns, name, VIEW)
            user = await state.metadata_in_use(self.backend, location)
            if user is not None:
                raise location_taken(location, (*ns, name), (*user[0], user[1]))
            return Plan((location, registered), swaps=[state.Swap(ns, name, None, location, VIEW)],
                        locations=[(ns, name, resolved)])

        return await self.ordering.commit(build)

    async def replace_view(self, ns: Namespace, name: str, requirements: list[dict[str, Any]],
                           updates: list[dict[str, Any]]) -> tuple[str, ViewMetadata]:
        for update in updates:
            if update.get("action") == "set-properties":
                given = update.get("updates")
                if not isinstance(given, dict) or not all(
                        isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
                    raise BadRequest("set-properties: `updates` must be an object of strings")
                boundary.check_properties(given, "set-properties")
            elif update.get("action") == "set-location":
                self.warehouse.inside(str(update.get("location")))

        async def build(ts: int, attempt: int) -> Plan[tuple[str, ViewMetadata]]:
            found = await self._view(ns, name)
            base = await self._read_view(found.metadata_location)
            views.check(requirements, base)
            new = views.apply(base, updates, ts)
            self.warehouse.check_paths(new.location, new.properties)
            resolved = self.warehouse.resolve(new.location)
            moved = self.warehouse.resolve(base.location) != resolved
            if moved:
                self.warehouse.check_own(new.location, ns, await self.load_namespace(ns))
            version = MetastoreCatalog._parse_metadata_version(found.metadata_location) + 1
            target = self._view_file(new, version)
            await self._write_view(new, target)
            return Plan((target, new), written=[target], swaps=[
                state.Swap(ns, name, found.metadata_location, target, VIEW)],
                locations=[(ns, name, resolved)] if moved else [])

        return await self.ordering.commit(build)

    async def drop_view(self, ns: Namespace, name: str) -> None:
        async def build(ts: int, attempt: int) -> Plan[None]:
            return Plan(None, drops=[await self._view(ns, name)])

        await self.ordering.commit(build)

    async def rename_view(self, source: Namespace, name: str, dest: Namespace,
                          dest_name: str) -> None:
        check_name(dest_name)

        async def build(ts: int, attempt: int) -> Plan[None]:
            found = await self._view(source, name)
            await self._rename_target(found, dest, dest_name)
            return Plan(None, renames=[(found, dest, dest_name)])

        await self.ordering.commit(build)

    async def _view(self, ns: Namespace, name: str) -> state.Pointer:
        found = await state.pointer(self.backend, ns, name)
        if found is None or found.kind != VIEW:
            raise no_view((*ns, name))
        return found

    def _view_file(self, view: ViewMetadata, version: int) -> str:
        folder = view.properties.get("write.metadata.path") or f"{view.location}/metadata"
        self.warehouse.inside(folder)
        return f"{folder.rstrip('/')}/{version:05d}-{uuid.uuid4()}.metadata.json"

    async def _read_view(self, location: str) -> ViewMetadata:
        return views.parse(await asyncio.to_thread(self.warehouse.read_bytes, location))

    async def _write_view(self, metadata_: ViewMetadata, location: str) -> None:
        await asyncio.to_thread(self.warehouse.write_bytes, views.to_json(metadata_).encode(),
                                location)

    # --- helpers ------------------------------------------------------------------------------

    async def _default_location(self, ns: Namespace, name: str, props: dict[str, str]) -> str:
        """The namespace's folder and the name; a spare folder if another table or view holds
        that one (renamed away from the name, or a table whose folder holds the namespace's),
        so that no one can stand in the way of a create by taking its folder first."""
        location = self.warehouse.table_location(ns, name, props)
        if await state.location_user(self.backend, self.warehouse.resolve(location), ns,
                                     name) is None:
            return location
        return self.warehouse.spare_location()

    async def _free(self, ns: Namespace, name: str, kind: str) -> None:
        """Raise AlreadyExists unless no table or view has this name."""
        found = await state.pointer(self.backend, ns, name)
        if found is not None:
            raise name_taken((*ns, name), found.kind, kind)

    async def _rename_target(self, source: state.Pointer, dest: Namespace, name: str) -> None:
        await self.load_namespace(dest)
        taken = await state.pointer(self.backend, dest, name)
        if taken is not None:
            raise rename_taken((*source.namespace, source.name), (*dest, name), taken.kind)

    async def _pointer(self, ns: Namespace, name: str) -> state.Pointer:
        # NoSuchTable even when the namespace is missing too: engines probe `db.t.snapshots`
        # as the table `snapshots` in namespace `db.t`, and only a missing table sends them on
        # to the metadata table.
        found = await state.pointer(self.backend, ns, name)
        if found is None or found.kind != TABLE:
            raise no_table((*ns, name))
        return found

    async def _read(self, location: str) -> TableMetadata:
        return await asyncio.to_thread(self.warehouse.read, location)

    async def discard(self, locations: list[str]) -> None:
        if locations:
            await asyncio.to_thread(self.warehouse.delete, list(locations))


# What register with overwrite may change in a table's metadata (the rest stays as it is):
# what a commit may add or move. Lists keyed by id keep every item the table has, as it is.
_MOVABLE = {"snapshots", "snapshot-log", "refs", "current-snapshot-id", "last-sequence-number",
            "last-updated-ms", "metadata-log", "schemas", "current-schema-id", "last-column-id",
            "partition-specs", "default-spec-id", "last-partition-id", "sort-orders",
            "default-sort-order-id", "statistics", "partition-statistics", "properties",
            "next-row-id"}
_KEPT_BY_ID = {"snapshots": "snapshot-id", "schemas": "schema-id", "partition-specs": "spec-id",
               "sort-orders": "order-id"}


def forward_only(base: TableMetadata, current: str, location: str, registered: TableMetadata,
                 ts: int, ident: tuple[str, ...]) -> TableMetadata:
    """`registered` as the next state of the table `base` (at `current`), stamped at `ts`; or
    BadRequest if it is not one. Register with overwrite may only move a table forward, as a
    commit would: the same table (UUID and folder), metadata whose log holds the current file,
    every snapshot, schema, spec, sort order, statistics file, snapshot-log and metadata-log
    entry the table has kept as it is. What it adds is stamped `ts` (snapshots, snapshot-log
    entries, and one for main if it moved without one): history at or below a read timestamp
    already handed out stays as readers saw it."""
    def refuse(why: str) -> BadRequest:
        return BadRequest(f"register with overwrite would {why} of {_dotted(ident)}; history "
                          "that reads may already have seen cannot change: register under a "
                          "new name, or commit the change instead")

    if location == current:
        raise BadRequest(f"{_dotted(ident)} is already at {location!r}")
    old, new = json.loads(metadata.to_json(base)), json.loads(metadata.to_json(registered))
    for key in (set(old) | set(new)) - _MOVABLE:
        if old.get(key) != new.get(key):
            raise refuse(f"change `{key}`")
    for key, id_key in _KEPT_BY_ID.items():
        theirs = {item.get(id_key): item for item in new.get(key) or []}
        if any(theirs.get(item.get(id_key)) != item for item in old.get(key) or []):
            raise refuse(f"change or remove {key}")
    added = {s["snapshot-id"] for s in new.get("snapshots") or []} - \
        {s["snapshot-id"] for s in old.get("snapshots") or []}
    for key in ("statistics", "partition-statistics"):
        kept = [f for f in new.get(key) or [] if f.get("snapshot-id") not in added]
        if kept != (old.get(key) or []):
            raise refuse(f"change {key} of existing snapshots")
    if new.get("snapshot-log", [])[:len(old.get("snapshot-log", []))] != \
            old.get("snapshot-log", []):
        raise refuse("change the snapshot log")
    files = [e["metadata-file"] for e in new.get("metadata-log") or []]
    if files[:len(old.get("metadata-log") or [])] != \
            [e["metadata-file"] for e in old.get("metadata-log") or []] or current not in files:
        raise refuse("move to metadata whose log does not continue the current one")
    metadata.check_snapshots([AddSnapshotUpdate(snapshot=s) for s in registered.snapshots
                              if s.snapshot_id in added], boundary.resolve(base.location))
    # The metadata log as a commit leaves it: the table's, then the current file at its W.
    log_entries = [*base.metadata_log, MetadataLogEntry.model_validate(
        {"metadata-file": current, "timestamp-ms": base.last_updated_ms})]
    snapshots = [s.model_copy(update={"timestamp_ms": ts}) if s.snapshot_id in added else s
                 for s in registered.snapshots]
    moved = registered.model_copy(update={"snapshots": snapshots, "metadata_log": log_entries})
    stamped = metadata.stamp(moved, base, ts)
    head = stamped.snapshot_log[-1].snapshot_id if stamped.snapshot_log else None
    if stamped.current_snapshot_id is not None and head != stamped.current_snapshot_id:
        # Main moved (a rollback) with no entry of its own: the one a commit would have made.
        entry = SnapshotLogEntry.model_validate(
            {"snapshot-id": stamped.current_snapshot_id, "timestamp-ms": ts})
        stamped = stamped.model_copy(update={"snapshot_log": [*stamped.snapshot_log, entry]})
    return stamped


def _view_name(request: dict[str, Any]) -> str:
    """A view request's `name`: a string, checked as every name is (a number is no name)."""
    given = request.get("name")
    if not isinstance(given, str):
        raise BadRequest("a view request's `name` must be a string")
    return check_name(given, "view name")


def _dotted(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts)
