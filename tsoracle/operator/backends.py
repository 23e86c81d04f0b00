"""The backends the operator opens: one per database, shared by every resource using it."""

from __future__ import annotations

import asyncio

from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.store import Backend, parse_url


class SharedBackends:
    """One open backend per database, shared by the resources whose Secrets name it: a pass
    opens no session of its own, and a hundred resources in one database use a few
    connections, not a hundred.

    Opening one database never waits for another: an unreachable one takes up to its
    connect_timeout (5 s) to fail, and every healthy resource behind a global lock waited that
    long. Concurrent opens of one database share one attempt. The maps change only between
    awaits (one event loop), so no lock guards them; closes run after the maps let go."""

    def __init__(self, pool_size: int) -> None:
        self._pool_size = pool_size
        self._roots: dict[str, Backend] = {}
        self._opening: dict[str, asyncio.Task[Backend]] = {}
        self._users: dict[str, set[str]] = {}  # a key has users only while its root is open
        self._used_by: dict[str, str] = {}

    async def get(self, resource: str, url: str) -> Backend:
        parsed = parse_url(url)
        key = f"{parsed.kind}\0{parsed.dsn}"
        root = self._roots.get(key)
        while root is None:
            task = self._opening.get(key)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._open(key, url))
                # Read even when every caller gave up waiting: asyncio would log it at ERROR,
                # with the database's location in the message.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                self._opening[key] = task
            # Shielded: one caller cancelled (its handler timed out) leaves the others' open.
            await asyncio.shield(task)
            # Gone again if its last user let go or close() ran meanwhile: open anew.
            root = self._roots.get(key)
        # From the lookup to the registration nothing awaits: no close can slip in between.
        stale = self._release(resource) if self._used_by.get(resource, key) != key else None
        self._users.setdefault(key, set()).add(resource)
        self._used_by[resource] = key
        if stale is not None:
            await stale.close()  # its Secret now names another database, which no one else uses
        return root.for_schema(parsed.schema)

    async def _open(self, key: str, url: str) -> Backend:
        try:
            root = await open_instrumented_backend(url, create=True, pool_size=self._pool_size)
        finally:
            self._opening.pop(key, None)
        self._roots[key] = root
        return root

    async def forget(self, resource: str) -> None:
        root = self._release(resource)
        if root is not None:
            await root.close()

    def _release(self, resource: str) -> Backend | None:
        """Detach `resource`; returns its database's backend to close if it was the last
        user (already out of the maps, so a concurrent get opens a fresh one)."""
        key = self._used_by.pop(resource, None)
        if key is None:
            return None
        users = self._users.get(key, set())
        users.discard(resource)
        if users:
            return None
        self._users.pop(key, None)
        return self._roots.pop(key, None)

    async def close(self) -> None:
        # Opens in flight finish first (cancelling one midway could leave its pool behind);
        # each one that succeeds lands in _roots.
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        roots = list(self._roots.values())
        self._roots.clear()
        self._users.clear()
        self._used_by.clear()
        for root in roots:
            await root.close()
