"""The dev cluster's one process abstraction: a component's argv, log, readiness and stop, and
the order components start in (and stop in, backwards, when one fails to start)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# What a readiness probe may raise while its component is still coming up (HTTPError is an
# OSError).
NOT_YET = (OSError, ValueError, KeyError)


class StartError(RuntimeError):
    """A component did not start; the message ends with the end of its log."""


def alive(pid: int) -> bool:
    """Running, and not a zombie (a dead child of ours is reaped here)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(ChildProcessError):  # not our child: /proc tells
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> bytes:
    """Its NUL-separated argv; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop(pids: Iterable[int], timeout: float = 10.0) -> None:
    """SIGTERM to all at once, SIGKILL to those still running after `timeout` seconds."""
    pids = [pid for pid in pids if alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # SIGKILL is not instant: gone when this returns
        while alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)


class Process:
    """One program of the cluster, logging to `logs/<name>.log`.

    Subclasses set `name` and `what` (the progress line's words), override `ready` (one probe:
    true when the component serves) and `prepare` (the files it reads), and may set `timeout`
    and `stop_timeout`."""

    name = "process"
    what = ""  # empty: `up` does not wait for it
    timeout = 60.0
    stop_timeout = 10.0

    def __init__(self, argv: list[str], logs: Path, pid: int | None = None) -> None:
        self.argv = argv
        self.logs = logs
        self.pid = pid

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}.log"

    def prepare(self) -> None:
        """Write what the program reads at start."""

    def ready(self) -> bool:
        return True

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def spawn(self) -> int:
        self.prepare()
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = proc.pid
        return proc.pid

    def wait_ready(self, timeout: float | None = None, watch: Iterable[Process] = ()) -> None:
        """Poll `ready` until it holds; ends at once when this process or one of `watch`
        exits (a component it needs), else at the deadline."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            for proc in (self, *watch):
                if not proc.alive():
                    raise StartError(f"{proc.name} exited; the end of its log:\n{proc.tail()}")
            with contextlib.suppress(*NOT_YET):
                if self.ready():
                    return
            if time.monotonic() > deadline:
                raise StartError(f"timed out after {timeout:.0f} s waiting for "
                                 f"{self.what or self.name}:\n--- {self.log.name}\n{self.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.pid is not None:
            stop([self.pid], self.stop_timeout)


class Started:
    """Processes started in order; if one fails to start, all started so far stop in reverse
    order and the error goes on (a later step's failure: call `stop`).

    `record` learns each pid as soon as it exists (a crashed `up` must find it to clean up);
    `phase` wraps each wait (the progress line)."""

    def __init__(self, record: Callable[[Process], None] = lambda proc: None,
                 phase: Callable[[str], contextlib.AbstractContextManager[None]] =
                 lambda what: contextlib.nullcontext()) -> None:
        self.record = record
        self.phase = phase
        self.processes: list[Process] = []

    def start(self, *processes: Process) -> None:
        """Spawn all of them, then wait for each that has a readiness to wait for, in order:
        they come up side by side."""
        try:
            for proc in processes:
                self.processes.append(proc)
                proc.spawn()
                self.record(proc)
            for proc in processes:
                if proc.what:
                    with self.phase(proc.what):
                        proc.wait_ready(watch=self.processes)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop()
