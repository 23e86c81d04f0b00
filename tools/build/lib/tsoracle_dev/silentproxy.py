"""A TCP proxy on loopback that can go silent without closing anything.

What a client sees when the server it talks to vanishes behind a load balancer or a NAT entry
expires: its connections stay open, its bytes are taken, and no answer ever comes. No RST, no
FIN, so only the client's own timeouts end the wait. `silence()` does that to the connections
open now; new connections are forwarded as before (another API server replica answers), unless
`silence(new_connections=True)` makes the proxy an endpoint that accepts and never answers.

    proxy = SilentProxy("127.0.0.1", 6443).start()
    kubeconfig_via(admin_kubeconfig, tmp / "kubeconfig", proxy.port)
    ...
    proxy.silence()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 65536


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    silent: bool = False


class SilentProxy:
    """Forwards 127.0.0.1:`port` to `host`:`target_port` from a thread of its own."""

    def __init__(self, host: str, target_port: int) -> None:
        self.host, self.target_port = host, target_port
        self.port = 0
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[Any]] = set()  # one per accepted connection
        self._new_silent = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="silentproxy")
        self._server: asyncio.Server | None = None

    def start(self) -> SilentProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def silence(self, *, new_connections: bool = False) -> int:
        """Stop forwarding on every connection open now, in both directions, and keep them
        open; returns how many. `new_connections`: accept new ones and silence them too."""
        async def go() -> int:
            self._new_silent = new_connections
            for link in self._links:
                link.silent = True
            return len(self._links)
        return self._call(go())

    def resume(self) -> None:
        """New connections are forwarded again; silenced ones stay silent (as after a real
        outage, the client must give up on them)."""
        async def go() -> None:
            self._new_silent = False
        self._call(go())

    def open_connections(self) -> int:
        async def go() -> int:
            return len(self._links)
        return self._call(go())

    def stop(self) -> None:
        async def go() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                self._close(link)
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._thread.is_alive():  # once: stop() may be called again
            self._call(go())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SilentProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(client=writer, silent=self._new_silent)
        self._links.add(link)
        me = asyncio.current_task()
        assert me is not None  # start_server runs each handler as a task
        self._handlers.add(me)
        try:
            if link.silent:
                # Accepted, never answered: no server connection at all.
                await self._pump(reader, None, link, from_client=True)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
            except OSError:
                return  # the target is down: the client sees its connection closed
            link.server = up_writer
            up = asyncio.create_task(self._pump(reader, up_writer, link, from_client=True))
            down = asyncio.create_task(self._pump(up_reader, writer, link, from_client=False))
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            self._close(link)
            self._links.discard(link)
            self._handlers.discard(me)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                    link: _Link, *, from_client: bool) -> None:
        """Copy until EOF; once silent, read and drop (the sender sees its bytes taken). The
        server's close is not passed on to a silenced client: that would end its wait."""
        while True:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            if link.silent or writer is None:
                continue
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                break
        if from_client:
            self._close(link)  # the client gave up: end the server's side too
        elif link.server is not None:
            link.server.close()
            if not link.silent:
                self._close(link)

    def _close(self, link: _Link) -> None:
        for w in (link.server, link.client):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.close()


def target_of(kubeconfig: Path) -> tuple[str, int]:
    """The API server's host and port in a kubeconfig (its first cluster)."""
    server = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    parsed = urllib.parse.urlsplit(server)
    return parsed.hostname or "127.0.0.1", parsed.port or 443


def kubeconfig_via(kubeconfig: Path, out: Path, port: int) -> Path:
    """A copy of `kubeconfig` (JSON, as the tests write them) whose clusters are reached
    through 127.0.0.1:`port`. The API server's certificate names 127.0.0.1, so TLS still
    verifies."""
    cfg = json.loads(kubeconfig.read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out
