"""`tsoracle operator` that stops itself (SIGSTOP) mid-pass, once: after the pass planned a flip
and before the flip's transaction, as a paused VM or a long GC would stop it. It first writes
$TSORACLE_PAUSE_MARKER, so a test knows the pass is planned and stopped. Test-only; the
production operator has no fault switch.

The production daemon is cancelled as soon as kopf sees its resource deleted, which may land
before or after the resumed pass reaches the database. Here kopf only asks the daemon to stop
(a long cancellation_backoff), so the resumed pass always reaches the database: the guards
there, not the cancellation, are what the test watches.

    TSORACLE_PAUSE_MARKER=/tmp/paused python -m tsoracle_dev.pausing_operator operator ...
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import kopf

_real_daemon = kopf.daemon


def _patient_daemon(*args: Any, **kwargs: Any) -> Any:
    return _real_daemon(*args, **{**kwargs, "cancellation_backoff": 600})


paused = False


async def _pause_then_flip(*args: Any, **kwargs: Any) -> Any:
    global paused
    if not paused and kwargs.get("by") is not None:  # a planned flip, not PublishFlip's probe
        paused = True
        Path(os.environ["TSORACLE_PAUSE_MARKER"]).write_text(str(kwargs["by"]))
        os.kill(os.getpid(), signal.SIGSTOP)
    return await _real_flip(*args, **kwargs)


if __name__ == "__main__":
    # Patched only when run, and before the handlers register: importing this module changes
    # nothing.
    kopf.daemon = _patient_daemon
    from tsoracle import cli
    from tsoracle.operator import execute

    _real_flip = execute.flip_backend
    execute.flip_backend = _pause_then_flip
    sys.exit(cli.main(sys.argv[1:]))
