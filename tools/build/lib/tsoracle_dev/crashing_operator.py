"""`tsoracle operator` that exits (status 3) right after a flip commits, before it publishes it:
the crash test_operator.py's restart test recovers from. Test-only; the production operator
has no fault switch.

    python -m tsoracle_dev.crashing_operator operator --namespace NS ...
"""

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


if __name__ == "__main__":
    # Patched only when run: importing this module changes nothing.
    execute.flip_backend = flip_then_crash  # type: ignore[assignment]
    sys.exit(cli.main(sys.argv[1:]))
