"""A throwaway PostgreSQL server on loopback, for tests, benchmarks and `make dev-cluster`.

    python tools/localpg.py start DIR    # prints the URL of the `tsoracle` role
    python tools/localpg.py stop DIR

Runs the Debian `postgresql` binaries. As root, the server runs as the `postgres` user (initdb
refuses root). Host connections need a password (so wrong-password cases are real); the
superuser connects over the Unix socket in DIR.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROLE = "tsoracle"
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
        raise RuntimeError("PostgreSQL server binaries not found; apt-get install postgresql")
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
                 extra_listen: tuple[tuple[str, str], ...] = ()) -> None:
        """`extra_listen`: (address, client network) pairs to listen on besides loopback, and
        whose clients may log in with a password (the partition nemesis's namespace)."""
        self.base = Path(base).resolve()
        self.extra_listen = extra_listen
        self.data = self.base / "data"
        self.port_file = self.base / "port"
        self.port = port or (int(self.port_file.read_text()) if self.port_file.exists()
                             else free_port())
        self.bin = bindir()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
            if self.base.exists():
                # Again before every command: another pytest session starting on this machine
                # makes its temporary root private again (0700), mid-run.
                self._grant_access()
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
        self._grant_access()
        self._run(self.bin / "initdb", "-D", self.data, "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--no-instructions")
        listen = ",".join(["127.0.0.1", *(addr for addr, _ in self.extra_listen)])
        with open(self.data / "pg_hba.conf", "a") as hba:
            for _, network in self.extra_listen:
                hba.write(f"host all all {network} scram-sha-256\n")
        # fsync=off survives a server crash (the OS keeps the WAL); synchronous_commit stays on
        # so a crash-restart never loses a committed timestamp.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '{listen}'\n"
                f"unix_socket_directories = '{self.base}'\n"
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "fsync = off\nfull_page_writes = off\n"
                "max_connections = 400\nlog_min_messages = warning\n"
            )
        self.port_file.write_text(str(self.port))

    def _grant_access(self) -> None:
        """The server user owns its folder and can walk down to it (mkdtemp makes 0700 dirs,
        and a folder may have been re-created or tightened since the cluster was made)."""
        if not self._as_postgres:
            return
        pw = pwd.getpwnam("postgres")
        os.chown(self.base, pw.pw_uid, pw.pw_gid)
        for parent in self.base.parents:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod(mode | 0o001)

    def running(self) -> bool:
        status = self._run(self.bin / "pg_ctl", "-D", self.data, "status", check=False)
        return status.returncode == 0

    def start(self) -> str:
        self.init()
        self._grant_access()
        if not self.running():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.base / "server.log",
                      "-w", "-t", "60", "start")
        self._provision()
        return self.url()

    def stop(self) -> None:
        if self.data.exists() and self.running():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.base / "server.log",
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
        (self.base / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.base / "server.log",
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

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self, password: str = PASSWORD, database: str = DATABASE) -> str:
        return f"postgresql://{ROLE}:{password}@127.0.0.1:{self.port}/{database}"

    def serializable_url(self, password: str = PASSWORD) -> str:
        """The URL of a database whose transactions default to SERIALIZABLE."""
        return self.url(password, SERIALIZABLE_DATABASE)

    def admin_dsn(self, database: str = DATABASE) -> str:
        return f"host={self.base} port={self.port} user=postgres dbname={database}"

    def sql(self, statement: str, database: str = DATABASE) -> list[tuple[object, ...]]:
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
            self.sql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'", "postgres")
            self.sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}", "postgres")
            self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if not self.sql("SELECT 1 FROM pg_database WHERE datname = "
                        f"'{SERIALIZABLE_DATABASE}'", "postgres"):
            self.sql(f"CREATE DATABASE {SERIALIZABLE_DATABASE} OWNER {ROLE}", "postgres")
            self.sql(f"ALTER DATABASE {SERIALIZABLE_DATABASE}"
                     " SET default_transaction_isolation = 'serializable'", "postgres")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop", "destroy"):
        print(__doc__, file=sys.stderr)
        return 2
    server = LocalPostgres(argv[1])
    if argv[0] == "start":
        print(server.start())
    elif argv[0] == "stop":
        server.stop()
    else:
        server.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
