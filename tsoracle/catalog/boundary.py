"""The catalog's trust boundary: what a client may name, how large it may be, and where files
may go. Every check here is a pure function that runs before any database or warehouse work,
and refuses with a 400 that names the rule (docs/iceberg.md, "Trust boundary").

Clients are untrusted: an engine sends what its user's code asks for. So the catalog acts only
on the properties it knows, never on one that names code to load, and resolves a location the
way the FileIO will before it lets anything be written there.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, unquote, urlsplit

from tsoracle.catalog.errors import BadRequest

# One limit on every backend. A table's key in the database is its namespace's levels and its
# name; PostgreSQL's B-tree index takes an entry of about 2,700 bytes at most, so 8 levels of
# 255 bytes and a name of 255 stay below it with room to spare (and 255 is what file systems
# allow for one folder name, which a table's default location uses).
MAX_NAME_BYTES = 255
MAX_NAMESPACE_LEVELS = 8
MAX_PROPERTY_KEY_BYTES = 1024
MAX_PROPERTY_VALUE_BYTES = 64 * 1024
MAX_PROPERTIES = 1000
MAX_LOCATION_BYTES = 4096
MAX_PAGE_SIZE = 10_000
MAX_JSON_DEPTH = 64  # table metadata nests types a few levels deep; nothing needs 64
# An engine's commit carries a handful of updates (a create about ten); applying each copies
# the table's metadata, so thousands would hold a worker for seconds.
MAX_UPDATES = 256
MAX_TABLE_CHANGES = 256
MAX_METADATA_BYTES = 128 * 1024 * 1024  # a metadata file `register` may point at

# Properties the catalog itself acts on (everything else is stored and returned, never acted
# on). docs/iceberg.md lists them.
PATH_PROPERTIES = ("write.metadata.path", "write.data.path", "write.object-storage.path",
                   "write.folder-storage.path")
ACTED_ON = (*PATH_PROPERTIES, "location", "format-version",
            "write.metadata.previous-versions-max", "version.history.num-entries",
            "replace.drop-dialect.allowed")

# A key that names code: Iceberg's and pyiceberg's `*-impl` / `*.impl` keys (io-impl,
# py-io-impl, write.py-location-provider.impl, s3.retry-strategy-impl, ...), pyiceberg's `py-*`
# family, and Java's class-valued settings (client.factory, *.credentials-provider, *-class).
_CODE_KEY = re.compile(
    r"(^|[.\-_])impl$|(^|\.)py-|(^|[.\-_])class(-name)?$|(^|\.)client\.factory$"
    r"|credentials-provider$|(^|\.)factory(-impl)?$", re.IGNORECASE)


def names_code(key: str) -> bool:
    """Whether a property key names code for a reader of the table (or this catalog) to load."""
    return bool(_CODE_KEY.search(key.strip()))


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no database column or file name holds it
        raise BadRequest(f"{what} is not valid Unicode (a lone surrogate); send UTF-8 text") \
            from None


def check_text(text: str, what: str, limit: int) -> str:
    if len(_utf8(text, what)) > limit:
        raise BadRequest(f"{what} is longer than the catalog's limit of {limit} bytes (UTF-8)")
    return text


# NUL, and the separators the catalog uses inside its rows and routes.
_RESERVED = ("\x00", "\x1f", "\x1e")


def check_name(name: str, what: str = "table name") -> str:
    if not isinstance(name, str) or not name or any(c in name for c in _RESERVED):
        raise BadRequest(f"invalid {what} {name!r}: give a non-empty name without NUL or the "
                         "ASCII separators 0x1E and 0x1F")
    return check_text(name, f"the {what}", MAX_NAME_BYTES)


def check_namespace(levels: Sequence[str]) -> tuple[str, ...]:
    if not levels:
        raise BadRequest("invalid namespace []: give one or more non-empty levels")
    if len(levels) > MAX_NAMESPACE_LEVELS:
        raise BadRequest(f"a namespace has at most {MAX_NAMESPACE_LEVELS} levels; this one has "
                         f"{len(levels)}")
    for level in levels:
        if not isinstance(level, str) or not level:
            raise BadRequest(f"invalid namespace {list(levels)!r}: give one or more non-empty "
                             "levels")
        check_name(level, "namespace level")
    return tuple(levels)


def check_properties(properties: Mapping[str, str], what: str = "properties") -> None:
    """Sizes and encodings, and no key that names code to load."""
    if len(properties) > MAX_PROPERTIES:
        raise BadRequest(f"{what}: at most {MAX_PROPERTIES} properties in one request")
    for key, value in properties.items():
        check_property_key(key, what)
        check_text(value, f"{what}: the value of {key!r}", MAX_PROPERTY_VALUE_BYTES)


def check_property_key(key: str, what: str = "properties") -> None:
    if not key:
        raise BadRequest(f"{what}: a property key must not be empty")
    check_text(key, f"{what}: a property key", MAX_PROPERTY_KEY_BYTES)
    if names_code(key):
        raise BadRequest(f"{what}: {key!r} names code to load, which this catalog never does "
                         "for a client; leave it out (docs/iceberg.md, \"Trust boundary\", "
                         "lists the properties the catalog acts on)")


def check_keys(keys: Iterable[str], what: str) -> None:
    for key in keys:
        check_text(key, f"{what}: a property key", MAX_PROPERTY_KEY_BYTES)


# --- locations --------------------------------------------------------------------------------

def resolve(location: str) -> str:
    """`location` in the one spelling the FileIO writes to (`file:///abs/path`, or
    `scheme://bucket/path`), or BadRequest if the FileIO would write somewhere else than it
    reads: a host on `file:` (pyarrow writes `file://HOST/x` to the relative path `HOST/x`), a
    relative path, dot segments in any encoding, a query or fragment."""
    if not isinstance(location, str) or not location.strip():
        raise BadRequest("a location must be a non-empty string")
    check_text(location, "a location", MAX_LOCATION_BYTES)
    if location != location.strip():  # the FileIO keeps the spaces urlsplit drops
        raise BadRequest(f"location {location!r} begins or ends with white space")
    if any(c in location for c in "\x00\\") or any(ord(c) < 0x20 for c in location):
        raise BadRequest(f"location {location!r} holds a control character or a backslash")
    parts = urlsplit(location)
    if parts.query or parts.fragment or "?" in location or "#" in location:
        raise BadRequest(f"location {location!r} has a query or fragment; give a plain path")
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        if parts.netloc:
            raise BadRequest(f"location {location!r} names a host; a file location is "
                             "file:///absolute/path (or /absolute/path)")
        if not parts.path.startswith("/"):
            raise BadRequest(f"location {location!r} is relative; give an absolute path")
    elif not parts.netloc:
        raise BadRequest(f"location {location!r} names no bucket or host")
    elif len(scheme) == 1:  # a Windows drive letter: not a place on this catalog's storage
        raise BadRequest(f"location {location!r} is not a URI this catalog writes to")
    path = parts.path
    for spelling in (path, unquote(path), unquote(unquote(path))):
        if any(seg in (".", "..") for seg in spelling.split("/")):
            raise BadRequest(f"location {location!r} has a '.' or '..' segment; give the "
                             "place itself")
    normal = posixpath.normpath(path) if path else "/"
    normal = "/" if normal in ("", ".") else normal.rstrip("/") or "/"
    if scheme in ("", "file"):
        return "file://" + (normal if normal != "/" else "/")
    return f"{scheme}://{parts.netloc}{'' if normal == '/' else normal}"


def within(location: str, root: str) -> bool:
    """Both resolved: `location` is `root` or below it."""
    return location == root or location.startswith(root.rstrip("/") + "/")


def overlaps(a: str, b: str) -> bool:
    """Both resolved: one is the other or inside it (two tables would share files)."""
    return within(a, b) or within(b, a)


def segment(name: str) -> str:
    """A name as one folder of a default location: as it is when that is safe, else
    percent-encoded (a name with '/', '%' or '\\'), so that two names never share a folder and
    none climbs out of its parent. '.' and '..' become '%25%2E' and '%25%2E%2E': no other name
    encodes so (quoting leaves dots alone), and no decoding of them is a dot segment."""
    if name in (".", ".."):
        return "%25" + "%2E" * len(name)
    if any(c in name for c in "/%\\") or any(ord(c) < 0x20 for c in name):
        return quote(name, safe="")
    return name
