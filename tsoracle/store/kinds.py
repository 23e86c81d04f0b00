"""The backends tsoracle can use, by URL scheme: the one place a new backend is registered.

A backend is a module holding a `Backend` subclass named `BACKEND` (with its dialect), plus one
`BackendKind` below: the URL prefixes it answers to and the function that parses its URLs. The
module is imported only when a backend of that kind is opened, so an unused driver never loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tsoracle.store.url import BackendURL, parse_postgres, parse_sqlite

if TYPE_CHECKING:
    from tsoracle.store.backend import Backend


@dataclass(frozen=True)
class BackendKind:
    name: str  # BackendURL.kind
    schemes: tuple[str, ...]  # URL prefixes, lower case
    parse: Callable[[str], BackendURL]
    module: str  # holds BACKEND, the Backend subclass
    key_value: bool = False  # also takes a scheme-less `key=value` DSN (libpq's form)


KINDS = (
    BackendKind("postgresql", ("postgresql://", "postgres://", "cockroachdb://"), parse_postgres,
                "tsoracle.store.postgres", key_value=True),
    BackendKind("sqlite", ("sqlite:",), parse_sqlite, "tsoracle.store.sqlite"),
)


def kind_of(text: str) -> BackendKind | None:
    """The kind a URL or DSN belongs to, by its scheme (None: no registered kind takes it)."""
    lowered = text.strip().lower()
    for kind in KINDS:
        if lowered.startswith(kind.schemes):
            return kind
    if "=" in lowered and "://" not in lowered:
        return next((k for k in KINDS if k.key_value), None)
    return None


def schemes() -> list[str]:
    return [s for kind in KINDS for s in kind.schemes]


def backend_class(url: BackendURL) -> type[Backend]:
    kind = next(k for k in KINDS if k.name == url.kind)
    cls: type[Backend] = importlib.import_module(kind.module).BACKEND
    return cls
