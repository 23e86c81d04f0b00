"""The catalog's operations, in the REST spec's terms, over the rows (state.py), the metadata
files (metadata.py) and the oracle's order (ordering.py). HTTP lives in app.py."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import MetastoreCatalog, delete_data_files, delete_files
from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AssertCreate, TableRequirement, TableUpdate
from pyiceberg.view.metadata import ViewMetadata

from tsoracle.catalog import metadata, state, views
from tsoracle.catalog.errors import (
    BadRequest,
    CatalogError,
    name_taken,
    namespace_taken,
    no_namespace,
    no_table,
    no_view,
    not_empty,
    rename_taken,
)
from tsoracle.catalog.ordering import Ordering, Plan
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


_RESERVED = ("\x00", state.SEP, "\x1e")  # NUL, and the separators of levels and encoded slashes


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:  # a lone surrogate, which no database column can hold
        return False


def check_namespace(ns: Sequence[str]) -> Namespace:
    if not ns or any(not level or any(c in level for c in _RESERVED) or not _encodable(level)
                     for level in ns):
        raise BadRequest(f"invalid namespace {list(ns)!r}: give one or more non-empty levels")
    return tuple(ns)


def check_name(name: str) -> str:
    if not name or any(c in name for c in _RESERVED) or not _encodable(name):
        raise BadRequest(f"invalid table name {name!r}: give a non-empty name")
    return name


class Catalog:
    def __init__(self, backend: Backend, ordering: Ordering,
                 warehouse: metadata.Warehouse) -> None:
        self.backend = backend
        self.ordering = ordering
        self.warehouse = warehouse

    # --- namespaces ---------------------------------------------------------------------------

    async def list_namespaces(self, parent: Namespace | None) -> list[Namespace]:
        known = await state.namespaces(self.backend)
        if parent and parent not in known:
            raise no_namespace(parent)
        depth = len(parent) if parent else 0
        return sorted(ns for ns in known
                      if len(ns) == depth + 1 and ns[:depth] == (parent or ()))

    async def create_namespace(self, ns: Namespace, properties: dict[str, str]) -> None:
        if not await state.create_namespace(self.backend, ns, properties):
            raise namespace_taken(ns)

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

        await self.backend.transaction(body)

    async def update_namespace(self, ns: Namespace, removals: Sequence[str],
                               updates: dict[str, str]) -> dict[str, list[str]]:
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
            return {"removed": removed, "updated": list(updates), "missing": missing}

        return await self.backend.transaction(body)

    # --- tables -------------------------------------------------------------------------------

    async def list_tables(self, ns: Namespace) -> list[str]:
        await self.load_namespace(ns)
        return await state.objects(self.backend, ns, TABLE)

    async def load_table(self, ns: Namespace, name: str) -> Loaded:
        found = await self._pointer(ns, name)
        return Loaded(found.metadata_location, await self._read(found.metadata_location))

    async def table_exists(self, ns: Namespace, name: str) -> bool:
        found = await state.pointer(self.backend, ns, name)
        return found is not None and found.kind == TABLE

    async def create_table(self, ns: Namespace, request: CreateTableRequest) -> Loaded:
        name = check_name(request.name)
        props = await self.load_namespace(ns)
        location = (self.warehouse.inside(request.location) if request.location
                    else self.warehouse.table_location(ns, name, props))

        self.warehouse.check_paths(location, request.properties)

        def fresh(ts: int) -> TableMetadata:
            return metadata.create(request.table_schema, request.partition_spec,
                                   request.write_order, location, request.properties, ts)

        if request.stage_create:
            await self._free(ns, name, TABLE)
            return Loaded(None, fresh(await self.ordering.closed()))

        async def build(ts: int, attempt: int) -> Plan[Loaded]:
            await self._free(ns, name, TABLE)
            new = fresh(ts)
            target = metadata.next_location(new, None)
            await asyncio.to_thread(self.warehouse.write, new, target)
            return Plan(Loaded(target, new), swaps=[state.Swap(ns, name, None, target)],
                        written=[target])

        return await self.ordering.commit(build)

    async def commit(self, changes: Sequence[Change]) -> list[Loaded]:
        """Several tables' changes at one timestamp, all or nothing."""
        names = [(c.namespace, c.name) for c in changes]
        if len(set(names)) != len(names):
            raise BadRequest("a transaction names the same table twice; merge its changes")

        async def build(ts: int, attempt: int) -> Plan[list[Loaded]]:
            plan: Plan[list[Loaded]] = Plan([])
            try:
                for change in changes:
                    loaded, swap = await self._apply(change, ts, attempt)
                    plan.written.append(swap.new)
                    plan.swaps.append(swap)
                    plan.result.append(loaded)
            except BaseException:
                await self.discard(plan.written)
                raise
            return plan

        return await self.ordering.commit(build)

    async def _apply(self, change: Change, ts: int, attempt: int) -> tuple[Loaded, state.Swap]:
        ns, name = change.namespace, check_name(change.name)
        found = await state.pointer(self.backend, ns, name)
        creating = any(isinstance(r, AssertCreate) for r in change.requirements)
        if found is None and not creating:
            await self.load_namespace(ns)
            raise no_table((*ns, name))
        if found is not None and found.kind != TABLE:
            raise name_taken((*ns, name), found.kind, TABLE)
        if found is None:
            await self.load_namespace(ns)
        base_location = found.metadata_location if found else None
        base = await self._read(base_location) if base_location else None
        metadata.check(change.requirements, base)
        new = metadata.apply(base, base_location, change.updates, ts, self.warehouse)
        target = metadata.next_location(new, base_location)
        await asyncio.to_thread(self.warehouse.write, new, target)
        return Loaded(target, new), state.Swap(ns, name, base_location, target)

    async def drop_table(self, ns: Namespace, name: str, purge: bool) -> None:
        async def build(ts: int, attempt: int) -> Plan[TableMetadata]:
            found = await self._pointer(ns, name)
            return Plan(await self._read(found.metadata_location), drops=[found])

        dropped = await self.ordering.commit(build)
        if purge:
            asyncio.get_running_loop().run_in_executor(None, self._purge, dropped)

    def _purge(self, dropped: TableMetadata) -> None:
        io = self.warehouse.io(dropped.location)
        try:
            manifests = [m for s in dropped.snapshots for m in s.manifests(io)]
            delete_data_files(io, manifests)
            delete_files(io, {m.manifest_path for m in manifests}, "manifest")
            delete_files(io, {s.manifest_list for s in dropped.snapshots if s.manifest_list},
                         "manifest list")
            delete_files(io, {e.metadata_file for e in dropped.metadata_log}, "metadata")
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
            registered = await self._read(location)
        except CatalogError:
            raise
        except Exception:
            raise BadRequest(f"no readable table metadata at {request.metadata_location!r}") \
                from None
        self.warehouse.check_paths(registered.location, registered.properties)

        async def build(ts: int, attempt: int) -> Plan[Loaded]:
            await self.load_namespace(ns)
            found = await state.pointer(self.backend, ns, name)
            if found is not None and (found.kind != TABLE or not request.overwrite):
                raise name_taken((*ns, name), found.kind, TABLE)
            expected = found.metadata_location if found else None
            return Plan(Loaded(location, registered),
                        swaps=[state.Swap(ns, name, expected, location)])

        return await self.ordering.commit(build)

    # --- views --------------------------------------------------------------------------------

    async def list_views(self, ns: Namespace) -> list[str]:
        await self.load_namespace(ns)
        return await state.objects(self.backend, ns, VIEW)

    async def load_view(self, ns: Namespace, name: str) -> tuple[str, ViewMetadata]:
        found = await self._view(ns, name)
        return found.metadata_location, await self._read_view(found.metadata_location)

    async def view_exists(self, ns: Namespace, name: str) -> bool:
        found = await state.pointer(self.backend, ns, name)
        return found is not None and found.kind == VIEW

    async def create_view(self, ns: Namespace, request: dict[str, Any]
                          ) -> tuple[str, ViewMetadata]:
        name = check_name(str(request.get("name") or ""))
        props = await self.load_namespace(ns)
        given = request.get("location")
        location = (self.warehouse.inside(str(given)) if given
                    else self.warehouse.table_location(ns, name, props))

        async def build(ts: int, attempt: int) -> Plan[tuple[str, ViewMetadata]]:
            await self._free(ns, name, VIEW)
            new = views.create(request, location, ts)
            self.warehouse.check_paths(new.location, new.properties)
            target = self._view_file(new, 0)
            await self._write_view(new, target)
            return Plan((target, new), swaps=[state.Swap(ns, name, None, target, VIEW)],
                        written=[target])

        return await self.ordering.commit(build)

    async def replace_view(self, ns: Namespace, name: str, requirements: list[dict[str, Any]],
                           updates: list[dict[str, Any]]) -> tuple[str, ViewMetadata]:
        async def build(ts: int, attempt: int) -> Plan[tuple[str, ViewMetadata]]:
            found = await self._view(ns, name)
            base = await self._read_view(found.metadata_location)
            views.check(requirements, base)
            new = views.apply(base, updates, ts)
            self.warehouse.check_paths(new.location, new.properties)
            version = MetastoreCatalog._parse_metadata_version(found.metadata_location) + 1
            target = self._view_file(new, version)
            await self._write_view(new, target)
            return Plan((target, new), written=[target], swaps=[
                state.Swap(ns, name, found.metadata_location, target, VIEW)])

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


def _dotted(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts)
