"""What the operator's log says: one line per event, naming the resource as `namespace/name`,
and the API server's expected answers while it starts told as such, not as errors.

Lines about a resource start with `<namespace>/<name>: ` (grep for it). Nothing here may carry
the backend URL: callers pass messages that went through `redact` already.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

import urllib3
from kubernetes.client.exceptions import ApiException

from tsoracle.operator.redact import redact_addresses

# While the operator is this young, an API server that answers 429/503 or refuses connections
# is one still starting (the operator is usually started with it): INFO. Later it is an outage:
# WARNING. Neither is an error: the request is retried.
START_UP_S = 60.0
TRANSIENT_STATUSES = (429, 503, 504)

_started = time.monotonic()


def starting_up() -> bool:
    return time.monotonic() - _started < START_UP_S


@dataclass
class Story:
    """What this process has told about one resource, so each event is logged once."""

    ref: str  # namespace/name
    degraded: str | None = None  # the reason last logged; None before this process's first pass
    api_failing: bool = False

    def degraded_now(self, log: logging.Logger, reason: str, message: str,
                     published: str) -> None:
        """Log a new or changed Degraded reason once, and its clearing once. `published` is the
        reason the status carried before this process looked (a restarted operator logs the
        state it finds, and a recovery from a state an earlier process published)."""
        first = self.degraded is None
        previous = published if self.degraded is None else self.degraded
        if reason and (first or reason != previous):
            log.warning("%s: degraded (%s): %s", self.ref, reason, message)
        elif reason:
            log.debug("%s: still degraded (%s): %s", self.ref, reason, message)
        elif previous:
            log.info("%s: recovered (was %s)", self.ref, previous)
        self.degraded = reason


def _body_message(body: object) -> str:
    if not isinstance(body, str | bytes | bytearray):
        return ""  # no body, or one the API client did not read
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return ""


def describe_api_error(exc: BaseException) -> str:
    """A short reason for a failed Kubernetes client call: `429 storage is (re)initializing`,
    `connection refused`; never the request's body."""
    if isinstance(exc, ApiException):
        message = _body_message(exc.body) or str(exc.reason or "")
        return f"{exc.status} {message}".strip()
    text = str(exc)
    if "refused" in text.lower():
        return "connection refused"
    if isinstance(exc, (TimeoutError, urllib3.exceptions.TimeoutError)) or "timed out" in text:
        return "timed out"
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """An answer a starting or restarting API server gives, worth retrying quietly."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUSES or not exc.status  # 0: no HTTP answer at all
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


# kopf's own API client (aiohttp) logs every retried request at ERROR, e.g.
# `Request attempt #1/9 failed; will retry: GET https://…/apis/… -> APITooManyRequestsError(…)`.
_KOPF_RETRY = re.compile(r"^Request attempt #\S+ failed; will retry: (?P<method>[A-Z]+) "
                         r"(?P<url>\S+) -> (?P<exc>.*)$", re.DOTALL)
_KOPF_API_ERROR = re.compile(r"^(?P<type>\w+)\((?P<q>['\"])(?P<message>.*?)(?P=q),.*"
                             r"status=(?P<status>\d+)\)$", re.DOTALL)
_KOPF_CONNECTION = {"ClientConnectorError": "connection refused",
                    "ServerDisconnectedError": "server disconnected",
                    "ClientConnectionResetError": "connection reset",
                    "ClientOSError": "connection reset", "ServerTimeoutError": "timed out",
                    "ConnectionTimeoutError": "timed out", "TimeoutError": "timed out"}


def describe_kopf_retry(message: str, forbidden_too: bool = False) -> tuple[str, str] | None:
    """(reason, `METHOD /path`) when `message` is kopf retrying an answer a starting API
    server gives; None for anything else, which stays as kopf logged it. `forbidden_too`: a
    403 counts as one (while the server's RBAC authorizer is still loading its roles)."""
    m = _KOPF_RETRY.match(message)
    if m is None:
        return None
    # The API server's address and the query (resourceVersion, timeouts) add nothing.
    path, _, query = re.sub(r"^\w+://[^/]+", "", m["url"]).partition("?")
    path += " (watch)" if "watch=true" in query else ""
    exc = m["exc"]
    api = _KOPF_API_ERROR.match(exc)
    if api is not None:
        status = int(api["status"])
        if status not in TRANSIENT_STATUSES and not (forbidden_too and status == 403):
            return None  # 500, a 403 after start-up, ...: a real error
        return f"{api['status']} {api['message']}", f"{m['method']} {path}"
    name = exc.split("(", 1)[0]
    if name not in _KOPF_CONNECTION:
        return None
    reason = "connection refused" if "refused" in exc.lower() else _KOPF_CONNECTION[name]
    return reason, f"{m['method']} {path}"


class KopfLogs(logging.Filter):
    """Tells kopf's expected retries for what they are: an API server that is starting (INFO)
    or briefly away (WARNING) instead of ERROR; `TemporaryError`s our handlers raise (each
    after logging its own line) only at DEBUG. Real errors pass unchanged."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "tsoracle_told", False) or not record.name.startswith("kopf"):
            return True
        record.tsoracle_told = True
        message = record.getMessage()
        young = starting_up()
        retry = describe_kopf_retry(message, forbidden_too=young) \
            if record.levelno >= logging.ERROR else None
        if retry is not None:
            reason, request = retry
            if young:
                text, level = f"API server not ready yet ({reason}); retrying {request}", \
                    logging.INFO
            else:
                text, level = f"API server unavailable ({reason}); retrying {request}", \
                    logging.WARNING
            record.msg, record.args = text, None
            record.levelno, record.levelname = level, logging.getLevelName(level)
        elif record.levelno >= logging.ERROR and "failed temporarily: " in message \
                and " but will " not in message:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.verbose
        return True


# Loggers whose records may name the database server: psycopg and its pool (connection failures,
# a connection's repr) and the library's provisioning (a driver's reason it quotes).
ADDRESS_LOGGERS = ("psycopg", "psycopg.pool", "tsoracle.store.schema")


class _RedactAddresses(logging.Filter):
    """Keep the database server's address out of a record (a filter on a logger sees only the
    records logged there, not its children's: each logger of ADDRESS_LOGGERS gets one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_addresses(record.getMessage())
        record.args = None
        return True


class _Urllib3Retries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Retrying (")


def install(verbose: bool) -> None:
    """Keep server addresses out of psycopg's logs and the library's; quiet kopf's per-handler
    chatter (`Handler 'spec_changed/spec' succeeded.`, `Activity 'configure' succeeded.`) unless
    verbose, and put KopfLogs where kopf's records pass: on `kopf.objects` (before its Event
    poster sees them) and on the root handlers (the rest)."""
    for name in ADDRESS_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactAddresses) for f in logger.filters):
            logger.addFilter(_RedactAddresses())
    if not verbose:
        for name in ("kopf.objects", "kopf.activities", "kopf._core.engines.activities"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # urllib3 (under the kubernetes client) warns about each of its 3 reconnects; the
        # reconcile loop and the Lease say once that a call failed.
        pool = logging.getLogger("urllib3.connectionpool")
        if not any(isinstance(f, _Urllib3Retries) for f in pool.filters):
            pool.addFilter(_Urllib3Retries())
    targets: list[logging.Filterer] = [logging.getLogger("kopf.objects"),
                                       *logging.getLogger().handlers]
    for target in targets:
        if not any(isinstance(f, KopfLogs) for f in target.filters):
            target.addFilter(KopfLogs(verbose))
