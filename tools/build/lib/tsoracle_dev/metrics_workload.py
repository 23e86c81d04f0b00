"""A small oracle workload that serves /metrics, for the observability tests.

    python -m tsoracle_dev.metrics_workload URL METRICS_PORT SECONDS
"""

from __future__ import annotations

import asyncio
import sys
import time

import tsoracle
from tsoracle.store import RetryPolicy


async def main(url: str, port: int, seconds: float) -> None:
    tsoracle.serve_metrics(port)
    deadline = time.monotonic() + seconds
    oracles: dict[str, tsoracle.TimestampOracle] = {}
    policy = RetryPolicy(timeout=1.0)  # fail fast, so outages show up as failed operations

    locks = {tl: asyncio.Lock() for tl in ("EpochMilliseconds", "counter:obs")}

    async def get(tl: str) -> tsoracle.TimestampOracle:
        async with locks[tl]:  # one oracle per timeline: two legacy leaders would fence each other
            if tl not in oracles:
                oracles[tl] = await tsoracle.open_oracle(url, timeline=tl, implementation=None,
                                                         retry=policy)
            return oracles[tl]

    async def client(tl: str) -> None:
        while time.monotonic() < deadline:
            try:
                o = await get(tl)
                w = await o.write_ts()
                await o.apply_write(w.timestamp)
                await asyncio.gather(*[o.read_ts() for _ in range(8)])
                await o.confirm_leadership()
            except tsoracle.Fenced:
                oracles.pop(tl, None)
            except tsoracle.OracleUnavailable:  # the backend is away: keep the oracle, try again
                await asyncio.sleep(0.2)
            except tsoracle.OracleError:
                oracles.pop(tl, None)
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.01)

    await asyncio.gather(*[client(tl) for tl in ("EpochMilliseconds", "counter:obs")
                           for _ in range(4)])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
