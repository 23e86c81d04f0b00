"""Backend URLs: parse, validate, and render without secrets."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from tsoracle.errors import ConfigError

DEFAULT_SCHEMA = "tsoracle"
DEFAULT_URL = "sqlite:///tsoracle.db"
_SECRET_KEYS = {"password", "sslpassword", "passfile"}
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend location. `dsn` may hold a password: never log it, use `safe`."""

    kind: str  # "postgresql" or "sqlite"
    dsn: str = field(repr=False)  # libpq conninfo URL for PostgreSQL, file path for SQLite
    schema: str
    safe: str  # the URL with the password masked, fit for messages

    password: str = field(default="", repr=False)

    @property
    def is_sqlite(self) -> bool:
        return self.kind == "sqlite"

    def scrub(self, text: str) -> str:
        """Mask the password wherever a driver message might echo it."""
        return text.replace(self.password, "***") if self.password else text


def parse_url(url: str) -> BackendURL:
    """Parse `postgresql://…`, `postgres://…` or `sqlite:///path`; `?schema=` picks the schema."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("backend URL is empty; pass e.g. sqlite:///tsoracle.db or postgresql://…")
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:
        raise ConfigError(f"backend URL is malformed ({exc}); check host and port") from None
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    schema = query.pop("schema", DEFAULT_SCHEMA)
    if not _SCHEMA_RE.match(schema):
        raise ConfigError(f"schema {schema!r} is not a plain SQL identifier (letters, digits, _)")
    if scheme in ("postgresql", "postgres", "cockroachdb"):
        if not parts.hostname and "host" not in query:
            raise ConfigError("PostgreSQL URL has no host; expected postgresql://user@host:port/db")
        rest = urlencode(query)
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, rest, ""))
        secret = parts.password or query.get("password", "")
        return BackendURL("postgresql", dsn, schema, _mask(parts, port, query), secret)
    if scheme == "sqlite":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError("SQLite URL must look like sqlite:///relative/path or sqlite:////abs")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigError("SQLite URL has no file path; expected sqlite:///tsoracle.db")
        return BackendURL("sqlite", os.path.abspath(path), schema, f"sqlite:///{path}")
    shown = scheme or "(none)"
    raise ConfigError(
        f"unsupported URL scheme {shown!r}; use postgresql://, postgres:// or sqlite:///"
    )


def _mask(parts: SplitResult, port: int | None, query: dict[str, str]) -> str:
    user = parts.username or ""
    cred = f"{user}:***@" if parts.password else (f"{user}@" if user else "")
    host = parts.hostname or ""
    hostport = f"{host}:{port}" if port else host
    shown = {k: ("***" if k.lower() in _SECRET_KEYS else v) for k, v in query.items()}
    q = f"?{urlencode(shown)}" if shown else ""
    return f"postgresql://{cred}{hostport}{parts.path}{q}"
