"""Which event loop tsoracle's own loops run on: uvloop when it is installed, else asyncio's.

`pip install 'tsoracle[uvloop]'` adds it. `TSORACLE_EVENT_LOOP=asyncio` keeps asyncio's loop
even then (the bench uses it to measure both in one run). Code that brings its own loop (an
application calling `tsoracle.connect`) keeps it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
ENV = "TSORACLE_EVENT_LOOP"


def chosen() -> str:
    """"uvloop" or "asyncio"."""
    if os.environ.get(ENV, "auto") == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    if chosen() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the chosen loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
