"""The backends the operator opens: one per database, shared by every resource using it."""

from __future__ import annotations

import asyncio

from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.store import Backend, parse_url


class SharedBackends:
    """One open backend per database, shared by the resources whose Secrets name it: a pass
    opens no session of its own, and a hundred resources in one database use a few
    connections, not a hundred."""

    def __init__(self, pool_size: int) -> None:
        self._pool_size = pool_size
        self._roots: dict[str, Backend] = {}
        self._users: dict[str, set[str]] = {}
        self._used_by: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def get(self, resource: str, url: str) -> Backend:
        parsed = parse_url(url)
        key = f"{parsed.kind}\0{parsed.dsn}"
        async with self._lock:
            if self._used_by.get(resource, key) != key:
                await self._forget(resource)  # its Secret now names another database
            root = self._roots.get(key)
            if root is None:
                root = await open_instrumented_backend(url, create=True,
                                                       pool_size=self._pool_size)
                self._roots[key] = root
            self._users.setdefault(key, set()).add(resource)
            self._used_by[resource] = key
        return root.for_schema(parsed.schema)

    async def forget(self, resource: str) -> None:
        async with self._lock:
            await self._forget(resource)

    async def _forget(self, resource: str) -> None:
        key = self._used_by.pop(resource, None)
        if key is None:
            return
        users = self._users.get(key, set())
        users.discard(resource)
        if not users:
            self._users.pop(key, None)
            root = self._roots.pop(key, None)
            if root is not None:
                await root.close()

    async def close(self) -> None:
        async with self._lock:
            for root in self._roots.values():
                await root.close()
            self._roots.clear()
            self._users.clear()
            self._used_by.clear()
