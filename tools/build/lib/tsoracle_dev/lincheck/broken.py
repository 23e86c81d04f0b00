"""Deliberately broken oracles, for the checker's self-test. Never use outside lincheck.

- `read-past-unapplied`: read_ts answers with write_ts, so it can pass a write that was
  allocated but not yet applied.
- `reuse-after-restart`: a new legacy leader resumes from the durable read_ts instead of the
  reserved upper, so write timestamps of the previous leader repeat.
- `skip-epoch-check`: legacy leaders never confirm their epoch, so a superseded leader keeps
  serving stale reads.
- `resume-at-the-clock`: a new legacy leader of EpochMilliseconds resumes at its own clock
  instead of the reserved upper, trusting the clock to be past whatever its predecessor handed
  out: true while clocks agree (a `takeovers` run did not catch it), false once one jumped.
"""

from __future__ import annotations

from typing import Any

from tsoracle.oracle.distributed import DistributedOracle
from tsoracle.oracle.legacy import LegacyOracle

VARIANTS = ("read-past-unapplied", "reuse-after-restart", "skip-epoch-check",
            "resume-at-the-clock")


def install(name: str) -> dict[str, Any]:
    """Patch the implementations in this process; returns extra open_oracle arguments."""
    if name == "read-past-unapplied":
        async def read_write_ts(self: DistributedOracle, conn: Any) -> int:
            rows = await self._fetch_on("read", conn)
            assert rows
            return await self._peek_write_ts()

        DistributedOracle._query_read = read_write_ts  # type: ignore[method-assign]
        return {}
    if name == "reuse-after-restart":
        async def start_from_read(self: LegacyOracle) -> None:
            state = await self.leadership.start()
            self._read = self._write = self._upper = state.read_ts  # the bug: not the upper
            self.resumed_at = state.read_ts
            await self._extend(self._write + 1)

        LegacyOracle.start = start_from_read  # type: ignore[method-assign]
        return {}
    if name == "resume-at-the-clock":
        async def start_at_clock(self: LegacyOracle) -> None:
            state = await self.leadership.start()
            self._read = state.read_ts
            # The bug: the clock stands in for the reserved upper.
            start = self.now() if self.timeline.wall_clock else state.upper
            self._write = self._upper = self.resumed_at = start
            await self._extend(self._write + 1)

        LegacyOracle.start = start_at_clock  # type: ignore[method-assign]
        return {}
    if name == "skip-epoch-check":
        return {"fencing": "Disabled"}
    raise ValueError(f"unknown broken variant {name!r}; choose from {VARIANTS}")
