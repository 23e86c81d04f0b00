"""A TCP relay that adds a fixed delay to every byte, to benchmark against a distant backend.

    python -m tsoracle.latency HOST:PORT --delay-ms 5      # prints the port it listens on

Every chunk the client sends reaches the server `delay` later; replies come back at once, so the
round trip grows by `delay` (the kernel here has no `netem`). Chunks keep their order and are
not held back by one another: a pipelined client still sees one round trip per call. A thread
per direction sleeps with the OS clock (asyncio's timers round up to whole milliseconds).
"""

from __future__ import annotations

import argparse
import collections
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from tsoracle.errors import ConfigError


def _pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = threading.Condition()
    closed = False

    def receive() -> None:
        nonlocal closed
        try:
            while chunk := src.recv(65536):
                with ready:
                    queue.append((time.monotonic() + delay_s, chunk))
                    ready.notify()
        except OSError:
            pass
        with ready:
            closed = True
            ready.notify()

    threading.Thread(target=receive, daemon=True).start()
    try:
        while True:
            with ready:
                while not queue and not closed:
                    ready.wait()
                if not queue:
                    break
                due, chunk = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):  # either side gone: the connection is over for both pumps
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def serve(target: tuple[str, int], delay_s: float, listener: socket.socket) -> None:
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(target)
        except OSError:
            client.close()  # the server is down: this client sees a closed connection
            continue
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(client, server, delay_s), daemon=True).start()
        threading.Thread(target=_pump, args=(server, client, 0.0), daemon=True).start()


@contextmanager
def relayed(url: str, delay_ms: float) -> Iterator[str]:
    """`url` with its host and port replaced by a relay adding `delay_ms` (a process of its
    own, so the relay's threads do not compete with the caller's event loop)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ConfigError("--backend-latency-ms needs a postgresql:// URL with a host "
                          "(SQLite has no round trip to lengthen)")
    target = f"{parts.hostname}:{parts.port or 5432}"
    relay = subprocess.Popen([sys.executable, "-m", "tsoracle.latency", target,
                              "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        port = int(relay.stdout.readline())
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        relay.terminate()
        relay.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tsoracle.latency", description=__doc__)
    p.add_argument("target", metavar="HOST:PORT", help="the server to relay to")
    p.add_argument("--delay-ms", type=float, required=True, help="added to every round trip")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    args = p.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    if not host or not port.isdigit() or args.delay_ms < 0:
        p.error("give HOST:PORT and a --delay-ms of 0 or more")
    listener = socket.create_server(("127.0.0.1", args.port))
    print(listener.getsockname()[1], flush=True)
    try:
        serve((host, int(port)), args.delay_ms / 1000, listener)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
