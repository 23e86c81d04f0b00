"""A throwaway PostgreSQL server on loopback, for tests, benchmarks and `make dev-cluster`.

    tsoracle-localpg start DIR [--port N]   # prints the URL of the `tsoracle` role
    tsoracle-localpg stop DIR
    tsoracle-localpg destroy DIR            # stop and delete DIR

(`python -m tsoracle_dev.localpg` is the same command.)

Runs the Debian `postgresql` binaries. As root, the server runs as the `postgres` user (initdb
refuses root); when that user cannot reach DIR (a private temporary or home folder), the
server's files live in a folder of its own under the system temporary folder instead: no
existing folder's permissions are changed. Host connections need a password (so wrong-password
cases are real); the superuser connects over the Unix socket in the server's folder.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tsoracle_dev import hosttools

if TYPE_CHECKING:
    from psycopg.sql import Composable

ROLE = "tsoracle"
# The role's password unless a caller gives its own (the dev cluster gives a random one).
PASSWORD = "tsoracle-test-pw"
DATABASE = "tsoracle"
# Every transaction in it is SERIALIZABLE by default, as on CockroachDB.
SERIALIZABLE_DATABASE = "tsoracle_serializable"


def bindir() -> Path:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise hosttools.MissingTool(hosttools.hint("initdb"))
    return Path(found[-1]).parent


def _alive(pid: int) -> bool:
    """Running, and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    def __init__(self, base: str | os.PathLike[str], port: int | None = None,
                 extra_listen: tuple[tuple[str, str], ...] = (), host: str = "127.0.0.1",
                 password: str = PASSWORD) -> None:
        """`extra_listen`: (address, client network) pairs to listen on besides loopback, and
        whose clients may log in with a password (the partition nemesis's namespace, a dev
        node's pods). `host`: the address URLs name. `password`: the role's, set when the role
        is created."""
        self.base = Path(base).resolve()
        self.password = password
        self.extra_listen = extra_listen
        self.host = host
        self._as_postgres = os.geteuid() == 0
        # The server's own files (data, log, socket): DIR, or a stand-in the server user reaches.
        self.home = self._home()
        self.data = self.home / "data"
        self.port_file = self.base / "port"
        stored = int(self.port_file.read_text()) if self.port_file.exists() else None
        if port and stored and port != stored:
            raise ValueError(f"{self.base} already holds a server on port {stored}; "
                             f"omit --port, or destroy it first")
        self.port = port or stored or free_port()
        self.bin = bindir()

    def _home(self) -> Path:
        if not self._as_postgres:
            return self.base
        ours = not self.base.exists() or self.base.stat().st_uid == pwd.getpwnam("postgres").pw_uid
        if ours and _reachable_by_postgres(self.base):
            return self.base
        digest = hashlib.sha256(str(self.base).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"tsoracle-pg-{digest}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # From "/": the server user may not be allowed into the caller's working folder (a
        # checkout under a 0700 temporary or home folder), and pg_ctl changes into it first.
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/")
        if check and proc.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0 if not self._as_postgres else 4]).name} failed: "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def init(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.base.mkdir(parents=True, exist_ok=True)
        self._make_home()
        self._run(self.bin / "initdb", "-D", self.data, "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--no-instructions")
        # fsync=off survives a server crash (the OS keeps the WAL); synchronous_commit stays on
        # so a crash-restart never loses a committed timestamp.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.home}'\n"
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "fsync = off\nfull_page_writes = off\n"
                "max_connections = 400\nlog_min_messages = warning\n"
            )
        self.port_file.write_text(str(self.port))

    def _make_home(self) -> None:
        """As root, the server user owns the folder holding its files (one localpg made)."""
        if not self._as_postgres:
            return
        self.home.mkdir(mode=0o700, exist_ok=True)
        pw = pwd.getpwnam("postgres")
        os.chown(self.home, pw.pw_uid, pw.pw_gid)

    def running(self) -> bool:
        status = self._run(self.bin / "pg_ctl", "-D", self.data, "status", check=False)
        return status.returncode == 0

    def _configure_listen(self) -> None:
        """Listen where this instance is asked to (a data folder may predate the ask)."""
        listen = ",".join(["127.0.0.1", *(addr for addr, _ in self.extra_listen)])
        conf = (self.data / "postgresql.conf").read_text()
        current = re.findall(r"^listen_addresses = '([^']*)'", conf, re.MULTILINE)
        if not current or current[-1] != listen:
            with open(self.data / "postgresql.conf", "a") as out:
                out.write(f"listen_addresses = '{listen}'\n")
        hba = (self.data / "pg_hba.conf").read_text()
        with open(self.data / "pg_hba.conf", "a") as out:
            for _, network in self.extra_listen:
                line = f"host all all {network} scram-sha-256"
                if line not in hba:
                    out.write(line + "\n")

    def start(self) -> str:
        self.init()
        if not self.running():
            self._configure_listen()
            self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.log,
                      "-w", "-t", "60", "start")
        self._provision()
        return self.url()

    def stop(self) -> None:
        if self.data.exists() and self.running():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.log,
                  "-w", "-t", "60", "start")

    def crash_and_restart(self, down_seconds: float = 1.0) -> int:
        """SIGKILL the postmaster, wait, start again (crash recovery runs). Returns the pid."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        server = [pid, *self._children(pid)]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        # Backends exit once they notice the postmaster died. The postmaster itself may linger
        # as a zombie when nothing reaps it, which would make its lock file look alive.
        while time.monotonic() < deadline and any(_alive(p) for p in server):
            time.sleep(0.1)
        time.sleep(down_seconds)
        # The dead postmaster's lock files would make the new one refuse to start.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        (self.home / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.log,
                  "-w", "-t", "60", "start")
        return pid

    @staticmethod
    def _children(ppid: int) -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == ppid:
                pids.append(int(proc.name))
        return pids

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, prefix: str) -> Iterator[LocalPostgres]:
        """A started server in a temporary folder, destroyed on the way out (benches)."""
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            pg = cls(Path(tmp) / "pg")
            try:
                pg.start()
                yield pg
            finally:
                pg.destroy()

    def destroy_when_this_process_exits(self) -> None:
        """However this process ends (an interrupt, a crash, SIGKILL), the server goes too."""
        run_when_this_process_exits([sys.executable, "-m", "tsoracle_dev.localpg", "destroy",
                                     str(self.base)])

    def url(self, password: str | None = None, database: str = DATABASE) -> str:
        """The role's URL (with another password, for wrong-password cases)."""
        secret = self.password if password is None else password
        return f"postgresql://{ROLE}:{secret}@{self.host}:{self.port}/{database}"

    def serializable_url(self, password: str | None = None) -> str:
        """The URL of a database whose transactions default to SERIALIZABLE."""
        return self.url(password, SERIALIZABLE_DATABASE)

    def admin_dsn(self, database: str = DATABASE) -> str:
        return f"host={self.home} port={self.port} user=postgres dbname={database}"

    def sql(self, statement: str | Composable,
            database: str = DATABASE) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.admin_dsn(database), autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def _provision(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                exists = self.sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}'", "postgres")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if not exists:
            from psycopg import sql

            self.sql(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(ROLE), sql.Literal(self.password)), "postgres")
            self.sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}", "postgres")
            self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if not self.sql("SELECT 1 FROM pg_database WHERE datname = "
                        f"'{SERIALIZABLE_DATABASE}'", "postgres"):
            self.sql(f"CREATE DATABASE {SERIALIZABLE_DATABASE} OWNER {ROLE}", "postgres")
            self.sql(f"ALTER DATABASE {SERIALIZABLE_DATABASE}"
                     " SET default_transaction_isolation = 'serializable'", "postgres")


def _reachable_by_postgres(path: Path) -> bool:
    """Whether the `postgres` user can walk down to `path` (as far as it exists)."""
    pw = pwd.getpwnam("postgres")
    for folder in [path, *path.parents]:
        try:
            st = folder.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == pw.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid == pw.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


# Reads its stdin until end-of-file, which comes when every process holding the pipe's other
# end has ended, however it ended; then runs its arguments.
_WATCHDOG = "import subprocess, sys; sys.stdin.buffer.read(); subprocess.run(sys.argv[1:])"
_watchdog_pipes: list[int] = []


def run_when_this_process_exits(argv: list[str]) -> None:
    """Run `argv` once this process has ended, even by SIGKILL.

    The watchdog sits in a session of its own, so the Ctrl-C that interrupts this process
    does not stop the watchdog before it has cleaned up.
    """
    read_end, write_end = os.pipe()  # not inherited by later children (PEP 446)
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, *argv], stdin=read_end,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    os.close(read_end)
    _watchdog_pipes.append(write_end)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tsoracle-localpg", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("start", help="create the server if needed, start it, print its URL")
    s.add_argument("dir", metavar="DIR", help="the server's folder (created if missing)")
    s.add_argument("--port", type=int, help="loopback port for a new server "
                   "(default: a free one; an existing server keeps its port)")
    for name, text in (("stop", "stop the server; its data stays"),
                       ("destroy", "stop the server and delete its folder")):
        c = sub.add_parser(name, help=text)
        c.add_argument("dir", metavar="DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "start":
            if args.port is not None and not 0 < args.port < 65536:
                raise ValueError(f"--port {args.port} is not a port number (1-65535)")
            print(LocalPostgres(args.dir, port=args.port).start())
            return 0
        if not Path(args.dir).exists():
            raise ValueError(f"{args.dir} holds no server (nothing to {args.command})")
        server = LocalPostgres(args.dir)
        server.stop() if args.command == "stop" else server.destroy()
    except (ValueError, RuntimeError) as exc:
        print(f"tsoracle-localpg: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
