"""HTTP: the REST catalog's routes (Apache Iceberg's REST catalog OpenAPI spec) on Starlette.

Every error leaves in the spec's error model (errors.py); a request the catalog cannot parse
is a 400 that says what was wrong, and nothing else ever shows a traceback to a client.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from pydantic import ValidationError
from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.table import CommitTableRequest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tsoracle.catalog import boundary, idempotency, state
from tsoracle.catalog.boundary import check_name, check_namespace
from tsoracle.catalog.errors import (
    BadRequest,
    CatalogError,
    Contended,
    NotAuthorized,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    no_table,
    no_view,
)
from tsoracle.catalog.metadata import to_json
from tsoracle.catalog.metrics import REQUESTS
from tsoracle.catalog.service import Catalog, Change, Loaded
from tsoracle.catalog.state import SEP
from tsoracle.errors import OracleError, Refused
from tsoracle.oracle.api import wall_clock_ms

log = logging.getLogger("tsoracle.catalog")
MAX_BODY = 16 * 1024 * 1024  # table metadata with many snapshots runs to megabytes, not more
LARGE_BODY = 64 * 1024  # a body above this is parsed and validated on a worker thread
BODY_TIMEOUT_S = 30  # a client that sends its body slower than this holds nothing longer

# As the spec lists them (`{prefix}` is empty here: the catalog has one warehouse).
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/register",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "POST /v1/{prefix}/tables/rename",
    "POST /v1/{prefix}/transactions/commit",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
    "POST /v1/{prefix}/namespaces/{namespace}/views",
    "POST /v1/{prefix}/namespaces/{namespace}/register-view",
    "GET /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/views/rename",
]

Handler = Callable[[Request], Awaitable[Response]]


# Mutations an Idempotency-Key makes safe to retry (idempotency.py); metrics reports and the
# oracle's own routes change nothing a retry could repeat.
KEYED = ("/v1/namespaces", "/v1/namespaces/{namespace}", "/v1/namespaces/{namespace}/properties",
         "/v1/namespaces/{namespace}/tables", "/v1/namespaces/{namespace}/tables/{table}",
         "/v1/namespaces/{namespace}/register", "/v1/tables/rename",
         "/v1/namespaces/{namespace}/views", "/v1/namespaces/{namespace}/register-view",
         "/v1/namespaces/{namespace}/views/{view}", "/v1/views/rename",
         "/v1/transactions/commit")
# Routes whose success has no body: a replay answers 204 whatever landed.
NO_CONTENT = ("/v1/tables/rename", "/v1/views/rename", "/v1/transactions/commit")


def build_app(catalog: Catalog, *, token: str | None = None, max_body: int = MAX_BODY,
              key_lifetime_s: int = idempotency.DEFAULT_LIFETIME_S) -> Any:
    api = _Api(catalog, max_body, key_lifetime_s)
    ns = "/v1/namespaces/{namespace}"
    routes = [
        Route("/v1/config", api.config, methods=["GET"]),
        Route("/v1/namespaces", api.namespaces, methods=["GET", "POST"]),
        Route(ns, api.namespace, methods=["GET", "HEAD", "DELETE"]),
        Route(ns + "/properties", api.properties, methods=["POST"]),
        Route(ns + "/tables", api.tables, methods=["GET", "POST"]),
        Route(ns + "/tables/{table}", api.table, methods=["GET", "HEAD", "POST", "DELETE"]),
        Route(ns + "/tables/{table}/metrics", api.metrics, methods=["POST"]),
        Route(ns + "/register", api.register, methods=["POST"]),
        Route("/v1/tables/rename", api.rename, methods=["POST"]),
        Route(ns + "/views", api.views, methods=["GET", "POST"]),
        Route(ns + "/register-view", api.register_view, methods=["POST"]),
        Route(ns + "/views/{view}", api.view, methods=["GET", "HEAD", "POST", "DELETE"]),
        Route("/v1/views/rename", api.rename_view, methods=["POST"]),
        Route("/v1/transactions/commit", api.transaction, methods=["POST"]),
        Route("/v1/tsoracle/read-ts", api.read_ts, methods=["POST"]),
        Route("/v1/tsoracle/closed", api.closed, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
    ]
    app = Starlette(routes=[
        Route(r.path, _guarded(api.keyed(r.endpoint, r.path) if r.path in KEYED else r.endpoint,
                               token, r.path), methods=r.methods)
        for r in routes])
    app.add_exception_handler(404, _not_found)
    app.add_exception_handler(405, _not_allowed)
    return _KeepEncodedSlashes(app)


def _guarded(endpoint: Callable[..., Any], token: str | None, route: str) -> Handler:
    expected = f"Bearer {token}".encode() if token else None

    async def handle(request: Request) -> Response:
        started = time.perf_counter()
        try:
            if expected is not None and route not in ("/healthz", "/readyz"):
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    raise NotAuthorized("a bearer token is required: the catalog's "
                                        "--token-file (the engine's `token` property)")
            response: Response = await endpoint(request)
        except CatalogError as exc:
            response = _error(exc)
        except Refused as exc:  # this request's data, refused by the database: its own error
            response = _error(Contended("a concurrent change took a name this request "
                                        "adds; load it and try again")
                              if exc.kind == "duplicate" else
                              BadRequest("the catalog's database refused this request's data; "
                                         "shorten or correct its names and properties"))
        except OracleError as exc:  # the database or the oracle, after their own retries
            log.warning("%s %s: %s", request.method, route, exc.__class__.__name__)
            response = _error(Unavailable("the catalog's database is unavailable; try again"))
        except OSError as exc:  # the warehouse (a file system, an object store) failed
            log.warning("%s %s: the warehouse failed: %s", request.method, route, exc)
            response = _error(Unavailable("the catalog could not read or write the warehouse; "
                                          "nothing was committed, try again (the catalog's "
                                          "log says why)"))
        except Exception:  # never a traceback to a client; the log has it
            log.exception("%s %s failed", request.method, route)
            response = JSONResponse({"error": {
                "message": "the catalog failed unexpectedly; its log says why",
                "type": "RuntimeException", "code": 500}}, status_code=500)
        REQUESTS.labels(route, str(response.status_code)).observe(
            time.perf_counter() - started)
        return response

    return handle


def _error(exc: CatalogError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(NotFound(f"no such endpoint: {request.method} {request.url.path}"))


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": {"message": f"{request.method} is not allowed on "
                                   f"{request.url.path}", "type": "BadRequestException",
                         "code": 405}}, status_code=405)


class _Api:
    def __init__(self, catalog: Catalog, max_body: int, key_lifetime_s: int) -> None:
        self.catalog = catalog
        self.max_body = max_body
        self.key_lifetime_s = key_lifetime_s
        self.in_flight = idempotency.InFlight()

    async def config(self, request: Request) -> Response:
        return JSONResponse({"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS,
                             "idempotency-key-lifetime":
                                 idempotency.lifetime_text(self.key_lifetime_s)})

    def keyed(self, endpoint: Handler, route: str) -> Handler:
        """`endpoint`, answering a mutation that carries an Idempotency-Key once."""
        async def handle(request: Request) -> Response:
            header = request.headers.get("idempotency-key")
            if header is None or request.method not in ("POST", "DELETE"):
                return await endpoint(request)
            key = idempotency.parse_key(header)
            raw = await self._raw(request) if request.method == "POST" else b""
            mark = idempotency.Mark(
                key, idempotency.fingerprint(request.method, request.url.path,
                                             request.url.query, raw),
                wall_clock_ms() - (self.key_lifetime_s + idempotency.GRACE_S) * 1000)
            async with self.in_flight.one(key):
                replay = await self._replay(request, route, mark)
                if replay is not None:
                    return replay
                return await self._first(endpoint, request, route, mark)

        return handle

    async def _first(self, endpoint: Handler, request: Request, route: str,
                     mark: idempotency.Mark) -> Response:
        """Serve a key's first request, and record its answer if that is final."""
        error: CatalogError | None = None
        token = idempotency.CURRENT.set(mark)
        try:
            response = await endpoint(request)
        except idempotency.KeyTaken:
            # Another replica landed a request with this key meanwhile: its answer.
            replay = await self._replay(request, route, mark)
            if replay is None:
                raise
            return replay
        except CatalogError as exc:
            response, error = _error(exc), exc
        finally:
            idempotency.CURRENT.reset(token)
        if not idempotency.final(response.status_code, error):
            return response
        if error is None:
            await self._record(mark, response)
            return response
        # A refusal may be a copy of this request failing on what another copy landed (its
        # name now taken, its table moved): that copy's answer, if one landed, else this one.
        await self._record(mark, response, refusal=True)
        return await self._replay(request, route, mark) or response

    async def _record(self, mark: idempotency.Mark, response: Response,
                      refusal: bool = False) -> None:
        body = bytes(response.body)
        try:
            await state.answer_key(self.catalog.backend, mark.key, mark.fingerprint,
                                   response.status_code,
                                   body.decode() if len(body) <= idempotency.MAX_KEPT_BODY
                                   else None, wall_clock_ms(), mark.expired_ms, refusal)
        except OracleError as exc:  # the answer still goes out; a replay rebuilds it
            log.warning("recording an Idempotency-Key's answer failed: %s",
                        exc.__class__.__name__)

    async def _replay(self, request: Request, route: str, mark: idempotency.Mark
                      ) -> Response | None:
        """The answer recorded for `mark`'s key, or None if the key is new (or expired)."""
        found = await state.stored_key(self.catalog.backend, mark.key, mark.expired_ms)
        if found is None:
            return None
        stored = idempotency.Stored(*found)
        idempotency.check(stored, mark)
        status, body = stored.status, stored.body
        if status == 204:
            return Response(status_code=204)
        if status is None or body is None:  # its answer lost with its server, or too big
            return await self._rebuilt(request, route)
        return Response(body, status_code=status, media_type="application/json")

    async def _rebuilt(self, request: Request, route: str) -> Response:
        """The answer of a request that landed without its answer recorded: 204, or the
        object as it is now (the spec allows a replay to show a newer state)."""
        if request.method == "DELETE" or route in NO_CONTENT:
            return Response(status_code=204)
        body = await self._json(request)
        if route == "/v1/namespaces":
            ns = check_namespace(_strings(body.get("namespace"), "namespace"))
            return JSONResponse({"namespace": list(ns),
                                 "properties": await self.catalog.load_namespace(ns)})
        ns = _ns(request)
        if route.endswith("/tables/{table}"):  # a commit's answer, as `table` gives it
            done = await self.catalog.load_table(ns, _param(request, "table"))
            return JSONResponse({"metadata-location": done.metadata_location,
                                 "metadata": _metadata(done)})
        if route.endswith("/views/{view}"):
            return _view(*await self.catalog.load_view(ns, _param(request, "view")))
        name = check_name(str(body.get("name", "")))
        if route.endswith(("/views", "/register-view")):
            return _view(*await self.catalog.load_view(ns, name))
        return _loaded(await self.catalog.load_table(ns, name))

    async def healthz(self, request: Request) -> Response:
        """Alive: the process answers (a restart would not fix the database)."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready: the database answers and this replica may take timestamps."""
        await self.catalog.ordering.closed()
        await self.catalog.ordering.ready()
        return JSONResponse({"status": "ready"})

    async def namespaces(self, request: Request) -> Response:
        if request.method == "POST":
            body = await self._json(request)
            ns = check_namespace(_strings(body.get("namespace"), "namespace"))
            props = _properties(body.get("properties"))
            await self.catalog.create_namespace(ns, props)
            return JSONResponse({"namespace": list(ns), "properties": props})
        parent_text = request.query_params.get("parent")
        parent = check_namespace(parent_text.split(SEP)) if parent_text else None
        found = [list(n) for n in await self.catalog.list_namespaces(parent)]
        page, token = _page(request, found, lambda n: SEP.join(n))
        return JSONResponse({"namespaces": page, **token})

    async def namespace(self, request: Request) -> Response:
        ns = _ns(request)
        if request.method == "DELETE":
            await self.catalog.drop_namespace(ns)
            return Response(status_code=204)
        props = await self.catalog.load_namespace(ns)
        if request.method == "HEAD":
            return Response(status_code=204)
        return JSONResponse({"namespace": list(ns), "properties": props})

    async def properties(self, request: Request) -> Response:
        body = await self._json(request)
        removals = _strings(body.get("removals") or [], "removals", allow_empty=True)
        updates = _properties(body.get("updates"))
        return JSONResponse(await self.catalog.update_namespace(_ns(request), removals, updates))

    async def tables(self, request: Request) -> Response:
        ns = _ns(request)
        if request.method == "POST":
            body = await self._json(request)
            for key in ("location", "partition-spec", "write-order"):
                body.setdefault(key, None)
            created = await self.catalog.create_table(
                ns, await _parse(CreateTableRequest, body, "create-table request"))
            return _loaded(created)
        return await _identifiers(request, ns, self.catalog.list_tables)

    async def table(self, request: Request) -> Response:
        ns, name = _ns(request), check_name(_param(request, "table"))
        if request.method == "DELETE":
            purge = request.query_params.get("purgeRequested", "false").lower() == "true"
            await self.catalog.drop_table(ns, name, purge)
            return Response(status_code=204)
        if request.method == "HEAD":
            if not await self.catalog.table_exists(ns, name):
                raise no_table((*ns, name))
            return Response(status_code=204)
        if request.method == "POST":
            body = await self._json(request)
            body["identifier"] = {"namespace": list(ns), "name": name}
            commit = await _parse(CommitTableRequest, body, "commit request")
            [done] = await self.catalog.commit([_change(commit)])
            return JSONResponse({"metadata-location": done.metadata_location,
                                 "metadata": _metadata(done)})
        return _loaded(await self.catalog.load_table(ns, name))

    async def metrics(self, request: Request) -> Response:
        await self._json(request)  # accepted and dropped: engines report scans and commits here
        return Response(status_code=204)

    async def register(self, request: Request) -> Response:
        body = await self._json(request)
        body.setdefault("overwrite", False)
        registered = await self.catalog.register_table(
            _ns(request), await _parse(RegisterTableRequest, body, "register request"))
        return _loaded(registered)

    async def rename(self, request: Request) -> Response:
        body = await self._json(request)
        source, dest = _identifier(body.get("source")), _identifier(body.get("destination"))
        await self.catalog.rename_table(source[0], source[1], dest[0], dest[1])
        return Response(status_code=204)

    async def transaction(self, request: Request) -> Response:
        body = await self._json(request)
        changes = body.get("table-changes")
        if not isinstance(changes, list) or not changes:
            raise BadRequest("a transaction needs `table-changes`: a non-empty list of commits")
        parsed = []
        if len(changes) > boundary.MAX_TABLE_CHANGES:
            raise BadRequest(f"a transaction changes at most {boundary.MAX_TABLE_CHANGES} "
                             "tables")
        for change in changes:
            if not isinstance(change, dict) or not isinstance(change.get("identifier"), dict):
                raise BadRequest("each of `table-changes` needs an `identifier`")
            parsed.append(_change(await _parse(CommitTableRequest,
                                                _part(change, body),
                                                "table change")))
        await self.catalog.commit(parsed)
        return Response(status_code=204)

    async def views(self, request: Request) -> Response:
        ns = _ns(request)
        if request.method == "POST":
            body = await self._json(request)
            return _view(*await self.catalog.create_view(ns, body))
        return await _identifiers(request, ns, self.catalog.list_views)

    async def register_view(self, request: Request) -> Response:
        body = await self._json(request)
        return _view(*await self.catalog.register_view(_ns(request), body))

    async def view(self, request: Request) -> Response:
        ns, name = _ns(request), check_name(_param(request, "view"))
        if request.method == "DELETE":
            await self.catalog.drop_view(ns, name)
            return Response(status_code=204)
        if request.method == "HEAD":
            if not await self.catalog.view_exists(ns, name):
                raise no_view((*ns, name))
            return Response(status_code=204)
        if request.method == "POST":
            body = await self._json(request)
            requirements, updates = body.get("requirements") or [], body.get("updates") or []
            if not isinstance(requirements, list) or not isinstance(updates, list) or not all(
                    isinstance(x, dict) for x in [*requirements, *updates]):
                raise BadRequest("`requirements` and `updates` must be lists of objects")
            return _view(*await self.catalog.replace_view(ns, name, requirements, updates))
        return _view(*await self.catalog.load_view(ns, name))

    async def rename_view(self, request: Request) -> Response:
        body = await self._json(request)
        source, dest = _identifier(body.get("source")), _identifier(body.get("destination"))
        await self.catalog.rename_view(source[0], source[1], dest[0], dest[1])
        return Response(status_code=204)

    async def read_ts(self, request: Request) -> Response:
        ts = await self.catalog.ordering.read_ts()
        return JSONResponse({"timeline": self.catalog.ordering.timeline, "read-ts": ts})

    async def closed(self, request: Request) -> Response:
        ts = await self.catalog.ordering.closed()
        return JSONResponse({"timeline": self.catalog.ordering.timeline, "closed-ts": ts})

    async def _json(self, request: Request) -> dict[str, Any]:
        data = await self._raw(request) or b"{}"
        if len(data) > LARGE_BODY:  # parsing is CPU work: off the event loop
            body = await asyncio.to_thread(_decode, data)
            body.large = True
            return body
        return _decode(data)

    async def _raw(self, request: Request) -> bytes:
        """The request's body, read once (an Idempotency-Key's fingerprint reads it first)."""
        if hasattr(request.state, "raw"):
            return bytes(request.state.raw)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise PayloadTooLarge(f"the request body is larger than {self.max_body} bytes")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.max_body:
                        raise PayloadTooLarge(f"the request body is larger than "
                                              f"{self.max_body} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {BODY_TIMEOUT_S} s") \
                from None
        except ClientDisconnect:
            raise BadRequest("the client went away before its request body arrived") from None
        request.state.raw = b"".join(chunks)
        return bytes(request.state.raw)


def _decode(data: bytes) -> _Body:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_json(body)
    return _Body(body)


def _check_json(body: Any) -> None:
    """Refuse what no model should see: nesting deeper than the catalog's limit (a parser's
    recursion), and text that is not Unicode (a lone surrogate, which no database column or
    reply can hold)."""
    pending: list[tuple[Any, int]] = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > boundary.MAX_JSON_DEPTH:
            raise BadRequest(f"the request body nests deeper than {boundary.MAX_JSON_DEPTH} "
                             "levels")
        if isinstance(value, dict):
            for k, v in value.items():
                boundary.check_text(k, "a key in the request body", boundary.MAX_LOCATION_BYTES)
                pending.append((v, depth + 1))
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            boundary.check_text(value, "a string in the request body", 1 << 30)


def _ns(request: Request) -> tuple[str, ...]:
    return check_namespace(_param(request, "namespace").split(SEP))


# A name may hold "/": engines send it as %2F, which routing must not take for a separator.
ENCODED_SLASH = "\x1e"


def _param(request: Request, name: str) -> str:
    return str(request.path_params[name]).replace(ENCODED_SLASH, "/")


class _KeepEncodedSlashes:
    """ASGI wrapper: the request path with each %2F kept apart from the path's own slashes, so
    that routing splits on the latter only (`_param` puts the former back)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path")
        if scope["type"] == "http" and raw and b"%2f" in raw.lower():
            text = raw.decode("latin-1").split("?", 1)[0]
            text = re.sub("%2f", ENCODED_SLASH, text, flags=re.IGNORECASE)
            scope = {**scope, "path": unquote(text)}
        await self.app(scope, receive, send)


def _identifier(value: Any) -> tuple[tuple[str, ...], str]:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise BadRequest("an identifier needs `namespace` (a list of strings) and `name`")
    return check_namespace(_strings(value.get("namespace"), "namespace")), \
        check_name(value["name"])


def _change(commit: CommitTableRequest) -> Change:
    if len(commit.updates) + len(commit.requirements) > boundary.MAX_UPDATES:
        raise BadRequest(f"a commit has at most {boundary.MAX_UPDATES} updates and "
                         "requirements; split it")
    ident = commit.identifier
    return Change(check_namespace(tuple(ident.namespace.root)), check_name(ident.name),
                  commit.requirements, commit.updates)


def _strings(value: Any, what: str, *, allow_empty: bool = False) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) \
            or (not value and not allow_empty):
        raise BadRequest(f"`{what}` must be a list of strings")
    return value


def _properties(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise BadRequest("`properties` must be an object of strings")
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


async def _parse(model: Any, body: dict[str, Any], what: str) -> Any:
    """`body` as `model`, off the event loop when it is large (validation is CPU work that
    would hold up every other request)."""
    if _large(body):
        return await asyncio.to_thread(_parse_now, model, body, what)
    return _parse_now(model, body, what)


def _large(body: Any) -> bool:
    return isinstance(body, _Body) and body.large


class _Body(dict[str, Any]):
    """A request body, which remembers whether it was large."""

    large = False


def _part(value: dict[str, Any], of: Any) -> dict[str, Any]:
    """A part of a body, large if the body was (it is validated where the body would be)."""
    part = _Body(value)
    part.large = _large(of)
    return part


def _parse_now(model: Any, body: dict[str, Any], what: str) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadRequest(f"invalid {what}: {where}: {first.get('msg')}") from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError,
            IcebergValidationError) as exc:  # pyiceberg's own validators, and their slips
        raise BadRequest(f"invalid {what}: {exc.__class__.__name__}: {exc}") from None


def _metadata(loaded: Loaded) -> Any:
    return json.loads(to_json(loaded.metadata))


def _loaded(loaded: Loaded) -> Response:
    body: dict[str, Any] = {"metadata": _metadata(loaded), "config": {}}
    if loaded.metadata_location is not None:
        body["metadata-location"] = loaded.metadata_location
    return JSONResponse(body)


def _view(location: str, metadata: Any) -> Response:
    return JSONResponse({"metadata-location": location,
                         "metadata": json.loads(metadata.model_dump_json()), "config": {}})


async def _identifiers(request: Request, ns: tuple[str, ...],
                       listing: Callable[[tuple[str, ...], str | None, int | None],
                                         Awaitable[list[str]]]) -> Response:
    """A page of a namespace's tables or views, as the spec lists them: the database orders
    the names and cuts the page (one collation for both), one more than the page is asked
    for to know whether another page follows."""
    after, size = _page_request(request)
    names = await listing(ns, after, None if size is None else size + 1)
    page = names if size is None else names[:size]
    more = size is not None and len(names) > size
    return JSONResponse({"identifiers": [{"namespace": list(ns), "name": n} for n in page],
                         **({"next-page-token": _token(page[-1])} if more else {})})


def _page_request(request: Request) -> tuple[str | None, int | None]:
    """`pageToken` (opaque to clients) and `pageSize`, as the spec has them."""
    size_text, token = request.query_params.get("pageSize"), request.query_params.get("pageToken")
    after = _after(token) if token else None
    if not size_text:
        return after, None
    if not (size_text.isascii() and size_text.isdigit()) or len(size_text) > 9 \
            or int(size_text) < 1:
        raise BadRequest("`pageSize` must be a positive integer (at most 999999999)")
    return after, min(int(size_text), boundary.MAX_PAGE_SIZE)  # a server may return fewer


def _page(request: Request, items: list[Any], key: Callable[[Any], str]
          ) -> tuple[list[Any], dict[str, str]]:
    """A page of `items`, which are sorted by `key` in Python's order, the one the cut here
    uses (namespaces: the catalog lists them all, few as they are)."""
    after, size = _page_request(request)
    if after is not None:
        items = [i for i in items if key(i) > after]
    if size is None:
        return items, {}
    page = items[:size]
    return page, ({"next-page-token": _token(key(page[-1]))} if len(items) > size else {})


def _token(last: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": last}).encode()).decode()


def _after(token: str) -> str:
    try:
        after = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))["after"]
    except (ValueError, KeyError, TypeError, UnicodeError):
        raise BadRequest("`pageToken` is not one this catalog gave; start again without "
                         "it") from None
    if not isinstance(after, str):
        raise BadRequest("`pageToken` is not one this catalog gave; start again without it")
    return after
