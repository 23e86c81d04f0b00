"""Backend URLs: parse, validate, and render without secrets.

PostgreSQL locations are parsed by libpq's own rules (through psycopg), in either form it
accepts: `postgresql://user:pass@host:port/db?…` (percent-encoded) or `host=… user=… …`. The
extra parameter `schema` picks tsoracle's schema. Nothing a parser rejects is ever echoed: it may
be part of a password.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from tsoracle.errors import ConfigError

DEFAULT_SCHEMA = "tsoracle"
DEFAULT_URL = "sqlite:///tsoracle.db"
_SECRET_KEYS = {"password", "sslpassword", "passfile", "sslkey", "sslcert"}
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# One `key = value` of a libpq key=value DSN: a value is quoted ('…', with \' and \\) or runs
# to the next blank (a backslash escapes the next character).
_DSN_ITEM_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)*)")
_MALFORMED = (
    "the backend URL is malformed; if the user name or password contains / ? # @ % or a space, "
    "percent-encode it (/ as %2F, ? as %3F, # as %23, @ as %40, % as %25) or use the key=value "
    "form: host=… port=… dbname=… user=… password=…"
)


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend location. `dsn` may hold a password: never log it, use `safe`."""

    kind: str  # "postgresql" or "sqlite"
    dsn: str = field(repr=False)  # libpq key=value conninfo for PostgreSQL, a path for SQLite
    schema: str
    safe: str  # the location with the password masked, fit for messages

    password: str = field(default="", repr=False)
    host: str = ""
    # Every secret the location spelled out (a URL may carry a password twice).
    secrets: tuple[str, ...] = field(default=(), repr=False)
    user: str = ""  # the role the URL names (PostgreSQL); empty: libpq's default

    def scrub(self, text: str) -> str:
        """Mask the password wherever a driver message might echo it (in any letter case)."""
        for secret in {self.password, *self.secrets}:
            text = _replace_all(text, secret_forms(secret), "***")
        return text


def parse_url(url: str) -> BackendURL:
    """Parse a PostgreSQL URL or key=value DSN, or `sqlite:///path`; `schema` picks the schema."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("backend URL is empty; pass e.g. sqlite:///tsoracle.db or postgresql://…")
    from tsoracle.store.kinds import kind_of, schemes  # the registry imports this module

    text = url.strip()
    kind = kind_of(text)
    if kind is not None:
        return kind.parse(text)
    scheme = text.split("://", 1)[0] if "://" in text else "(none)"
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,20}", scheme):
        scheme = "(unrecognised)"  # never echo what may be a secret
    raise ConfigError(
        f"unsupported URL scheme {scheme!r}; use {', '.join(schemes())} or a key=value DSN "
        "(host=… dbname=…)"
    )


def with_schema(url: str, schema: str, *, accept: Callable[[str], bool] | None = None,
                refusal: str = "") -> str:
    """`url` addressing `schema`. A URL that names a schema already keeps it if `accept(named)`
    says so (by default: it is `schema`); otherwise ConfigError, with `refusal` formatted with
    {named} (the schema the URL names), which tells the user what to change."""
    if has_schema(url):
        named = parse_url(url).schema
        if (accept or (lambda n: n == schema))(named):
            return url
        raise ConfigError(refusal.format(named=named) or
                          f"the URL names schema {named!r}, not {schema!r}")
    return url_with_schema(url, schema)


def url_with_schema(url: str, schema: str) -> str:
    """`url` with `schema` added, unless it already names one (that one wins)."""
    if has_schema(url):
        return url
    text = url.strip()
    if _is_url(text):
        base, hash_, fragment = text.partition("#")  # a fragment ends the URL: add before it
        return base + ("&" if "?" in base else "?") + f"schema={schema}" + hash_ + fragment
    return f"{text} schema={schema}"


def has_schema(url: str) -> bool:
    text = url.strip()
    if _is_url(text):
        return any(k == "schema" for k, _ in _query_items(_query(text)))
    try:
        return "schema" in dict(_dsn_items(text))
    except ConfigError:
        return False


def _dsn_items(text: str) -> list[tuple[str, str]]:
    """The raw (still quoted) items of a key=value DSN, by libpq's grammar."""
    items, pos = [], 0
    while pos < len(text.rstrip()):
        found = _DSN_ITEM_RE.match(text, pos)
        if not found or found.end() == pos:
            raise ConfigError(_MALFORMED)
        items.append((found.group(1), found.group(2)))
        pos = found.end()
    return items


def _query_items(query: str) -> list[tuple[str, str]]:
    """`k=v` pairs of a URL query, undecoded: libpq reads `+` literally, so no form decoding."""
    return [(part.partition("=")[0], part.partition("=")[2]) for part in query.split("&") if part]


def secret_forms(secret: str) -> list[str]:
    """A secret as it may appear in text: raw and percent-encoded."""
    if len(secret) < 3:  # too short to mask without garbling ordinary words
        return []
    return sorted({secret, quote(secret, safe=""), quote(secret)}, key=len, reverse=True)


def _replace_all(text: str, needles: list[str], mask: str) -> str:
    for needle in needles:
        text = re.sub(re.escape(needle), mask, text, flags=re.IGNORECASE)
    return text


def _is_url(text: str) -> bool:
    """A URL (sqlite:, postgresql:// …) rather than a libpq key=value DSN."""
    from tsoracle.store.kinds import schemes

    return text.lower().startswith(tuple(schemes()))


def _query(text: str) -> str:
    rest = text.split("://", 1)[1] if "://" in text else text
    rest = rest.split("#", 1)[0]
    return rest.split("?", 1)[1] if "?" in rest else ""


def parse_sqlite(text: str) -> BackendURL:
    try:
        parts = urlsplit(text)
    except ValueError:
        raise ConfigError("SQLite URL is malformed; expected sqlite:///path/to/file.db") from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    schema = _check_schema(query.pop("schema", DEFAULT_SCHEMA))
    if parts.netloc not in ("", "localhost"):
        raise ConfigError("SQLite URL must look like sqlite:///relative/path or sqlite:////abs")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError("SQLite URL has no file path; expected sqlite:///tsoracle.db")
    return BackendURL("sqlite", os.path.abspath(path), schema, f"sqlite:///{path}")


def parse_postgres(text: str) -> BackendURL:
    from psycopg import conninfo  # the driver's parser: libpq's own rules

    if "://" in text:
        scheme, rest = text.split("://", 1)
        # An authority ends at the first / ? #; an @ after that means a character of the
        # password was not encoded and the real host is somewhere in what looks like a path.
        cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
                  default=len(rest))
        path = rest[cut:].split("?", 1)[0]
        # One @ ends the user info; another one, or one in the path, means a character of the
        # password was not encoded (the query may hold a legitimate @, say user=app@server).
        if rest[:cut].count("@") > 1 or "@" in path or "@" in rest.partition("#")[2]:
            raise ConfigError(_MALFORMED)
        base, _, query = rest.split("#", 1)[0].partition("?")
        pairs = _query_items(query)
        schema = _check_schema(unquote(next((v for k, v in pairs if k == "schema"),
                                            DEFAULT_SCHEMA)))
        rest_query = "&".join(f"{k}={v}" for k, v in pairs if k != "schema")
        dsn_text = f"postgresql://{base}" + (f"?{rest_query}" if rest_query else "")
    else:
        items = _dsn_items(text)
        schema = _check_schema(next((v for k, v in items if k == "schema"), DEFAULT_SCHEMA))
        dsn_text = " ".join(f"{k}={v}" for k, v in items if k != "schema")
    try:
        params = {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn_text).items()
                  if v is not None}
    except Exception:  # the parser's message may quote the password
        raise ConfigError(_MALFORMED) from None
    host = params.get("host") or params.get("hostaddr") or ""
    if not host:
        raise ConfigError(
            "the PostgreSQL location has no host; expected postgresql://user@host:port/db "
            "or host=… dbname=…"
        )
    for port in params.get("port", "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(_MALFORMED.replace("malformed;", "malformed (a port is not a "
                                                 "number from 1 to 65535);"))
    password = params.get("password", "")
    secrets = {password, params.get("sslpassword", "")}
    if "://" in dsn_text:
        try:
            secrets.add(unquote(urlsplit(dsn_text).password or ""))
        except ValueError:
            pass
    return BackendURL("postgresql", conninfo.make_conninfo(**params), schema, _safe(params),
                      password, host, tuple(sorted(s for s in secrets if s)),
                      user=params.get("user", ""))


def _safe(params: dict[str, str]) -> str:
    user = params.get("user", "")
    cred = f"{quote(user, safe='')}{':***' if params.get('password') else ''}@" if user else (
        ":***@" if params.get("password") else "")
    host = params.get("host") or params.get("hostaddr", "")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    db = params.get("dbname", "")
    shown = {k: ("***" if k.lower() in _SECRET_KEYS else v) for k, v in params.items()
             if k not in ("user", "password", "host", "hostaddr", "port", "dbname")}
    q = f"?{urlencode(shown)}" if shown else ""
    return f"postgresql://{cred}{where}/{quote(db, safe='')}{q}"


def _check_schema(schema: str) -> str:
    if not _SCHEMA_RE.match(schema):
        raise ConfigError(
            "the schema (?schema=) must be a plain SQL identifier: letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    return schema
