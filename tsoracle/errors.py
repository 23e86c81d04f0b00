"""Typed errors. Every message says what happened and what to do next; none carries a secret."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Self, TypeVar

E = TypeVar("E", bound=BaseException)


@dataclass(frozen=True)
class Arg:
    """An argument that an error message tells the caller to change.

    Python callers read it as a keyword argument (`implementation='legacy'`), the command line
    as a flag (`--implementation legacy`): `OracleError.worded` renders both from one template,
    so no message shows a `tsoracle` user Python syntax, or a library user a flag.
    """

    name: str  # the keyword argument; its flag is --name-with-dashes
    value: Any = None  # the value to pass; None: the argument itself
    omit: bool = False  # leave the argument out (Python: pass None)

    def python(self) -> str:
        if self.omit:
            return f"{self.name}=None"
        return self.name if self.value is None else f"{self.name}={self.value!r}"

    def flag(self) -> str:
        flag = "--" + self.name.replace("_", "-")
        if self.omit:
            return f"omit {flag}"
        return flag if self.value is None or self.value is True else f"{flag} {self.value}"


class OracleError(Exception):
    """Base class of every error tsoracle raises on purpose."""

    cli_text: str | None = None  # the message in command-line terms, when it names arguments

    @classmethod
    def worded(cls, template: str, **values: Any) -> Self:
        """An error whose message names arguments (`Arg` values): `str()` says them the Python
        way, `for_cli()` as flags. Other values are formatted as given (`{timeline!r}`)."""
        def fill(render: str) -> str:
            return template.format(**{k: getattr(v, render)() if isinstance(v, Arg) else v
                                      for k, v in values.items()})
        err = cls(fill("python"))
        err.cli_text = fill("flag")
        return err

    def for_cli(self) -> str:
        """The message as `tsoracle` shows it: flags, not keyword arguments."""
        return self.cli_text or str(self)


def anew(exc: E) -> E:
    """A copy of a stored error (type, message, attributes; no traceback) to raise once more.

    Raising one object again and again lengthens its traceback by the raising frames each time
    and keeps them all alive: a fenced oracle called 20,000 times held 100,002 frames (~20 MB).
    The error must be rebuilt by its class from its `args` (or define `__reduce__`)."""
    return copy.copy(exc)


class ConfigError(OracleError):
    """Bad input from the user: a malformed URL, an unknown option value."""


class InvalidTimeline(ConfigError):
    """A timeline name that is not one of the supported forms."""


class OracleUnavailable(OracleError):
    """The backend cannot be reached or answered with an error that retries did not clear."""


class Refused(OracleUnavailable):
    """The database refused a statement for its data (too large for an index, not encodable,
    a constraint): retrying cannot help, and nothing of the statement landed. `kind` is
    "duplicate" (a unique key another transaction took) or "invalid". The message names no
    value, table, host or user."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Contended(OracleUnavailable):
    """Every retry conflicted with concurrent transactions (40001, deadlocks): the server is up,
    the rows are hot."""


class NotInitialized(OracleUnavailable):
    """The schema or a timeline has not been provisioned yet."""


class OracleClosed(OracleUnavailable):
    """The oracle was closed (by this process): open a new one."""

    def __init__(self, message: str = "this oracle is closed; open a new one with "
                 "tsoracle.connect") -> None:
        super().__init__(message)


class UnknownTimeline(NotInitialized):
    """The timeline exists nowhere in the backend."""

    def __init__(self, timeline: str) -> None:
        self.timeline = timeline
        super().__init__(
            f"timeline {timeline!r} does not exist in the backend; "
            f"create it with `tsoracle init --timeline {timeline}`"
        )


class Fenced(OracleError):
    """This process was superseded: a newer leader or a flip moved the epoch."""


class LeadershipLost(Fenced):
    """Another process took over this legacy timeline (taking it back would fence that one)."""


class Reprovisioned(Fenced):
    """The deployment was dropped and provisioned again: its timestamps restarted, so nothing
    stamped before may be carried over (a reopening client does not retry the call)."""


class TimelineMismatch(OracleError):
    """A read mixes inputs that live on different timelines."""

    def __init__(self, timelines: list[str]) -> None:
        self.timelines = sorted(set(timelines))
        super().__init__(
            "inputs are on different timelines ("
            + ", ".join(repr(t) for t in self.timelines)
            + "); read each timeline separately, they have no common timestamp"
        )


class ReadOnly(OracleError):
    """A write operation on an oracle opened read-only."""


class ClockSkew(OracleError):
    """A write timestamp would run further ahead of the wall clock than allowed."""

    @classmethod
    def ahead(cls, timeline: str, ts: int, now: int, allowed_ms: int) -> ClockSkew:
        return cls.worded(
            "timeline {timeline!r} would hand out {ts}, {ahead} ms ahead of this process's wall "
            "clock, more than the allowed {allowed} ms; check the clocks of the writers, or "
            "raise {skew}",
            timeline=timeline, ts=ts, ahead=ts - now, allowed=allowed_ms,
            skew=Arg("max_clock_skew_ms"),
        )


class TimestampExhausted(OracleError):
    """The timeline reached the largest representable timestamp."""

    @classmethod
    def at_end(cls, timeline: str) -> TimestampExhausted:
        return cls(f"timeline {timeline!r} reached the largest timestamp ({2**64 - 1}); "
                   "start a new timeline")


class TimestampFallback(OracleUnavailable):
    """The oracle's database answered a timestamp below one this process already saw: it went
    back in time (restored from a backup, a point-in-time recovery). Nothing below is handed
    out; calls fail until the timeline is moved forward (`tsoracle advance`, or the operator),
    then succeed again on the same oracle. Not `Fenced`: reopening would find the same rows."""

    RUNBOOK = "docs/runbooks/timestamp-fallback.md"

    def __init__(self, timeline: str, kind: str, got: int, seen: int) -> None:
        self.timeline, self.kind, self.got, self.seen = timeline, kind, got, seen
        bound = "at or below" if kind == "write_ts" else "below"
        super().__init__(
            f"timeline {timeline!r}: the oracle's database went back in time (restored?): its "
            f"{kind} is {got}, {bound} {seen} that this process already saw, so nothing was "
            f"handed out; run `tsoracle advance --timeline {timeline} --to T` with T at or "
            f"above the highest timestamp any client saw (this process: {seen}), or let the "
            f"operator repair it; see {self.RUNBOOK}"
        )

    def __reduce__(self) -> tuple[type[TimestampFallback], tuple[str, str, int, int]]:
        return (type(self), (self.timeline, self.kind, self.got, self.seen))


class MissingExtra(ConfigError):
    """A command needs an optional part of tsoracle that is not installed."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        self.what, self.extra, self.module = what, extra, module
        super().__init__(
            f"{what} needs the {extra!r} extra ({module} is not installed); "
            f"install it with: pip install 'tsoracle[{extra}]'"
        )

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str, str, str]]:
        return (type(self), (self.what, self.extra, self.module))
