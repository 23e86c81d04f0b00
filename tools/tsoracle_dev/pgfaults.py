"""CockroachDB's failure shape on a real PostgreSQL: injected retry errors and lost replies.

CockroachDB may answer any statement with SQLSTATE 40001 (retry), and a commit may be
ambiguous: applied on the server, its reply lost with the connection. No CockroachDB runs on
these machines, so both are made here on a real server:

- `SerializationFaults` puts a row-level security policy on tsoracle's tables whose check
  raises 40001 for a chosen fraction of the rows a statement reads or writes. It runs before
  the row is returned or changed, so a failed statement applied nothing. The superuser (this
  module's own connection) bypasses row security, so checks and setup are never failed.
- `LossyRelay` is a TCP relay that lets the server finish a statement and then, for a chosen
  fraction of replies (or the next N COMMIT replies), closes both connections instead of
  delivering the reply. It holds each reply until its ReadyForQuery, which suits the oracle's
  statements; COPY and pipelined fetches would wait forever, and TLS sessions pass through
  without faults (they cannot be parsed).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

FAULT_SCHEMA = "tsoracle_faults"
# CommandComplete ('C'), length 11 (4 + len("COMMIT\0")), tag "COMMIT".
COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"
SSL_REQUEST = (80877103).to_bytes(4, "big")  # request codes, after the 4-byte length
GSSENC_REQUEST = (80877104).to_bytes(4, "big")


class SerializationFaults:
    """Make `rate` of the rows tsoracle's statements touch fail with 40001, server-side."""

    def __init__(self, pg: Any, database: str, role: str = "tsoracle") -> None:
        self.pg = pg  # a tsoracle_dev.localpg.LocalPostgres
        self.database = database
        self.pg.sql(
            f"CREATE SCHEMA IF NOT EXISTS {FAULT_SCHEMA};"
            f" CREATE TABLE IF NOT EXISTS {FAULT_SCHEMA}.settings"
            " (id INTEGER PRIMARY KEY, rate FLOAT8 NOT NULL);"
            f" INSERT INTO {FAULT_SCHEMA}.settings VALUES (1, 0) ON CONFLICT DO NOTHING;"
            f" CREATE OR REPLACE FUNCTION {FAULT_SCHEMA}.maybe_fail() RETURNS BOOLEAN"
            " LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$ BEGIN"
            f" IF random() < (SELECT rate FROM {FAULT_SCHEMA}.settings WHERE id = 1) THEN"
            " RAISE EXCEPTION 'could not serialize access (injected by tsoracle tests)'"
            " USING ERRCODE = 'serialization_failure'; END IF; RETURN TRUE; END $$;"
            f" GRANT USAGE ON SCHEMA {FAULT_SCHEMA} TO {role};"
            f" GRANT EXECUTE ON FUNCTION {FAULT_SCHEMA}.maybe_fail() TO {role}",
            database,
        )

    def install(self, schema: str, tables: tuple[str, ...] = ("timestamps", "deployment")) -> None:
        """Put the policy on `schema`'s tables (again after they were dropped and re-made)."""
        for table in tables:
            name = f'"{schema}"."{table}"'
            self.pg.sql(
                f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY;"
                f" ALTER TABLE {name} FORCE ROW LEVEL SECURITY;"
                f" DROP POLICY IF EXISTS tsoracle_fault ON {name};"
                f" CREATE POLICY tsoracle_fault ON {name}"
                f" USING ({FAULT_SCHEMA}.maybe_fail()) WITH CHECK (TRUE)",
                self.database,
            )

    def set_rate(self, rate: float) -> None:
        self.pg.sql(f"UPDATE {FAULT_SCHEMA}.settings SET rate = {float(rate)!r} WHERE id = 1",
                    self.database)


class LossyRelay:
    """A relay to PostgreSQL that loses replies after the server applied the statement.

    `rate`: the fraction of replies carrying a CommandComplete that are lost. `arm(n)`: lose the
    next n COMMIT replies. `cut(s)`: drop every connection and refuse new ones for s seconds.
    Runs its own event loop in a thread, so synchronous and asynchronous callers can use it.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1",
                 rate: float = 0.0, seed: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.rate = rate
        self.armed = 0
        self.lost = 0
        self.delivered = 0
        self.down_until = 0.0
        self._rng = random.Random(seed)
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0
        self._thread.start()
        self._ready.wait(10)

    def arm(self, times: int = 1) -> None:
        self.armed = times

    def cut(self, seconds: float) -> None:
        """An outage: drop every connection now and refuse new ones for `seconds`."""
        self.down_until = time.monotonic() + seconds
        for w in list(self._open):
            self._loop.call_soon_threadsafe(w.transport.abort)

    def url(self, database_url: str) -> str:
        host_port = f"{self.target[0]}:{self.target[1]}"
        if host_port not in database_url:  # (the URL holds a password: not echoed)
            raise ValueError(f"the URL does not point at {host_port}, the relay's target")
        return database_url.replace(host_port, f"127.0.0.1:{self.port}")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _lose(self, reply: bytes, completed: bool) -> bool:
        if self.armed and COMMIT_DONE in reply:
            self.armed -= 1
            return True
        return self.rate > 0 and completed and self._rng.random() < self.rate

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.down_until:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_w))
        asked = asyncio.get_running_loop().create_future()  # the client's first request

        async def upstream() -> None:
            try:
                while data := await reader.read(65536):
                    if not asked.done():
                        asked.set_result(data[4:8] in (SSL_REQUEST, GSSENC_REQUEST))
                    up_w.write(data)
                    await up_w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                if not asked.done():
                    asked.set_result(False)
                up_w.close()

        async def downstream() -> None:
            # Start-up and authentication pass message by message; from the first
            # ReadyForQuery on, whole replies are held back until theirs, then delivered or
            # lost. An encrypted session passes untouched (and loses nothing): it cannot be
            # parsed.
            encrypted = False
            try:
                if await asked:  # the answer to SSLRequest / GSSENCRequest is one byte
                    answer = await up_r.readexactly(1)
                    writer.write(answer)
                    encrypted = answer in (b"S", b"G")
                if encrypted:
                    while data := await up_r.read(65536):
                        writer.write(data)
                        await writer.drain()
                    return
                started = False
                reply = _Reply()
                while data := await up_r.read(65536):
                    for kind, message in reply.feed(data):
                        if not started:
                            writer.write(message)
                            started = kind == b"Z"
                            continue
                        reply.hold(kind, message)
                        if kind != b"Z":
                            continue
                        held, completed = reply.take()
                        if self._lose(held, completed):
                            self.lost += 1
                            for w in (writer, up_w):
                                w.transport.abort()
                            return
                        self.delivered += 1
                        writer.write(held)
                    await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        try:
            await asyncio.gather(upstream(), downstream())
        finally:
            self._open.difference_update((writer, up_w))

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            for w in list(self._open):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            # Aborted, the relays end on their own; one cancelled in its stream's callback
            # would print its CancelledError (asyncio reports a connection handler's end).
            _, stuck = await asyncio.wait(tasks, timeout=1) if tasks else (set(), set())
            for t in stuck:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


class _Reply:
    """Splits the server's byte stream into messages, and holds one reply's messages."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._held: list[bytes] = []
        self._completed = False

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The complete (type, message) pairs that `data` finishes, in order."""
        self._buf += data
        out, at = [], 0
        while len(self._buf) - at >= 5:
            end = at + 1 + int.from_bytes(self._buf[at + 1:at + 5], "big")
            if end > len(self._buf):
                break
            out.append((bytes(self._buf[at:at + 1]), bytes(self._buf[at:end])))
            at = end
        del self._buf[:at]
        return out

    def hold(self, kind: bytes, message: bytes) -> None:
        self._held.append(message)
        self._completed = self._completed or kind == b"C"  # CommandComplete

    def take(self) -> tuple[bytes, bool]:
        """The held reply, and whether a statement in it ran to completion."""
        reply, completed = b"".join(self._held), self._completed
        self._held, self._completed = [], False
        return reply, completed
