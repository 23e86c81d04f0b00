"""The REST spec's error model: each error is an HTTP status and the exception type engines
map it to (Iceberg's Java client picks the exception by `type` within a status)."""

from __future__ import annotations

from typing import Any


class CatalogError(Exception):
    status = 500
    type = "RuntimeException"
    # The same request would get this answer again (an Idempotency-Key replays it: its 4xx).
    final = True

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


class BadRequest(CatalogError):
    status, type = 400, "BadRequestException"


class InvalidArgument(CatalogError):
    """A request the spec allows but whose content breaks the format's rules (Iceberg's Java
    client raises IllegalArgumentException for it, by this type)."""

    status, type = 400, "IllegalArgumentException"


class NotAuthorized(CatalogError):
    status, type = 401, "NotAuthorizedException"


class NoSuchNamespace(CatalogError):
    status, type = 404, "NoSuchNamespaceException"


class NoSuchTable(CatalogError):
    status, type = 404, "NoSuchTableException"


class NoSuchView(CatalogError):
    status, type = 404, "NoSuchViewException"


class NotFound(CatalogError):
    status, type = 404, "NotFoundException"


class Unsupported(CatalogError):
    status, type = 406, "UnsupportedOperationException"


class AlreadyExists(CatalogError):
    status, type = 409, "AlreadyExistsException"


class NamespaceNotEmpty(CatalogError):
    status, type = 409, "NamespaceNotEmptyException"


class CommitFailed(CatalogError):
    """Nothing was committed; the client may refresh and try again."""

    status, type = 409, "CommitFailedException"


class Contended(CommitFailed):
    """Nothing was committed because of concurrent changes: the same request may land later."""

    final = False


class PayloadTooLarge(CatalogError):
    status, type = 413, "BadRequestException"


class Unavailable(CatalogError):
    """Nothing was committed; the same request may be sent again later."""

    status, type = 503, "ServiceUnavailableException"


class CommitStateUnknown(CatalogError):
    """The commit may or may not have landed: a client must not apply its changes again."""

    status, type = 504, "CommitStateUnknownException"


# Messages begin as Iceberg's own catalogs word them (engines and the REST Compatibility Kit
# match on these beginnings); what to do follows.
def dotted(parts: object) -> str:
    return ".".join(str(p) for p in parts) if isinstance(parts, tuple | list) else str(parts)


def no_namespace(ns: tuple[str, ...]) -> NoSuchNamespace:
    return NoSuchNamespace(f"Namespace does not exist: {dotted(ns)}")


def no_table(ident: tuple[str, ...]) -> NoSuchTable:
    return NoSuchTable(f"Table does not exist: {dotted(ident)}")


def no_view(ident: tuple[str, ...]) -> NoSuchView:
    return NoSuchView(f"View does not exist: {dotted(ident)}")


def namespace_taken(ns: tuple[str, ...]) -> AlreadyExists:
    return AlreadyExists(f"Namespace already exists: {dotted(ns)}")


def table_taken(ident: tuple[str, ...]) -> AlreadyExists:
    return AlreadyExists(f"Table already exists: {dotted(ident)}")


def view_taken(ident: tuple[str, ...]) -> AlreadyExists:
    return AlreadyExists(f"View already exists: {dotted(ident)}")


def name_taken(ident: tuple[str, ...], found: str, wanted: str) -> AlreadyExists:
    """Creating a `wanted` ("table"/"view") where a `found` one has the name."""
    if found == wanted:
        return table_taken(ident) if found == "table" else view_taken(ident)
    return AlreadyExists(f"{found.capitalize()} with same name already exists: {dotted(ident)}")


def rename_taken(source: tuple[str, ...], dest: tuple[str, ...], found: str) -> AlreadyExists:
    return AlreadyExists(f"Cannot rename {dotted(source)} to {dotted(dest)}. "
                         f"{found.capitalize()} already exists")


def not_empty(ns: tuple[str, ...]) -> NamespaceNotEmpty:
    return NamespaceNotEmpty(f"Namespace {dotted(ns)} is not empty: drop its tables, views "
                             "and namespaces first")


def location_taken(location: str, ident: tuple[str, ...], user: tuple[str, ...]
                   ) -> BadRequest:
    return BadRequest(f"location {location!r} for {dotted(ident)} overlaps the folder of "
                      f"{dotted(user)}: two tables or views may not share files; give another "
                      "location, or leave it out")
