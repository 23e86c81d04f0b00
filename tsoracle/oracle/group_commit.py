"""Group commit: concurrent writers share one write_ts, one append and one apply_write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from tsoracle.errors import OracleError
from tsoracle.oracle import commit_engine as engine
from tsoracle.oracle.api import WriteTimestamp

P = TypeVar("P")


class Stamper(Protocol):
    """The two oracle operations a group commit uses: any TimestampOracle, or a wrapper that
    reopens one (the Spark tables' client)."""

    async def write_ts(self) -> WriteTimestamp: ...

    async def apply_write(self, ts: int) -> None: ...


class Conflict(Exception):
    """Raised by an append that lost a compare-and-set; the group retries at a fresh timestamp."""


class CommitInterrupted(OracleError):
    """A commit stopped by a cancellation (or another BaseException) instead of an error.

    `stage` is where it stopped: "queued" (never started: nothing was appended),
    "write_ts" (nothing was appended), "append" (whether the payloads were appended at `ts`
    is unknown) or "apply" (they were appended at `ts`; whether `apply_write(ts)` ran is
    unknown). `ts` is None until the group took a timestamp.
    """

    stage: str = "queued"
    ts: int | None = None

    @classmethod
    def at(cls, stage: str, ts: int | None) -> CommitInterrupted:
        why = {
            "queued": "the group committer's task stopped (cancelled or interrupted) before "
                      "this payload was committed: nothing was appended; commit it again",
            "write_ts": "the group commit was interrupted while taking its write timestamp: "
                        "nothing was appended; commit it again",
            "append": f"the group commit at {ts} was interrupted during its append: whether "
                      f"the payloads were appended at {ts} is unknown, and {ts} was not "
                      "applied; look for them at that timestamp before committing them again",
            "apply": f"the group commit at {ts} was interrupted during apply_write({ts}): the "
                     "payloads were appended, but whether readers see them yet is unknown; "
                     f"apply_write({ts}) (it is idempotent) makes them visible, do not commit "
                     "them again",
        }[stage]
        err = cls(why)
        err.stage, err.ts = stage, ts
        return err


class GroupCommitter(Generic[P]):
    """`await commit(payload)` returns the timestamp at which the payload became visible.

    While one group is committing, newcomers queue up and form the next group (the commit
    engine's `Groups`). Readers that read only what is at or below `read_ts` see a group once
    `apply_write` covers its timestamp. If the append fails, nobody in the group gets a
    timestamp and nothing is applied. If `apply_write` fails after the append (fenced: a flip
    or a newer legacy leader), the callers get that error, but the appended rows stay at their
    timestamp and become visible once any later write above it is applied. An append that
    raises `Conflict` is retried at a fresh timestamp (`max_conflicts` times at most). A group
    stopped by a cancellation instead (an append that awaited a cancelled task, or the
    committer's own task cancelled) fails its callers with `CommitInterrupted`, which says how
    far it got; later groups are served as usual.
    """

    def __init__(
        self,
        oracle: Stamper,
        append: Callable[[int, list[P]], Awaitable[None]],
        *,
        max_group: int = 10_000,
        max_conflicts: int = 50,
        on_group: Callable[[int], None] | None = None,
    ) -> None:
        self.oracle = oracle
        self._append = append
        self._max_conflicts = max_conflicts
        self._on_group = on_group
        self._groups: engine.Groups[P] = engine.Groups(self._land, self._stopped, max_group)
        # Where the group in flight is, for the error of a group stopped by a cancellation.
        self._stage = "write_ts"
        self._stage_ts: int | None = None

    async def commit(self, payload: P) -> int:
        outcome = await self._groups.submit(payload)
        if isinstance(outcome, engine.Landed):
            return int(outcome.result)
        assert not isinstance(outcome, engine.Conflict)  # retried in `_land`
        raise outcome.error

    async def _land(self, group: list[engine.Attempt[P]]) -> None:
        if self._on_group is not None:
            self._on_group(len(group))
        payloads = [attempt.item for attempt in group]
        ts = await engine.retry(
            lambda _: self._attempt(payloads), attempts=self._max_conflicts, what="a group",
            exhausted=lambda: Conflict(f"gave up after {self._max_conflicts} conflicting "
                                       "commits"))
        for attempt in group:
            attempt.settle(engine.Landed(ts))

    async def _attempt(self, payloads: list[P]) -> engine.Outcome:
        self._stage, self._stage_ts = "write_ts", None
        ts = (await self.oracle.write_ts()).timestamp
        self._stage, self._stage_ts = "append", ts
        try:
            await self._append(ts, payloads)
        except Conflict:
            # Nothing was appended: until the next write_ts, a stop says so.
            self._stage, self._stage_ts = "write_ts", None
            return engine.Conflict("another writer committed above its timestamp first")
        self._stage = "apply"
        await self.oracle.apply_write(ts)
        return engine.Landed(ts)

    def _stopped(self, exc: BaseException, started: bool) -> engine.Outcome:
        """A group's error goes to its callers; a cancellation says how far it got."""
        if isinstance(exc, Exception):
            return engine.Failed(exc)
        if not started:
            return engine.Failed(CommitInterrupted.at("queued", None))
        interrupted = CommitInterrupted.at(self._stage, self._stage_ts)
        maybe = self._stage in ("append", "apply")  # its payloads may be at its timestamp
        return engine.Unknown(interrupted) if maybe else engine.Failed(interrupted)
