"""The dev cluster's process abstraction (tsoracle_dev.controlplane.process) on tiny real
processes: start order, unwinding in reverse when a start fails, readiness that ends at once
when the process exits, and stop's SIGKILL for a process that ignores SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tsoracle_dev.controlplane.process import Process, Started, StartError

# Says it serves once its SIGTERM handler is in place; on SIGTERM, writes its name to STOPS.
SERVES = """
import signal, sys, time
def bye(*_):
    with open({stops!r}, "a") as out:
        out.write({name!r} + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("serving", flush=True)
time.sleep(60)
"""


class Script(Process):
    """A Python one-liner; ready once its log says `serving`."""

    def __init__(self, name: str, code: str, logs: Path, timeout: float = 30.0) -> None:
        super().__init__([sys.executable, "-c", code], logs)
        self.name = self.what = name
        self.timeout = timeout

    def ready(self) -> bool:
        return "serving" in self.tail()


def serving(name: str, tmp_path: Path) -> Script:
    return Script(name, SERVES.format(name=name, stops=str(tmp_path / "stops")), tmp_path)


def test_a_failed_start_stops_those_started_in_reverse_order(tmp_path):
    recorded: list[tuple[str, int | None]] = []
    phases: list[str] = []

    def phase(what: str) -> contextlib.AbstractContextManager[None]:
        phases.append(what)
        return contextlib.nullcontext()

    started = Started(record=lambda p: recorded.append((p.name, p.pid)), phase=phase)
    first, second = serving("first", tmp_path), serving("second", tmp_path)
    broken = Script("broken", "print('broken: flag --nope not defined'); raise SystemExit(2)",
                    tmp_path)
    started.start(first)
    started.start(second)
    with pytest.raises(StartError, match="broken exited") as failed:
        started.start(broken)
    assert "flag --nope not defined" in str(failed.value)  # the end of its log
    assert [name for name, _ in recorded] == ["first", "second", "broken"]
    assert all(pid for _, pid in recorded)  # each pid known as soon as it was spawned
    assert phases == ["first", "second", "broken"]
    assert (tmp_path / "stops").read_text().split() == ["second", "first"]
    assert not first.alive() and not second.alive()
    assert started.processes == []


def test_readiness_ends_at_once_when_the_process_exits(tmp_path):
    proc = Script("etcd", "print('listen tcp 127.0.0.1:2379: bind: address already in use');"
                  "raise SystemExit(1)", tmp_path, timeout=60)
    proc.spawn()
    began = time.monotonic()
    with pytest.raises(StartError) as failed:
        proc.wait_ready()
    assert time.monotonic() - began < 10  # not the 60 s deadline
    assert "etcd exited; the end of its log:" in str(failed.value)
    assert "address already in use" in str(failed.value)


def test_readiness_ends_when_a_process_it_needs_exits(tmp_path):
    started = Started()
    needed = serving("containerd", tmp_path)
    started.start(needed)
    assert needed.pid is not None
    os.kill(needed.pid, signal.SIGKILL)
    waiting = Script("kubelet", "import time; time.sleep(60)", tmp_path, timeout=60)
    began = time.monotonic()
    with pytest.raises(StartError, match="containerd exited"):
        started.start(waiting)
    assert time.monotonic() - began < 10
    assert not waiting.alive()


def test_readiness_times_out_with_the_log_tail_and_is_stopped(tmp_path):
    started = Started()
    slow = Script("kube-apiserver", "print('still loading', flush=True);"
                  "import time; time.sleep(60)", tmp_path, timeout=0.5)
    with pytest.raises(StartError, match=r"timed out after 0 s waiting for kube-apiserver") \
            as failed:
        started.start(slow)
    assert "still loading" in str(failed.value)
    assert not slow.alive()


def test_processes_started_together_come_up_side_by_side(tmp_path):
    """Each is spawned before any is waited for: the first is ready only once the second
    serves."""
    second = serving("second", tmp_path)

    class NeedsSecond(Script):
        def ready(self) -> bool:
            return "serving" in second.tail()

    first = NeedsSecond("first", "import time; time.sleep(60)", tmp_path, timeout=10)
    started = Started()
    try:
        started.start(first, second)
        assert first.alive() and second.alive()
    finally:
        started.stop()
    assert not first.alive() and not second.alive()


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path):
    stubborn = Script("stubborn", "import signal, time; signal.signal(signal.SIGTERM, "
                      "signal.SIG_IGN); print('serving', flush=True); time.sleep(60)", tmp_path)
    stubborn.stop_timeout = 0.5
    Started().start(stubborn)
    began = time.monotonic()
    stubborn.stop()
    assert not stubborn.alive() and time.monotonic() - began < 5
