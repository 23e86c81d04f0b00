"""Legacy leadership: a per-timeline leader epoch checked by the storage itself.

Starting a leader bumps the epoch in the timeline's legacy row. Every window reservation is a
conditional UPDATE on that row and every confirmation a SELECT of it, so a superseded leader learns
it lost, from the storage, before it hands out anything the new leader could contradict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from tsoracle.coalesce import Coalescer, shared_calls
from tsoracle.errors import Fenced, LeadershipLost, UnknownTimeline, anew
from tsoracle.fencing.modes import (
    Deployment,
    confirms_reads,
    moved,
    read_deployment,
    superseded,
)
from tsoracle.fencing.tables import fenced
from tsoracle.store import Backend
from tsoracle.store.backend import Pinned

# Each statement also returns the deployment's fencing mode, so a change of mode reaches the
# leader at its next reservation or confirmation, whatever the mode was when it started.
_START = fenced("UPDATE {timestamps} SET leader_epoch = leader_epoch + 1 WHERE {row}"
                 " RETURNING leader_epoch, read_ts, write_ts, {guard}, fence")
_RESERVE = fenced("UPDATE {timestamps} SET write_ts = GREATEST(write_ts, %(upper)s::numeric),"
                  " read_ts = GREATEST(read_ts, %(read)s::numeric)"
                  " WHERE {row} AND leader_epoch = %(leader_epoch)s AND {guard}"
                  " RETURNING write_ts, fence")
# An apply persists the read frontier before any read may return it, so a successor (or a
# flip) starts reads exactly there: never below a returned read, never past an unapplied write.
_PERSIST_READ = fenced("UPDATE {timestamps} SET read_ts = GREATEST(read_ts, %(read)s::numeric)"
                       " WHERE {row} AND leader_epoch = %(leader_epoch)s AND {guard}"
                       " RETURNING read_ts, fence")
_CONFIRM = fenced("SELECT leader_epoch = %(leader_epoch)s AND {guard}, fence FROM {timestamps}"
                  " WHERE {row}")
_LEADER_EPOCH = fenced("SELECT leader_epoch FROM {timestamps} WHERE {row}")


@dataclass(frozen=True)
class Start:
    leader_epoch: int
    read_ts: int
    upper: int


class Leadership:
    """One process's claim to serve a timeline from memory."""

    def __init__(
        self,
        backend: Backend,
        timeline: str,
        opened: Deployment,
        *,
        fencing_override: str | None = None,
        on_batch: Callable[[int], None] | None = None,
        on_query: Callable[[str], None] | None = None,
        pipeline_depth: int = 1,
    ) -> None:
        self.backend = backend
        self.timeline = timeline
        self.opened = opened
        self.leader_epoch = -1
        self.mode = opened.fence  # as last seen in storage
        self.fencing_override = fencing_override  # this process only, for experiments
        self._on_query = on_query or (lambda _name: None)
        # Confirmations keep a connection for the first one in flight; further ones (up to
        # `pipeline_depth`, coalesce.Pipelined) borrow from the pool.
        self._confirm_conn = backend.pinned()
        self._confirms = shared_calls(
            [partial(self._confirm_once, self._confirm_conn),
             *[partial(self._confirm_once, None)] * (pipeline_depth - 1)], on_batch)
        self._pending_reads: list[int] = []  # values of the callers the next persist serves
        self._persists = Coalescer(self._persist_read_once)
        self.fenced: Fenced | None = None
        # When the statement whose answer was applied last started: the storage named this
        # process leader, in `mode`, at least as late as that. Statements overlap (pipelined
        # confirmations, a window reserved meanwhile) and may return in any order; an older
        # one's answer must not overwrite a newer one's.
        self._confirmed_at = time.monotonic()

    @property
    def confirms_reads(self) -> bool:
        """Confirm before answering from memory, unless the mode (as last seen) is Disabled."""
        return confirms_reads(self.fencing_override or self.mode)

    def since_confirmed(self) -> float:
        """Seconds since the storage last named this process leader."""
        return time.monotonic() - self._confirmed_at

    def _saw(self, mode: str, started: float) -> None:
        """A guarded statement that started at `started` succeeded and read `mode`."""
        if started >= self._confirmed_at:
            self._confirmed_at = started
            self.mode = mode

    def _params(self, **extra: object) -> dict[str, object]:
        return {"timeline": self.timeline, "implementation": "legacy",
                **self.opened.guard_params(),
                "leader_epoch": self.leader_epoch, **extra}

    async def start(self) -> Start:
        """Become the leader, fencing whoever was before; returns the durable state to resume."""
        self._on_query("become_leader")
        rows = await self.backend.fetch(_START, self._params())
        if not rows:
            raise UnknownTimeline(self.timeline)
        leader_epoch, read_ts, upper, ok, self.mode = rows[0]
        self.leader_epoch = int(leader_epoch)
        if not ok:
            raise await self._explain()
        return Start(self.leader_epoch, self.backend.dec(read_ts), self.backend.dec(upper))

    async def reserve(self, upper: int, read_ts: int) -> int:
        """Durably reserve timestamps up to `upper`; returns the reserved upper."""
        self.check()
        self._on_query("reserve_window")
        started = time.monotonic()
        rows = await self.backend.fetch(
            _RESERVE,
            self._params(upper=self.backend.enc(upper), read=self.backend.enc(read_ts)),
        )
        if not rows:
            raise await self._explain()
        self._saw(rows[0][1], started)
        return self.backend.dec(rows[0][0])

    async def persist_read(self, read_ts: int) -> None:
        """Durably raise the read frontier to `read_ts` (a guarded write: it also confirms the
        leadership). Concurrent calls share one statement with the largest value."""
        self.check()
        self._pending_reads.append(read_ts)
        await self._persists.call()

    async def _persist_read_once(self) -> None:
        # Take exactly the values registered so far (this statement started after their callers
        # did); if it fails they are dropped with it, so a failed apply never rides along with
        # a later, lower one.
        values, self._pending_reads = self._pending_reads, []
        self.check()
        if not values:
            return
        self._on_query("persist_read")
        started = time.monotonic()
        rows = await self.backend.fetch(
            _PERSIST_READ, self._params(read=self.backend.enc(max(values))))
        if not rows:
            raise await self._explain()
        self._saw(rows[0][1], started)

    async def confirm(self) -> None:
        """Raise Fenced unless the storage still names this process leader; callers share calls."""
        self.check()
        await self._confirms.call()

    async def _confirm_once(self, conn: Pinned | None) -> None:
        self.check()
        self._on_query("confirm_leadership")
        params = self._params()
        started = time.monotonic()
        rows = await (conn.fetch(_CONFIRM, params) if conn is not None
                      else self.backend.fetch(_CONFIRM, params))
        if not rows:
            raise UnknownTimeline(self.timeline)
        ok, mode = rows[0]
        if not ok:
            raise await self._explain()
        self._saw(mode, started)

    async def idle(self) -> None:
        """Wait for batches still running (on the pinned connection, or the pool)."""
        await self._confirms.idle()
        await self._persists.idle()

    async def close(self) -> None:
        await self._confirm_conn.close()

    def check(self) -> None:
        if self.fenced is not None:
            raise anew(self.fenced)  # each caller its own: see errors.anew

    async def _explain(self) -> Fenced:
        now = await read_deployment(self.backend)
        if moved(self.opened, now, "legacy"):
            err = superseded(self.opened, now, "legacy")
        else:
            rows = await self.backend.fetch(
                _LEADER_EPOCH, {"timeline": self.timeline, "implementation": "legacy"}
            )
            current = int(rows[0][0]) if rows else "?"
            err = LeadershipLost(
                f"a newer legacy leader took over timeline {self.timeline!r} (leader epoch "
                f"{self.leader_epoch} -> {current}); only one process may serve a timeline with "
                "the legacy implementation, use the distributed one for several processes"
            )
        self.fenced = err
        return err
