"""Running the catalog: `tsoracle catalog serve` in the foreground, or `start()` on a thread of
its own (the demo and tests serve it in-process beside Spark)."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

import uvicorn
from prometheus_client import start_http_server

from tsoracle.catalog import idempotency, state
from tsoracle.catalog.app import MAX_BODY, build_app
from tsoracle.catalog.metadata import Warehouse
from tsoracle.catalog.ordering import DEFAULT_RETENTION_S, Ordering
from tsoracle.catalog.service import Catalog
from tsoracle.errors import ConfigError, OracleUnavailable
from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.redact import names_a_secret, password_forms, redact_texts
from tsoracle.store import parse_url

T = TypeVar("T")

log = logging.getLogger("tsoracle.catalog")
MAX_CONCURRENT_REQUESTS = 1024


class _Unaddressed(logging.Filter):
    """Keeps the database's address out of the log lines its driver writes (psycopg's pool
    logs every failed connection attempt with host and port)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        parsed = parse_url(url)
        self.secrets = [s for s in (parsed.safe, parsed.host, *password_forms(url)) if s]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        hidden = redact_texts(text, self.secrets, mark="<hidden>")
        hidden = re.sub(r"\bport \d+", "port <hidden>", hidden)
        if hidden != text:
            record.msg, record.args = hidden, ()
        return True


@dataclass(frozen=True)
class CatalogConfig:
    url: str  # the oracle's database (its schema holds the catalog's rows too)
    warehouse: str
    host: str = "127.0.0.1"
    port: int = 8181
    timeline: str = EPOCH_MILLISECONDS
    token: str | None = None
    max_body: int = MAX_BODY
    allowed_locations: tuple[str, ...] = ()  # roots besides the warehouse tables may live under
    io_properties: tuple[tuple[str, str], ...] = ()  # FileIO settings (s3.endpoint, ...)
    metrics_port: int | None = None  # serve /metrics (the catalog's and the oracle's) here
    # Snapshot expiry (remove-snapshots, from any engine) keeps every snapshot a read at a
    # timestamp handed out within the last this many seconds needs (--retention).
    retention_s: float = DEFAULT_RETENTION_S
    # How long a client may retry with one Idempotency-Key (--idempotency-key-lifetime).
    key_lifetime_s: int = idempotency.DEFAULT_LIFETIME_S


def parse_io_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--io-property {text!r} is not KEY=VALUE (for example "
                          "s3.endpoint=http://minio:9000)")
    if names_a_secret(key):
        raise ConfigError(f"--io-property {key.strip()} would put a secret on the command line, "
                          "where process lists and pod specs show it: give credentials in "
                          "the environment the FileIO reads (AWS_ACCESS_KEY_ID, "
                          "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN for S3)")
    return key.strip(), value


def read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read --token-file {path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty; put the bearer token in it")
    return token


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say TCP, and
    # with Nagle on, a kept-alive client waited ~40 ms per reply for its own delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another "
                          "--host or --port (--port 0 picks a free one)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def serve(config: CatalogConfig, on_ready: Callable[[str], None],
                stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or the process is interrupted); `on_ready(url)` once the
    catalog accepts requests."""
    if not config.warehouse:
        raise ConfigError("--warehouse is required: where tables' files go (a file:// path, "
                          "or an s3:// URI)")
    warehouse = Warehouse(config.warehouse, dict(config.io_properties),
                          allowed=config.allowed_locations)
    scrub = _Unaddressed(config.url)
    sock = _listen(config.host, config.port)
    ordering: Ordering | None = None
    try:
        metrics = None if config.metrics_port is None else \
            _serve_metrics(config.host, config.metrics_port)
    except BaseException:
        sock.close()
        raise
    drivers = [logging.getLogger(name) for name in ("psycopg", "psycopg.pool")]
    for driver in drivers:
        driver.addFilter(scrub)
    try:
        backend = await _without_address(config.url, open_instrumented_backend(config.url,
                                                                               "catalog"))
    except BaseException:
        sock.close()
        _stop_metrics(metrics)
        for driver in drivers:
            driver.removeFilter(scrub)
        raise
    try:
        if not 0 <= config.retention_s <= 10 * 365 * 86400:
            raise ConfigError(f"--retention {config.retention_s:g} is not a number of seconds "
                              "from 0 to ten years")
        if not 1 <= config.key_lifetime_s <= idempotency.MAX_LIFETIME_S:
            raise ConfigError(f"--idempotency-key-lifetime {config.key_lifetime_s} is not a "
                              "number of seconds from 1 to 7 days (604800)")
        ordering = Ordering(config.url, config.timeline, backend,
                            cleanup=lambda files: asyncio.to_thread(warehouse.delete, files),
                            retention_s=config.retention_s,
                            keys_kept_s=config.key_lifetime_s + idempotency.GRACE_S)
        # An uninitialised oracle or timeline fails here, before anything is served.
        await _without_address(config.url, ordering.oracle.current())
        try:
            await state.ensure(backend, config.timeline)
        except state.OtherTimeline as exc:
            raise ConfigError(
                f"the catalog's tables in this schema are ordered by the timeline "
                f"{exc.timeline!r}, not {config.timeline!r}: serve them with --timeline "
                f"{exc.timeline} (two timelines on one set of tables would break the cut "
                "guarantee), or give this catalog a schema of its own") from None
        catalog = Catalog(backend, ordering, warehouse)
        await catalog.record_locations()
        app = build_app(catalog, token=config.token, max_body=config.max_body,
                        key_lifetime_s=config.key_lifetime_s)
        # At most this many requests at once (beyond them: 503 at once), so that a flood of
        # slow connections cannot take every file descriptor from the clients behind them.
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                               access_log=False,
                                               limit_concurrency=MAX_CONCURRENT_REQUESTS))
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host

        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.01)
            on_ready(f"http://{shown}:{port}")

        async def stopper() -> None:
            if stop is not None:
                await stop.wait()
                server.should_exit = True

        tasks = [asyncio.create_task(announce()), asyncio.create_task(stopper())]
        try:
            await server.serve(sockets=[sock])
        finally:
            for t in tasks:
                t.cancel()
    finally:
        sock.close()
        _stop_metrics(metrics)
        if ordering is not None:
            await ordering.close()
        await backend.close()
        for driver in drivers:
            driver.removeFilter(scrub)


def _serve_metrics(host: str, port: int) -> WSGIServer:
    """/metrics on a thread of its own, bound before anything is served (a taken port is a
    bad flag, not a half-started catalog)."""
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port} ({exc.strerror}); choose "
                          "another --metrics-port") from None
    return server


def _stop_metrics(server: WSGIServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


async def _without_address(url: str, step: Awaitable[T]) -> T:
    """`step`, whose errors name neither the database's password nor its host: the catalog
    runs as a pod whose log is read widely (--url is the user's name for it)."""
    try:
        return await step
    except OracleUnavailable as exc:
        parsed = parse_url(url)
        text = redact_texts(str(exc), [parsed.safe, parsed.host, *password_forms(url)],
                            mark="<hidden>")
        raise OracleUnavailable(f"{text} (the database of --url; its address is not shown)") \
            from None


class RunningCatalog:
    """A catalog on a thread of its own; `url` once started, `close()` to stop it."""

    def __init__(self, config: CatalogConfig) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._main, args=(config,),
                                        name="tsoracle-catalog", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self, config: CatalogConfig) -> None:
        def ready(url: str) -> None:
            self.url = url
            self._ready.set()

        try:
            self._loop.run_until_complete(serve(config, ready, self._stop))
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=30)

    def __enter__(self) -> RunningCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(config: CatalogConfig) -> RunningCatalog:
    return RunningCatalog(config)
