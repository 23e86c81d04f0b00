"""`tsoracle operator` that stops in the middle of a deletion's clean-up and waits there to be
killed: test_operator_production.py SIGKILLs it, then starts a healthy operator. Test-only; the
production operator has no fault switch.

    TSORACLE_DEV_STALL_AT=before|mid|after TSORACLE_DEV_STALL_FILE=PATH \\
        python -m tsoracle_dev.stalled_deletion operator --namespace NS ...

Where it stops, for deletionPolicy Delete (drop) and Retain (release):
- before: the handler is about to drop or release; nothing is done yet.
- mid: Delete only: right after `DROP TABLE deployment` committed (each DROP is a statement of
  its own), before the other tables and the schema.
- after: the drop or release committed; kopf has not removed the finalizer yet.
It writes the point's name to PATH once it is there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from tsoracle import cli
from tsoracle.operator import execute

STALL_AT_ENV, STALL_FILE_ENV = "TSORACLE_DEV_STALL_AT", "TSORACLE_DEV_STALL_FILE"
POINTS = ("before", "mid", "after")
real_drop, real_release = execute.drop_deployment, execute.release


async def _stall(point: str) -> None:
    Path(os.environ[STALL_FILE_ENV]).write_text(point)
    await asyncio.Event().wait()  # until SIGKILL


def _wrap(real: Any, at: str) -> Any:
    async def wrapped(backend: Any, *args: Any) -> Any:
        if at == "before":
            await _stall(at)
        if at == "mid":
            real_ddl = backend.execute_ddl
            deployment = backend.dialect.render("DROP TABLE IF EXISTS {deployment}")

            async def ddl(statement: Any) -> None:
                await real_ddl(statement)
                if statement == deployment:
                    await _stall(at)

            backend.execute_ddl = ddl  # this resource's view of the backend only
        result = await real(backend, *args)
        if at == "after":
            await _stall(at)
        return result
    return wrapped


if __name__ == "__main__":
    # Patched only when run: importing this module changes nothing.
    point = os.environ[STALL_AT_ENV]
    if point not in POINTS:
        raise SystemExit(f"${STALL_AT_ENV} must be one of {POINTS}, not {point!r}")
    execute.drop_deployment = _wrap(real_drop, point)
    execute.release = _wrap(real_release, point)
    sys.exit(cli.main(sys.argv[1:]))
