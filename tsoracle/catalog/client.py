"""tsoracle's own endpoints on its Iceberg catalog (`/v1/tsoracle/...`), called the way an
engine's driver calls them: urllib only, none of the server's dependencies, so every engine's
helper (Spark's `Lakehouse`, `tsoracle.duckdb`) takes its timestamps through one client.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from tsoracle.errors import ConfigError, OracleUnavailable

# A catalog answering 503 is between oracle leaders (a flip, a legacy take-over): wait this
# long, in total, before telling the caller.
UNAVAILABLE_WAITS_S = (0.2, 0.5, 1.0, 2.0)


class TableNotFound(ConfigError):
    """The table does not exist in the catalog."""


class CatalogUnavailable(OracleUnavailable):
    """The catalog did not answer, or answered that it cannot serve now."""


@dataclass(frozen=True)
class Advice:
    """How the calling engine's user mends a refusal, in that engine's own terms."""

    pass_token: str  # where the token goes, e.g. "Lakehouse(..., token=...)"
    create_table: str  # how a table is made, e.g. "Lakehouse.create_table"


class CatalogClient:
    """The catalog at `uri`; `token` is its bearer token (`--token-file`), if it asks for one.
    Errors name the catalog without user information, and never the token."""

    def __init__(self, uri: str, *, advice: Advice, token: str | None = None,
                 name: str = "tso", timeout_s: float = 30.0) -> None:
        self.uri = uri.rstrip("/")
        self.shown_uri = without_userinfo(self.uri)
        self.name = name
        self._advice = advice
        self._token = token
        self._timeout_s = timeout_s

    def read_ts(self) -> int:
        """A linearizable read timestamp (one oracle round trip, through the catalog)."""
        return int(self.call("POST", "/v1/tsoracle/read-ts")["read-ts"])

    def closed_ts(self) -> int:
        """A timestamp nothing can commit at or below any more (no oracle round trip)."""
        return int(self.call("GET", "/v1/tsoracle/closed")["closed-ts"])

    def scrub(self, text: str) -> str:
        return text.replace(self._token, "<token>") if self._token else text

    def call(self, method: str, path: str, *, table: str | None = None) -> dict[str, Any]:
        """One request, JSON back. `table`: the table the request is about (a 404 is then
        that table missing)."""
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for wait in (*UNAVAILABLE_WAITS_S, None):
            request = urllib.request.Request(self.uri + path, method=method, headers=headers,
                                             data=b"" if method == "POST" else None)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    return dict(json.load(response))
            except urllib.error.HTTPError as exc:
                message = error_message(exc)
                if exc.code == 503 and wait is not None:
                    time.sleep(wait)
                    continue
                raise self._refusal(exc.code, message, table) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or exc.__class__.__name__
                raise CatalogUnavailable(
                    f"the catalog at {self.shown_uri} did not answer ({self.scrub(str(reason))}"
                    "); is `tsoracle catalog serve` running there?") from None
        raise AssertionError("unreachable")  # the last wait is None: the loop raises

    def _refusal(self, code: int, message: str, table: str | None) -> Exception:
        where = f"the catalog at {self.shown_uri}"
        if code in (401, 403):
            return ConfigError(f"{where} refused the request ({code}): pass the token its "
                               f"--token-file holds ({self._advice.pass_token})")
        if code == 404 and table is not None:
            return TableNotFound(f"table {table} does not exist in catalog {self.name!r} at "
                                 f"{self.shown_uri}; create it with {self._advice.create_table}")
        if code == 404:
            return ConfigError(f"{where} has no tsoracle endpoints: it is not `tsoracle "
                               "catalog serve`, which linearized and serializable reads need")
        if code >= 500:
            return CatalogUnavailable(f"{where} cannot serve now ({code}: {message})")
        return ConfigError(f"{where} refused the request ({code}: {message})")


def error_message(exc: urllib.error.HTTPError) -> str:
    """The REST error model's message, or the status line."""
    try:
        body = json.loads(exc.read() or b"{}")
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError, OSError):
        return str(exc.reason)


def without_userinfo(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
