"""The backend interface the upper floors use: one statement, or one transaction, with retries."""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tsoracle.errors import OracleError
from tsoracle.store.dialect import Dialect
from tsoracle.store.retry import GaveUp, RetryPolicy, retrying
from tsoracle.store.url import BackendURL

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
DEFAULT_POOL_SIZE = 10


@dataclass(frozen=True)
class Statement:
    """A statement of a transaction sent whole (`Backend.at_once`)."""

    template: str
    params: Mapping[str, Any]


class Tx(ABC):
    """A transaction in progress; statements run in order on one connection."""

    dialect: Dialect

    @abstractmethod
    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows: ...


class Pinned(ABC):
    @abstractmethod
    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows: ...

    async def close(self) -> None:
        return None


class _Unpinned(Pinned):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        return await self.backend.fetch(template, params)


class Backend(ABC):
    """A pool of connections to one database; all errors leave as tsoracle errors."""

    dialect: Dialect
    url: BackendURL
    pooled = False  # a pool of connections (pinned ones come out of it), not a single one
    owns_connections = True  # False on a view (for_schema): closing leaves them open

    def __init__(
        self,
        url: BackendURL,
        *,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[str], None] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        create: bool = False,
    ) -> None:
        """Each kind uses what applies to it: `pool_size` bounds a pooled backend's
        connections; `create` lets an embedded database file be made (provisioning asks)."""
        self.url = url
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.pool_size = pool_size
        self.create = create

    @abstractmethod
    async def open(self) -> None:
        """Connect once to fail fast with a clear error, then start the pool."""

    async def close(self) -> None:
        """Close the connections, unless this is a view (`for_schema`) of another backend's."""
        if self.owns_connections:
            await self._close_connections()

    @abstractmethod
    async def _close_connections(self) -> None: ...

    @abstractmethod
    async def fetch(self, template: str, params: Mapping[str, Any] | None = None) -> Rows:
        """Run one statement in its own implicit transaction, retrying transient failures."""

    @abstractmethod
    async def transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """Run `body` in one transaction; the whole body is retried on transient failures."""

    # Whether `at_once` sends a whole transaction in one round trip (PostgreSQL's pipeline).
    sends_at_once = False

    async def at_once(self, statements: Sequence[Statement]) -> list[Rows]:
        """Run `statements` in order as one transaction sent in one round trip, and return
        each one's rows; an error in any of them rolls all back (retried like `transaction`).
        Only where `sends_at_once`: elsewhere a round trip costs too little to matter."""
        raise NotImplementedError("this backend sends statements one at a time")

    def pinned(self) -> Pinned:
        """A fetcher that keeps one connection for itself, for callers that run one statement
        at a time (batched reads, shared confirmations): no pool round trip per statement."""
        return _Unpinned(self)

    async def retried(self, once: Callable[[], Awaitable[T]]) -> T:
        """Run `once`, retrying what `transient_reason` names; every failure that leaves is a
        tsoracle error (`gave_up` or `translate` says which)."""
        try:
            return await retrying(once, policy=self.retry, transient=self.transient_reason,
                                  on_retry=self.on_retry)
        except GaveUp as exc:
            raise self.gave_up(exc) from None
        except OracleError:
            raise
        except Exception as exc:
            translated = self.translate(exc)
            if translated is None:
                raise
            raise translated from None

    @abstractmethod
    def transient_reason(self, exc: BaseException) -> str | None:
        """The kind of a failure worth retrying (a metrics label), or None."""

    @abstractmethod
    def gave_up(self, exc: GaveUp) -> OracleError:
        """The error for a transient failure that outlasted the retry budget."""

    @abstractmethod
    def translate(self, exc: Exception) -> OracleError | None:
        """The tsoracle error for a driver error (None: not the driver's, let it through)."""

    @abstractmethod
    async def execute_ddl(self, statement: Any) -> None:
        """Run one DDL statement (unprepared), retrying transient failures."""

    @abstractmethod
    async def table_exists(self, table: str) -> bool: ...

    def for_schema(self, schema: str) -> Backend:
        """The same open connections, addressing another schema's tables (the operator serves
        many resources in one database). Closing the result leaves the connections open: the
        backend it came from owns them."""
        view = copy.copy(self)
        view.url = dataclasses.replace(self.url, schema=schema)
        view.dialect = copy.copy(self.dialect)
        view.dialect.schema = schema
        view.owns_connections = False
        return view

    def enc(self, ts: int) -> Any:
        return self.dialect.encode_ts(ts)

    def dec(self, value: Any) -> int:
        return self.dialect.decode_ts(value)


def open_backend(
    url: BackendURL,
    *,
    retry: RetryPolicy | None = None,
    on_retry: Callable[[str], None] | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    create: bool = False,
) -> Backend:
    """Make (not yet open) the backend for a parsed URL, of the kind its scheme registered."""
    from tsoracle.store.kinds import backend_class

    return backend_class(url)(url, retry=retry, on_retry=on_retry, pool_size=pool_size,
                              create=create)
