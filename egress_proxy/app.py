"""The data plane: FastAPI routes under ``/s/{session}/``, in front of the pipeline.

Every route lives under a session's path and needs that session's token, except
``GET /metrics`` (``egress_proxy.metrics``: Prometheus text, no session data). The order of
checks is fixed, and each refusal is a JSON error with a stable ``code``:

1. not under ``/s/{session}/…`` → 404 ``not_found`` (nothing else is served);
2. unknown session or wrong token → 401 ``unauthorized`` (one answer for both);
3. a path no provider is mounted on → 404 ``not_found``; not POST → 405;
4. a body over ``max_body_bytes`` → 413 ``body_too_large``: never read to its end, not
   recorded, not sent;
5. a body that is not one I-JSON object → 400 ``malformed_json``, recorded as a refused
   call (its input digest, outcome ``FAILED``), not sent.

Everything else goes through the pipeline. This module holds no recording logic; it reads
the body, builds the ``Call`` and turns the ``Reply`` into an HTTP response. The tool routes,
``/s/{session}/mcp/{server}`` (``mcp_gateway``, imported only when ``mcp_servers`` is set) and
``/s/{session}/v1/fetch`` (``fetch``, when enabled), are registered ahead of the model route.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from egress_proxy.clock import Clock
from egress_proxy.collateral import CollateralFetcher
from egress_proxy.config import ProxyConfig, api_keys
from egress_proxy.errors import (
    BodyTooLarge,
    MalformedBody,
    MethodNotAllowed,
    NotFound,
    ProxyError,
    UpstreamError,
)
from egress_proxy.fetch import ExactTransport, Fetcher
from egress_proxy.metrics import CONTENT_TYPE_LATEST, ProxyMetrics
from egress_proxy.pipeline import Call, TaskSet, Upstream, build_pipeline, record_refusal
from egress_proxy.providers import CREDENTIAL_HEADERS, DIALECTS, parse_request, relayed
from egress_proxy.sessions import SessionRegistry, token_from_headers
from egress_proxy.tools import ToolCalls
from egress_proxy.transports.base import Transport
from record.log import Log

if TYPE_CHECKING:
    from egress_proxy.mcp_gateway import McpGateway

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
#: How long shutdown waits for replies still being read, so they are committed.
DRAIN_SECONDS = 30.0


def error_response(error: ProxyError, headers: Mapping[str, str] | None = None) -> Response:
    return Response(error.body(), error.status, headers, media_type="application/json")


def upstreams(config: ProxyConfig, keys: Mapping[str, str | None]) -> dict[str, Upstream]:
    """Each mounted route's upstream: the provider's base URL with the route appended."""
    result: dict[str, Upstream] = {}
    for route, name in config.mounts.items():
        provider = config.providers[name]
        result[route] = Upstream(
            name=name,
            dialect=DIALECTS[route],
            url=provider.base_url + route,
            api_key=keys[name],
            api_version=provider.api_version,
            timeout_s=provider.timeout_s,
            connect_timeout_s=provider.connect_timeout_s,
            max_reply_bytes=config.max_reply_bytes,
            engine_extensions=provider.engine_extensions,
            inject_clock=provider.inject_clock,
        )
    return result


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the body is {declared} bytes; this proxy takes at most {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the body exceeds {limit} bytes")
    return bytes(body)


def create_app(
    config: ProxyConfig,
    log: Log,
    *,
    registry: SessionRegistry | None = None,
    transport: Transport | None = None,
    env: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> FastAPI:
    """The data-plane app. Fails here, at start, if a provider's API key is not set.

    With no ``transport`` it dials the network (``transports.network``, imported only then);
    with no ``clock`` it reads the system clock.
    """
    routes = upstreams(config, api_keys(config, env))
    registry = registry if registry is not None else SessionRegistry(log)
    dialer = transport if transport is not None else _network_transport()
    tasks = TaskSet()
    metrics = ProxyMetrics()  # a registry of this app's own, never the global one
    pipeline = metrics.stage(build_pipeline(log, metrics.transport(dialer), tasks, clock))
    # one admission ledger for every tool route: MCP calls and the web tools' fetches
    calls = ToolCalls(log) if config.mcp_servers or config.fetch.enabled else None
    gateway = _mcp_gateway(config, log, registry, env, calls)
    fetcher = None
    if config.fetch.enabled:
        assert calls is not None
        fetcher = Fetcher(log, _exact(dialer), config.fetch, calls)
    collateral = None  # the control plane's FetchCollateral: only with a network transport
    if config.collateral.enabled and isinstance(dialer, ExactTransport):
        collateral = CollateralFetcher(log, dialer, config.collateral)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()  # where the control plane runs collateral
        async with AsyncExitStack() as stack:
            if gateway is not None:  # tool calls in flight finish before the upstreams stop
                await stack.enter_async_context(gateway.running())
            yield
            await tasks.drain(DRAIN_SECONDS)  # replies still being read get committed first
        await dialer.aclose()

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(metrics.arrivals)  # added latency counts from here (egress_proxy.metrics)
    app.state.config = config
    app.state.registry = registry
    app.state.tasks = tasks
    app.state.metrics = metrics
    app.state.collateral = collateral
    app.state.loop = None

    @app.exception_handler(ProxyError)
    async def _proxy_error(_: Request, exc: ProxyError) -> Response:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> Response:
        return error_response(ProxyError(f"the proxy failed: {type(exc).__name__}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return error_response(MethodNotAllowed("method not allowed here"))
        return error_response(NotFound("no such route"))

    if gateway is not None:  # an ASGI endpoint: every method reaches the gateway's own checks
        app.router.routes.append(Route("/s/{session_id}/mcp/{server}", gateway))

    @app.api_route("/s/{session_id}/v1/fetch", methods=_METHODS)
    async def fetch_route(session_id: str, request: Request) -> Response:
        session = registry.authenticate(session_id, token_from_headers(request.headers))
        if fetcher is None:
            raise NotFound("fetch is not enabled on this proxy")
        if request.method != "POST":
            raise MethodNotAllowed(f"/v1/fetch takes POST, not {request.method}")
        raw = await read_body(request, config.max_body_bytes)
        if session.replay is not None:  # served from the plan: a replay never goes live
            answer = await fetcher.replayed(session, raw, session.replay)
        else:
            answer = await asyncio.shield(tasks.spawn(fetcher.fetch(session, raw)))
        headers = _record_headers(session.id, answer.request_seq)
        return Response(answer.body, answer.status, headers, media_type="application/json")

    @app.api_route("/s/{session_id}/{path:path}", methods=_METHODS)
    async def session_route(session_id: str, path: str, request: Request) -> Response:
        session = registry.authenticate(session_id, token_from_headers(request.headers))
        upstream = routes.get("/" + path)
        if upstream is None:
            raise NotFound(f"no provider is mounted on /{path}")
        if request.method != "POST":
            raise MethodNotAllowed(f"/{path} takes POST, not {request.method}")
        raw = await read_body(request, config.max_body_bytes)
        client_headers = {  # the token stops here: no stage ever sees a credential header
            k.lower(): v for k, v in request.headers.items() if k.lower() not in CREDENTIAL_HEADERS
        }
        api_version = upstream.dialect.api_version(client_headers, upstream.api_version)
        call = Call(session, upstream, client_headers, raw, {}, raw, api_version=api_version)
        try:
            call.request = parse_request(raw)
        except MalformedBody as exc:
            first, _ = await record_refusal(log, call, exc)
            metrics.refused(call)
            return error_response(exc, _record_headers(session.id, first.seq))
        # The call runs in its own task: a client that goes away cancels this handler, not
        # the call, which still records its request and (through capture) its reply.
        try:
            reply = await asyncio.shield(tasks.spawn(pipeline(call)))
        except UpstreamError as exc:
            headers = _record_headers(session.id, call.request_seq)
            return error_response(exc, headers)
        headers = dict(relayed(reply.headers))
        headers.update(_record_headers(session.id, call.request_seq))
        return StreamingResponse(reply.body, reply.status, headers)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{path:path}", methods=_METHODS)
    async def outside(path: str) -> Response:
        raise NotFound(f"/{path} is not under a session path /s/{{session}}/")

    return app


def _mcp_gateway(
    config: ProxyConfig,
    log: Log,
    registry: SessionRegistry,
    env: Mapping[str, str] | None,
    calls: ToolCalls | None,
) -> McpGateway | None:
    """Imported here, only when tool servers are configured: the SDK brings its HTTP client."""
    if not config.mcp_servers:
        return None
    from egress_proxy.mcp_gateway import McpGateway

    environ = os.environ if env is None else env
    return McpGateway(
        config.mcp_servers,
        log,
        registry,
        env=environ,
        max_body_bytes=config.max_body_bytes,
        calls=calls,
    )


def _exact(transport: Transport) -> ExactTransport:
    """Fetch sends exact bytes: only a transport that can (``transports.network``) will do."""
    if not isinstance(transport, ExactTransport):
        raise TypeError(f"{type(transport).__name__} cannot send a fetch as exact bytes")
    return transport


def _network_transport() -> Transport:
    """Imported here, only when a live app is built without a transport of its own."""
    from egress_proxy.transports.network import NetworkTransport

    return NetworkTransport()


def _record_headers(stream: str, request_seq: int | None) -> dict[str, str]:
    """Where the call's request entry is, for replies that carry no annotation."""
    headers = {"affidavit-stream": stream}
    if request_seq is not None:
        headers["affidavit-request-seq"] = str(request_seq)
    return headers
