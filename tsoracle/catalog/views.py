"""View metadata: pyiceberg has the model (`ViewMetadata`) but no update logic, so the view
updates of the REST spec are applied here, with the rules of Iceberg's own view builder (ids
reused for equal schemas and versions, one query per dialect, no dialect dropped on replace
unless the view allows it). Versions made by a commit carry its timestamp W."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.schema import Schema
from pyiceberg.view.metadata import ViewHistoryEntry, ViewMetadata, ViewVersion

from tsoracle.catalog.errors import BadRequest, CommitFailed, InvalidArgument

HISTORY = "version.history.num-entries"
DROP_DIALECT = "replace.drop-dialect.allowed"


def parse(data: bytes) -> ViewMetadata:
    return ViewMetadata.model_validate_json(data)


def to_json(metadata: ViewMetadata) -> str:
    return metadata.model_dump_json()


def check(requirements: Sequence[dict[str, Any]], base: ViewMetadata | None) -> None:
    for r in requirements:
        if r.get("type") != "assert-view-uuid":
            raise BadRequest(f"unknown view requirement {r.get('type')!r}")
        if base is None or r.get("uuid") != base.view_uuid:
            found = base.view_uuid if base is not None else None
            raise CommitFailed(f"Requirement failed: view UUID does not match: expected "
                               f"{r.get('uuid')} != {found}")


class _Builder:
    def __init__(self, base: ViewMetadata | None, ts: int) -> None:
        self.ts = ts
        self.uuid = base.view_uuid if base else None
        self.location = base.location if base else None
        self.schemas: list[Schema] = list(base.schemas) if base else []
        self.versions: list[ViewVersion] = list(base.versions) if base else []
        self.log: list[ViewHistoryEntry] = list(base.version_log) if base else []
        self.current = base.current_version_id if base else None
        self.properties: dict[str, str] = dict(base.properties) if base else {}
        self.previous = base.current_version_id if base else None
        self.last_schema: int | None = None
        self.last_version: int | None = None
        self.new_versions: set[int] = set()

    def add_schema(self, schema: Schema) -> None:
        for known in self.schemas:
            if known.as_struct() == schema.as_struct() and \
                    known.identifier_field_ids == schema.identifier_field_ids:
                self.last_schema = known.schema_id
                return
        new_id = max((s.schema_id for s in self.schemas), default=-1) + 1
        self.schemas.append(schema.model_copy(update={"schema_id": new_id}))
        self.last_schema = new_id

    def add_version(self, version: ViewVersion) -> None:
        schema_id = version.schema_id
        if schema_id == -1:
            if self.last_schema is None:
                raise InvalidArgument("Cannot set last added schema: no schema has been added")
            schema_id = self.last_schema
        if schema_id not in {s.schema_id for s in self.schemas}:
            raise InvalidArgument(f"Cannot add version with unknown schema: {schema_id}")
        dialects = [r.root.dialect.lower() for r in version.representations]
        for d in dialects:
            if dialects.count(d) > 1:
                raise InvalidArgument(f"Invalid view version: Cannot add multiple queries for "
                                 f"dialect {d}")
        version = version.model_copy(update={"schema_id": schema_id, "timestamp_ms": self.ts})
        for known in self.versions:
            if _same_version(known, version):
                self.last_version = known.version_id
                return
        new_id = max((v.version_id for v in self.versions), default=0) + 1
        self.versions.append(version.model_copy(update={"version_id": new_id}))
        self.new_versions.add(new_id)
        self.last_version = new_id

    def set_current(self, version_id: int) -> None:
        if version_id == -1:
            if self.last_version is None:
                raise InvalidArgument("Cannot set last version: no version has been added")
            version_id = self.last_version
        if version_id not in {v.version_id for v in self.versions}:
            raise InvalidArgument(f"Cannot set current version to unknown version: {version_id}")
        if version_id == self.current:
            return
        self.current = version_id
        self.log.append(ViewHistoryEntry.model_validate(
            {"timestamp-ms": self.ts, "version-id": version_id}))

    def apply(self, update: dict[str, Any]) -> None:
        action = update.get("action")
        if action == "assign-uuid":
            given = str(update.get("uuid"))
            if self.uuid is not None and self.uuid != given:
                raise InvalidArgument("Cannot reassign view UUID")
            self.uuid = given
        elif action == "upgrade-format-version":
            if update.get("format-version") != 1:
                raise BadRequest(f"Unsupported view format version: "
                                 f"{update.get('format-version')}")
        elif action == "add-schema":
            self.add_schema(Schema.model_validate(update.get("schema")))
        elif action == "set-location":
            self.location = str(update.get("location"))
        elif action == "set-properties":
            self.properties.update(update.get("updates") or {})
        elif action == "remove-properties":
            for key in update.get("removals") or []:
                self.properties.pop(key, None)
        elif action == "add-view-version":
            self.add_version(ViewVersion.model_validate(update.get("view-version")))
        elif action == "set-current-view-version":
            self.set_current(int(update.get("view-version-id", -1)))
        else:
            raise BadRequest(f"unknown view update {action!r}")

    def build(self) -> ViewMetadata:
        if self.current is None or self.location is None:
            raise BadRequest("a view needs a location and a current version")
        self._check_dialects()
        keep = max(1, int(self.properties.get(HISTORY, "10")))
        # Old versions go once there are more than `keep`, never the current one, and never
        # one this commit added.
        ordered = sorted(self.versions, key=lambda v: v.version_id)
        while len(ordered) > keep:
            victim = next((v for v in ordered if v.version_id != self.current
                           and v.version_id not in self.new_versions), None)
            if victim is None:
                break
            ordered.remove(victim)
        kept = {v.version_id for v in ordered}
        log = [e for e in self.log if e.version_id in kept]
        return ViewMetadata.model_validate({
            "view-uuid": self.uuid or str(uuid.uuid4()), "format-version": 1,
            "location": self.location,
            "schemas": [json.loads(s.model_dump_json()) for s in self.schemas],
            "current-version-id": self.current,
            "versions": [json.loads(v.model_dump_json()) for v in ordered],
            "version-log": [json.loads(e.model_dump_json()) for e in log],
            "properties": self.properties})

    def _check_dialects(self) -> None:
        if self.previous is None or self.current == self.previous or \
                self.properties.get(DROP_DIALECT, "false").lower() == "true":
            return
        before = _dialects(next(v for v in self.versions if v.version_id == self.previous))
        after = _dialects(next(v for v in self.versions if v.version_id == self.current))
        if not before <= after:
            raise InvalidArgument(f"Cannot replace view due to loss of view dialects "
                             f"({DROP_DIALECT}=false):\nPrevious dialects: {sorted(before)}\n"
                             f"New dialects: {sorted(after)}")


def _dialects(version: ViewVersion) -> set[str]:
    return {r.root.dialect.lower() for r in version.representations}


def _same_version(a: ViewVersion, b: ViewVersion) -> bool:
    """Equal apart from id and timestamp (Iceberg reuses such a version's id)."""
    def key(v: ViewVersion) -> Any:
        return v.model_copy(update={"version_id": 0, "timestamp_ms": 0})
    return bool(key(a) == key(b))


def create(request: dict[str, Any], location: str, ts: int) -> ViewMetadata:
    """A new view from the spec's create-view request."""
    builder = _Builder(None, ts)
    builder.uuid = str(uuid.uuid4())
    builder.location = location
    try:
        builder.add_schema(Schema.model_validate(request.get("schema")))
        version = dict(request.get("view-version") or {})
        if version.get("schema-id") is not None and builder.last_schema is not None:
            version["schema-id"] = builder.last_schema
        builder.add_version(ViewVersion.model_validate(version))
        builder.set_current(-1)
        builder.properties.update({str(k): str(v)
                                   for k, v in (request.get("properties") or {}).items()})
        return builder.build()
    except ValidationError as exc:
        raise BadRequest(f"invalid view: {_first(exc)}") from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError,
            IcebergValidationError) as exc:
        raise BadRequest(f"invalid view: {exc}") from None


def apply(base: ViewMetadata, updates: Sequence[dict[str, Any]], ts: int) -> ViewMetadata:
    builder = _Builder(base, ts)
    try:
        for update in updates:
            builder.apply(update)
        return builder.build()
    except ValidationError as exc:
        raise BadRequest(f"invalid view update: {_first(exc)}") from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError,
            IcebergValidationError) as exc:
        raise BadRequest(f"invalid view update: {exc}") from None


def _first(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}"
