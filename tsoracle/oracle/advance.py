"""Moving timelines forward by hand, after the oracle's database went back in time.

A restore from a backup or a point-in-time recovery rewinds `read_ts` and `write_ts`; on
counting timelines nothing brings them back, so timestamps handed out since the backup would be
handed out again. `advance_timelines` raises them above what clients saw (`tsoracle advance`,
docs/runbooks/timestamp-fallback.md); `positions` is what the operator records as its
high-water mark. Forward only: nothing here ever lowers a timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tsoracle.errors import Arg, ConfigError, UnknownTimeline
from tsoracle.fencing import PlannedBy, admit, lock_deployment
from tsoracle.oracle.api import check_ts, wall_clock_ms
from tsoracle.oracle.options import DEFAULT_MAX_CLOCK_SKEW_MS
from tsoracle.oracle.timeline import parse_timeline
from tsoracle.store import Backend, Tx

# The largest move `advance` makes without `force`: a typo (an extra digit) must not burn a
# timeline's range. Counting timelines may jump this many timestamps; EpochMilliseconds may go
# this far ahead of the wall clock, which is where writers refuse to follow (the default
# max_clock_skew_ms): above it every write_ts would fail with ClockSkew until the clock caught
# up. EpochMilliseconds needs no bound on the jump itself: after a restore from an old backup
# the right target is near the wall clock, however far behind the stored position is.
MAX_COUNTER_JUMP = 10**9
MAX_AHEAD_MS = DEFAULT_MAX_CLOCK_SKEW_MS


@dataclass(frozen=True)
class AdvanceResult:
    timeline: str
    to: int  # the target asked for
    before: int  # the highest read_ts/write_ts over the implementations' rows, before
    after: int  # the same, afterwards
    changed: bool  # False: the target was at or below `before`, nothing was written
    epoch: int  # the deployment epoch afterwards
    fenced: bool  # the epoch was bumped: live legacy leaders must reopen (see advance_timelines)


async def positions(backend: Backend) -> dict[str, int]:
    """Per timeline, the highest read_ts or write_ts of any implementation's row: at or above
    every timestamp handed out so far (a legacy row holds its reserved upper)."""
    rows = await backend.fetch("SELECT timeline, read_ts, write_ts FROM {timestamps}")
    top: dict[str, int] = {}
    for timeline, read_ts, write_ts in rows:
        name = str(timeline)
        top[name] = max(top.get(name, 0), backend.dec(read_ts), backend.dec(write_ts))
    return top


async def advance_timeline(backend: Backend, timeline: str, to: int, *, force: bool = False,
                           now: Callable[[], int] | None = None) -> AdvanceResult:
    """Raise `timeline` so that its next write_ts is above `to` and read_ts is at least `to`;
    see `advance_timelines`."""
    return (await advance_timelines(backend, {timeline: to}, force=force, now=now))[timeline]


async def advance_timelines(backend: Backend, targets: Mapping[str, int], *,
                            force: bool = False, now: Callable[[], int] | None = None,
                            by: PlannedBy | None = None) -> dict[str, AdvanceResult]:
    """One transaction, with the deployment locked like a flip: raise write_ts and read_ts of
    every implementation's row of each timeline to its target (GREATEST: forward only; a target
    at or below the timeline's position changes nothing). A jump beyond MAX_COUNTER_JUMP, or on
    EpochMilliseconds beyond MAX_AHEAD_MS ahead of the wall clock (`now`), is refused unless
    `force`.

    read_ts moves too: after a restore it also went back, and every reader that saw more stops
    (TimestampFallback) until it is above what they saw. Writes allocated at or below the
    target and applied later land below read_ts, as when a later write is applied first.

    When legacy is the active implementation and something moved, the epoch is bumped and every
    legacy leader fenced, as a flip does. A live leader serves from a window it reserved in
    memory, and the restore may have forgotten that window: left alone, it would go on handing
    it out, and a leader started after it (a failover) would begin at the restored rows, below
    what it handed out. Fenced, it reopens: the new leader starts from the advanced rows, and
    in the same process they are checked against everything it saw (its reserved window
    included), so a target too low stops it with TimestampFallback instead of a repeat.
    Distributed processes read the rows on every call and need no fencing.

    With `by` (the operator's repair), a deployment that no longer follows that planner raises
    StalePlan and nothing moves.
    """
    clock = now or wall_clock_ms
    wanted = {parse_timeline(name).name: check_ts(to) for name, to in targets.items()}

    async def body(tx: Tx) -> dict[str, AdvanceResult]:
        dep, rows = await lock_deployment(tx)
        admit(dep, by)
        before: dict[str, int] = {}
        for timeline_value, _impl, read_ts, write_ts in rows:
            name = str(timeline_value)
            before[name] = max(before.get(name, 0), backend.dec(read_ts), backend.dec(write_ts))
        moving = {}
        for name, to in wanted.items():
            if name not in before:
                raise UnknownTimeline(name)
            if to > before[name]:
                if not force:
                    _check_jump(name, before[name], to, clock)
                moving[name] = to
        for name, to in moving.items():
            await tx.fetch(
                "UPDATE {timestamps} SET write_ts = GREATEST(write_ts, %(to)s::numeric),"
                " read_ts = GREATEST(read_ts, %(to)s::numeric) WHERE timeline = %(timeline)s",
                {"to": backend.enc(to), "timeline": name})
        epoch, fenced = dep.epoch, bool(moving) and dep.implementation == "legacy"
        if fenced:
            epoch += 1
            await tx.fetch("UPDATE {deployment} SET epoch = %(epoch)s WHERE id = 1",
                           {"epoch": epoch})
            # The leader epoch fences a legacy leader in every mode (in Rollout mode with no
            # rollout in progress the guard does not look at the epoch); the epoch makes the
            # leader's error Fenced, which a reopening client retries, not LeadershipLost.
            await tx.fetch("UPDATE {timestamps} SET epoch = %(epoch)s,"
                           " leader_epoch = leader_epoch + 1", {"epoch": epoch})
        return {name: AdvanceResult(name, to, before[name], moving.get(name, before[name]),
                                    name in moving, epoch, fenced)
                for name, to in wanted.items()}

    return await backend.transaction(body)


def _check_jump(timeline: str, before: int, to: int, now: Callable[[], int]) -> None:
    if parse_timeline(timeline).wall_clock:
        ahead = to - now()
        if ahead > MAX_AHEAD_MS:
            raise ConfigError.worded(
                "advancing timeline {timeline!r} to {to} puts it {ahead} ms ahead of this "
                "machine's wall clock, more than {most} ms: writers would refuse every write_ts "
                "(ClockSkew) until the clock caught up; check the target, or pass {force} if it "
                "is meant",
                timeline=timeline, to=to, ahead=ahead, most=MAX_AHEAD_MS,
                force=Arg("force", True))
    elif to - before > MAX_COUNTER_JUMP:
        raise ConfigError.worded(
            "advancing timeline {timeline!r} from {before} to {to} jumps {jump} timestamps, "
            "more than {most}; check the target, or pass {force} if it is meant",
            timeline=timeline, before=before, to=to, jump=to - before, most=MAX_COUNTER_JUMP,
            force=Arg("force", True))
