"""Idempotency-Key (the REST spec's header for safe retries of a mutation).

A request that carries a key leaves a row for it in the transaction that lands its change, so
the row exists exactly when the change landed, whatever became of the reply. Its answer is
added to the row once it is sent (a final one: 2xx, or a 4xx that retrying cannot change). A
request with a key already on a row gets that row's answer again and changes nothing; with the
same key but another method, path or body it is refused (422), since a key names one logical
operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass

from tsoracle.catalog import state
from tsoracle.catalog.errors import BadRequest, CatalogError
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.store import Tx

DEFAULT_LIFETIME_S = 1800  # what /v1/config advertises: the spec's own example, PT30M
# Rows are kept this much longer than advertised: a retry sent just inside the lifetime, from
# a client whose clock runs behind the catalog's, still finds its row.
GRACE_S = 300
# A bigger answer (a table with a long history) is not kept: a replay rebuilds it from what
# landed (the spec allows a replay to show a newer state), so the rows stay small.
MAX_KEPT_BODY = 64 * 1024
MAX_LIFETIME_S = 7 * 86400  # rows are kept that long at most (a long lifetime is a big table)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Mark:
    """The key a request carries, the fingerprint of what it asks (method, path, body), and
    the wall-clock time before which a row for the key has expired."""

    key: str
    fingerprint: str
    expired_ms: int


@dataclass(frozen=True)
class Stored:
    """A key's row: whose request it was and, once sent, the final answer (status None: the
    change landed and its answer was never recorded)."""

    fingerprint: str
    status: int | None
    body: str | None


class KeyReused(CatalogError):
    """The key names another request (another method, path or body)."""

    status, type = 422, "UnprocessableEntityException"


class KeyTaken(CatalogError):
    """Another request with this key landed first, concurrently (another replica, say)."""

    status, type = 409, "CommitFailedException"
    final = False


# The key of the request being served, for the transaction that lands it (set by app.py).
CURRENT: ContextVar[Mark | None] = ContextVar("tsoracle_idempotency_key", default=None)


def parse_key(header: str) -> str:
    """The key in its canonical form (lower case), or BadRequest."""
    key = header.strip().lower()
    if not _UUID.fullmatch(key):
        raise BadRequest("the Idempotency-Key header must be a UUID in its 36-character form "
                         "(the REST spec asks for a UUIDv7); send a new one per operation")
    return key


def fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    """What a key's request asked, as one hash: a key reused for anything else is refused."""
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))  # no two requests share a serialisation
        digest.update(part)
    return digest.hexdigest()


def as_json(answer: object) -> str:
    """`answer` as the catalog's JSON responses render it, so that a replay is byte-equal."""
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def lifetime_text(seconds: int) -> str:
    """ISO 8601 duration, as /v1/config advertises it (PT30M, PT1H30M, PT45S)."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S"))
                   if n)
    return "PT" + (text or "0S")


def final(status: int, error: CatalogError | None) -> bool:
    """Whether an answer is final (replayed for the key): a success, or a 4xx the same request
    would get again; never a 5xx, and never a refusal that asks to try again later."""
    if 200 <= status < 300:
        return True
    if not 400 <= status < 500 or status in (408, 429):
        return False
    return error is None or error.final


def check(stored: Stored, mark: Mark) -> None:
    """Raise KeyReused unless `stored` is this request's row."""
    if stored.fingerprint != mark.fingerprint:
        raise KeyReused("this Idempotency-Key was already used for another request (another "
                        "method, path or body); a key names one operation: send a new key")


async def record(tx: Tx, answer: tuple[int, str] | None = None) -> None:
    """Leave the served request's key (if it sent one) in the transaction that lands it, with
    its answer if that is known already."""
    mark = CURRENT.get()
    if mark is not None:
        await record_mark(tx, mark, answer)


async def record_mark(tx: Tx, mark: Mark, answer: tuple[int, str] | None = None) -> None:
    if not await state.record_key(tx, mark.key, mark.fingerprint, wall_clock_ms(),
                                  mark.expired_ms, answer):
        raise KeyTaken("another request with this Idempotency-Key landed first; send the "
                       "request again with the same key for its answer")


class InFlight:
    """One request per key at a time in this process: a duplicate sent while the first is
    still being served waits for its answer instead of racing it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def one(self, key: str) -> AsyncIterator[None]:
        lock, waiting = self._locks[key] if key in self._locks else (asyncio.Lock(), 0)
        self._locks[key] = (lock, waiting + 1)
        try:
            async with lock:
                yield
        finally:
            lock, waiting = self._locks[key]
            if waiting == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, waiting - 1)
