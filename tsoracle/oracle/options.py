"""What opening an oracle takes: one options object, checked once, before any connection.

`tsoracle.connect`, `open_oracle` and `connect_sync` take these fields as keyword arguments
and build an `OracleOptions` from them; the implementations get explicit parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tsoracle.coalesce import MAX_PIPELINE_DEPTH
from tsoracle.errors import Arg, ConfigError
from tsoracle.fencing import check_implementation, check_mode
from tsoracle.oracle.legacy import DEFAULT_WINDOW
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, Timeline, parse_timeline
from tsoracle.store import RetryPolicy
from tsoracle.store.backend import DEFAULT_POOL_SIZE

DEFAULT_MAX_CLOCK_SKEW_MS = 60_000
# Batched read_ts / confirm_leadership calls in flight at once (coalesce.Pipelined;
# docs/design.md, "Pipelined batches"): beyond the first, each borrows a pool connection.
DEFAULT_PIPELINE_DEPTH = 8


@dataclass(frozen=True)
class OracleOptions:
    """How to open an oracle; a bad value raises ConfigError (or InvalidTimeline) here."""

    timeline: str = EPOCH_MILLISECONDS
    """`EpochMilliseconds`, `counter:<name>`, `external:<name>` or `user:<name>`."""
    implementation: str | None = "distributed"
    """`distributed` or `legacy`; None follows the deployment's active implementation."""
    batching: bool = True
    """Concurrent `read_ts` calls of a distributed oracle share statements."""
    read_only: bool = False
    """Refuse `write_ts` and `apply_write` (distributed only: a legacy oracle leads, so a
    read-only open of a legacy deployment is refused before it takes anything over)."""
    now: Callable[[], int] | None = None
    """The clock in milliseconds on EpochMilliseconds; None: the wall clock."""
    fencing: str | None = None
    """Overrides the deployment's mode for this process only (for experiments; production
    follows the deployment); like the deployment's mode it only decides whether a legacy
    leader confirms before answering from memory, never whether a fenced process may
    allocate."""
    max_clock_skew_ms: int | None = DEFAULT_MAX_CLOCK_SKEW_MS
    """How far ahead of this process's clock a timestamp on EpochMilliseconds may be; None:
    no limit."""
    window: int = DEFAULT_WINDOW
    """What a legacy leader reserves at a time: ms on EpochMilliseconds, else timestamps."""
    pool_size: int = DEFAULT_POOL_SIZE
    """Connections to a PostgreSQL-compatible server (SQLite has one)."""
    retry: RetryPolicy | None = None
    """The retry budget of each call; None: `RetryPolicy()`."""
    pipeline_depth: int | None = None
    """How many batched `read_ts` (and `confirm_leadership`) calls may be in flight at once;
    None: 8, fewer when `pool_size` leaves less room (`pipeline_depth_for`)."""

    def __post_init__(self) -> None:
        self.parsed_timeline()
        if self.implementation is not None:
            check_implementation(self.implementation)
        if self.fencing is not None:
            check_mode(self.fencing)
        if self.implementation == "legacy" and self.read_only:
            raise ConfigError.worded(
                "the legacy oracle serves from its leader's memory, so it cannot be read-only; "
                "open read-only clients with {use}", use=Arg("implementation", "distributed"))
        if not _is_int(self.pool_size) or self.pool_size < 1:
            raise ConfigError.worded("{pool} must be a positive integer, got {got!r}",
                                     pool=Arg("pool_size"), got=self.pool_size)
        depth = self.pipeline_depth
        if depth is not None and (not _is_int(depth) or not 1 <= depth <= MAX_PIPELINE_DEPTH):
            raise ConfigError.worded("{depth} must be an integer from 1 to {most}, got {got!r}",
                                     depth=Arg("pipeline_depth"), most=MAX_PIPELINE_DEPTH,
                                     got=depth)

    def parsed_timeline(self) -> Timeline:
        return parse_timeline(self.timeline)

    def pipeline_depth_for(self, chosen: str, pinned: int, pooled: bool) -> int:
        """The pipeline depth for the `chosen` implementation, which keeps `pinned`
        connections for itself, on a backend with a pool of connections (`pooled`) or one.

        Batches beyond the first borrow pool connections, and one connection stays for
        everything else: the default shrinks to fit, an explicit depth that does not fit is
        refused, and so is a pool the pinned connections would take whole (every other
        statement would wait for a connection that never comes free).
        """
        depth = self.pipeline_depth or DEFAULT_PIPELINE_DEPTH
        if not pooled:
            return depth
        if self.pool_size <= pinned:
            raise ConfigError.worded(
                "{pool} is too small for the {chosen} oracle: it keeps {pinned} connection(s) "
                "for batched calls and needs at least one more; use {enough} or more",
                pool=Arg("pool_size", self.pool_size), chosen=chosen, pinned=pinned,
                enough=Arg("pool_size", pinned + 1))
        room = self.pool_size - pinned
        if self.pipeline_depth is None:
            return min(depth, room)
        if depth > room:
            raise ConfigError.worded(
                "{pool} leaves room for {room} batched call(s) in flight besides the "
                "{pinned} connection(s) the {chosen} oracle keeps; use {smaller} or {bigger}",
                pool=Arg("pool_size", self.pool_size), room=room, pinned=pinned,
                chosen=chosen, smaller=Arg("pipeline_depth", room),
                bigger=Arg("pool_size", pinned + depth))
        return depth


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
