"""A TCP relay to PostgreSQL that can lose the reply to a COMMIT, or cut every connection.

Armed, it forwards everything, but when the server's answer carries the CommandComplete message
of a COMMIT it closes both sides instead of delivering it: the transaction is durable on the
server, and the client sees its connection drop (an ambiguous commit, as after a network fault
or a failover). Runs its own event loop in a thread, so synchronous and asynchronous tests can
use it alike.
"""

from __future__ import annotations

import asyncio
import threading
import time

# CommandComplete ('C'), length 11 (4 + len("COMMIT\0")), tag "COMMIT".
COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class LostCommitReply:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.armed = 0  # how many COMMIT replies still to lose
        self.lost = 0
        self.down_until = 0.0
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
        assert host_port in database_url, database_url
        return database_url.replace(host_port, f"127.0.0.1:{self.port}")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

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

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       from_server: bool) -> None:
            try:
                while data := await src.read(65536):
                    if from_server and self.armed and COMMIT_DONE in data:
                        self.armed -= 1
                        self.lost += 1
                        for w in (writer, up_w):
                            w.transport.abort()
                        return
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))
        finally:
            self._open.difference_update((writer, up_w))

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            for w in list(self._open):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
