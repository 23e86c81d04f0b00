"""`tsoracle operator` that exits (status 3) right after a flip commits, before it publishes it:
the crash test_operator.py's restart test recovers from. Test-only; the production operator
has no fault switch."""

from __future__ import annotations

import os
import sys

from tsoracle import cli
from tsoracle.operator import execute
from tsoracle.oracle.flip import FlipResult

real_flip = execute.flip_backend


async def flip_then_crash(*args: object, **kwargs: object) -> FlipResult:
    result = await real_flip(*args, **kwargs)  # type: ignore[arg-type]
    if result.changed:
        os._exit(3)
    return result


execute.flip_backend = flip_then_crash  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
