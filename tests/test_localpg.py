"""tsoracle_dev.localpg as a user runs it, and the servers a test run starts going away with it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tsoracle_dev.localpg import _alive as running_not_zombie
from tsoracle_dev.localpg import free_port

ROOT = Path(__file__).resolve().parents[1]
LOCALPG = [sys.executable, "-m", "tsoracle_dev.localpg"]


def localpg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCALPG, *args], capture_output=True, text=True,
                          timeout=180, cwd="/")


@pytest.mark.parametrize("args", [["--help"], ["start", "--help"], ["stop", "-h"]])
def test_help_starts_nothing(args, tmp_path):
    proc = subprocess.run([*LOCALPG, *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage: tsoracle-localpg" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # once made a server in a folder named `--help`


@pytest.mark.parametrize("args, message", [
    (["start"], "the following arguments are required: DIR"),
    (["start", "/tmp/x", "--port", "70000"], "--port 70000 is not a port number"),
    (["start", "/tmp/x", "--port", "many"], "argument --port: invalid int value"),
    (["stop", "/nonexistent/tsoracle-pg"], "holds no server (nothing to stop)"),
    (["restart", "/tmp/x"], "invalid choice: 'restart'"),
])
def test_bad_arguments_say_what_is_wrong(args, message):
    proc = localpg(*args)
    assert proc.returncode in (1, 2)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.pg
def test_port_and_private_parent_left_alone(tmp_path):
    """`--port` is honoured; a folder the server user cannot enter keeps its mode."""
    parent = tmp_path / "private"
    parent.mkdir(mode=0o700)
    modes = {p: p.stat().st_mode for p in [parent, *parent.parents]}
    port = free_port()
    server = parent / "pg"
    try:
        url = localpg("start", str(server), "--port", str(port))
        assert url.returncode == 0, url.stderr
        assert url.stdout.strip().endswith(f"@127.0.0.1:{port}/tsoracle")
        with psycopg.connect(url.stdout.strip()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert {p: p.stat().st_mode for p in modes} == modes  # it chmod'ed parents o+x
        again = localpg("start", str(server), "--port", str(port + 1))
        assert again.returncode == 1 and f"already holds a server on port {port}" in again.stderr
        assert localpg("stop", str(server)).returncode == 0
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url.stdout.strip(), connect_timeout=3)
    finally:
        localpg("destroy", str(server))
    assert not server.exists()
    assert stat.S_IMODE(parent.stat().st_mode) == 0o700


def _alive(pid: int) -> bool:
    return running_not_zombie(pid)


def _ctrl_c_interrupts() -> None:
    """SIGINT as a terminal's Ctrl-C finds it: not ignored, not blocked. This test process may
    have inherited it ignored (started in the background by a non-interactive shell), or a
    thread may block it; both pass on to a child, which would never see the interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "(gone)"
    return " ".join(line for line in lines if line.startswith(("State", "Sig")))


@pytest.mark.pg
@pytest.mark.parametrize("how, with_kube", [
    pytest.param(signal.SIGINT, True, id="interrupted", marks=pytest.mark.kube),
    pytest.param(signal.SIGKILL, False, id="killed"),
])
def test_servers_go_when_the_run_is_interrupted_or_killed(how, with_kube, tmp_path):
    """Ctrl-C (SIGINT to the whole process group) or SIGKILL of a pytest run: its PostgreSQL
    (and API server, etcd) stop and their folders are deleted."""
    held = tmp_path / "held.json"
    env = {**os.environ, "HOLD_SERVERS_FILE": str(held),
           "HOLD_SERVERS_KUBE": "1" if with_kube else ""}
    env.pop("KUBECONFIG", None)  # the kube fixture would use an existing cluster instead
    # Its output goes to a file: a pipe nobody reads fills up with the interrupted run's
    # traceback and blocks it for good.
    output = tmp_path / "inner.log"
    run = subprocess.Popen(
        # In one process (-n 0): the interrupt must reach the run that holds the servers.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         f"--basetemp={tmp_path / 'inner'}", str(ROOT / "tests/support/holds_servers.py")],
        cwd=ROOT, env=env, stdout=output.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_ctrl_c_interrupts)
    try:
        deadline = time.monotonic() + 600
        while not held.exists():
            assert run.poll() is None, output.read_text()[-3000:]
            assert time.monotonic() < deadline, "the inner run never started its servers"
            time.sleep(0.2)
        servers = json.loads(held.read_text())
        assert all(_alive(pid) for pid in servers["pids"].values())
        if how == signal.SIGINT:
            os.killpg(run.pid, how)  # what a terminal's Ctrl-C does
        else:
            os.kill(run.pid, how)  # a crash: pytest alone ends, no teardown runs
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end: {_signal_state(run.pid)}\n"
                        f"{output.read_text()[-3000:]}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(map(_alive, servers["pids"].values())):
            time.sleep(0.2)
        left = {name: pid for name, pid in servers["pids"].items() if _alive(pid)}
        assert not left, f"still running after the run ended: {left}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(Path(d).exists() for d in servers["dirs"]):
            time.sleep(0.2)
        assert not [d for d in servers["dirs"] if Path(d).exists()]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
