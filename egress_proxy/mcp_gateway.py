"""MCP tool servers at the proxy: each configured server is a streamable-HTTP MCP server at
``/s/{session}/mcp/{server}``, whatever the upstream is.

Both sides are the official ``mcp`` SDK. Towards the client: the SDK's low-level ``Server``
(``tools/list``, ``tools/call``) behind its streamable-HTTP session manager (stateless, JSON
replies), mounted as one ASGI route. Towards the upstream: one ``ClientSession`` per
configured server, over ``stdio_client`` (a process the proxy spawns, by default in a network
namespace of its own: ``unshare --net``, so the tool reaches nothing, loopback included) or
``streamable_http_client`` (a remote server, through ``transports.network``'s client).

The route runs the proxy's checks before the SDK sees a byte: token (401), server name (404),
body size (413), and for ``tools/call`` the order rule (``egress_proxy.tools``): a call whose
``_meta`` names no committed reply of its session is answered 409 with a JSON-RPC error whose
``data.code`` is ``reply_not_committed``, and recorded as refused. An admitted call is recorded
(``tool.call``, durable) before the upstream is asked, and its ``tool.result`` after: the
JSON-RPC ``result`` object as received (RFC 8785), ``COMMITTED``; an error reply, ``FAILED``;
no reply, ``UNKNOWN``. The call runs in a task of its own, so a client that leaves does not
stop the recording. Upstream servers are shared by all sessions and started on first use.

Importing this module loads the SDK (and its HTTP client): ``app`` imports it only when
``mcp_servers`` is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict
from starlette.types import Message, Receive, Scope, Send

from egress_proxy.errors import (
    BodyTooLarge,
    ConfigError,
    MalformedBody,
    NotFound,
    ProxyError,
    ReplayMiss,
    ReplyNotCommitted,
)
from egress_proxy.providers import CREDENTIAL_HEADERS
from egress_proxy.sessions import Session, SessionRegistry, token_from_headers
from egress_proxy.tool_config import RemoteServer, StdioServer, bearer_tokens
from egress_proxy.tools import Outcome, ToolAsk, ToolCalls, named_reply
from record.digest import canonical_json
from record.log import Log


class _Raw(BaseModel):
    """Any JSON-RPC ``result``, every member kept as received (not re-rendered by a model)."""

    model_config = ConfigDict(extra="allow")

    def members(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


logger = logging.getLogger(__name__)
_TARGET = "affidavit.tool_target"  # the ASGI scope key the route hands the handlers
#: Errors the SDK raises itself when no answer came: the call's fate is unknown.
_NO_ANSWER = frozenset({types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT})


class _Link:
    """One upstream server: a ``ClientSession`` held open by a task of its own."""

    def __init__(self, name: str, config: StdioServer | RemoteServer, token: str | None) -> None:
        self.name, self.config, self._token = name, config, token
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def session(self) -> ClientSession:
        """The live session, (re)started if there is none: a dead process is respawned."""
        async with self._lock:
            if self._task is None or self._task.done():
                self._session, self._stop = None, asyncio.Event()
                ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._hold(ready))
                try:  # a server that never answers initialize must not hold the lock for ever
                    self._session = await asyncio.wait_for(ready, self.config.timeout_s)
                except BaseException:
                    self._task.cancel()
                    raise
            assert self._session is not None
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with self._streams() as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                if ready.done():  # the caller gave up waiting
                    return
                ready.set_result(session)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.warning("MCP server %r: connection ended: %r", self.name, exc)

    def _streams(self) -> contextlib.AbstractAsyncContextManager[Any]:
        config = self.config
        if isinstance(config, StdioServer):
            command, args = config.command, list(config.args)
            if config.network == "none":
                command, args = "unshare", ["--net", "--", command, *args]
            params = StdioServerParameters(
                command=command, args=args, env=config.env, cwd=config.cwd
            )
            return stdio_client(params, errlog=sys.stderr)
        from egress_proxy.transports.network import mcp_http_client

        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        client = mcp_http_client(headers, config.timeout_s, config.connect_timeout_s)
        return _owning(client, streamable_http_client(config.url, http_client=client))

    async def aclose(self) -> None:
        """Close the session (a spawned process is shut down); the next call starts anew."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=10)

    async def lost(self, exc: MCPError, used: ClientSession) -> None:
        """After the SDK says the connection closed, drop it so the next call reconnects."""
        if exc.code == types.CONNECTION_CLOSED and self._session is used:
            await self.aclose()


@contextlib.asynccontextmanager
async def _owning(client: Any, streams: Any) -> AsyncIterator[Any]:
    async with client, streams as pair:
        yield pair


@dataclass(frozen=True)
class _Target:
    session: Session
    link: _Link


def check_netns() -> None:
    """Fail at start, naming the fix, if this host cannot give a spawned server no network."""
    try:
        subprocess.run(["unshare", "--net", "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(
            f"a stdio MCP server has network = 'none', but `unshare --net` fails here ({exc}); "
            "run the proxy with CAP_SYS_ADMIN, or set network = 'host' for that server"
        ) from None


class McpGateway:
    """The ASGI route for ``/s/{session}/mcp/{server}`` and the upstream sessions behind it."""

    def __init__(
        self,
        servers: Mapping[str, StdioServer | RemoteServer],
        log: Log,
        registry: SessionRegistry,
        *,
        env: Mapping[str, str],
        max_body_bytes: int,
    ) -> None:
        if any(isinstance(s, StdioServer) and s.network == "none" for s in servers.values()):
            check_netns()
        tokens = bearer_tokens(servers, env)
        self.links = {name: _Link(name, s, tokens[name]) for name, s in servers.items()}
        self.registry, self.max_body_bytes = registry, max_body_bytes
        self.calls = ToolCalls(log)
        self.server: Server[Any] = Server("affidavit-proxy")
        self.server.add_request_handler("tools/list", types.PaginatedRequestParams, self._list)
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call)
        self.manager = StreamableHTTPSessionManager(
            self.server, json_response=True, stateless=True, max_request_body_size=max_body_bytes
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve the SDK's manager; on the way out let calls finish, then stop the upstreams."""
        async with self.manager.run():
            try:
                yield
            finally:
                if self._tasks:
                    await asyncio.wait(set(self._tasks), timeout=30)
                for link in self.links.values():
                    await link.aclose()

    # -- the route -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            params = scope["path_params"]
            session = self.registry.authenticate(params["session_id"], token_from_headers(headers))
            link = self.links.get(params["server"])
            if link is None:
                raise NotFound(f"no MCP server named {params['server']!r} is configured")
            target = _Target(session, link)
            raw = await _read(receive, self.max_body_bytes) if scope["method"] == "POST" else b""
            refusal = await self._pre_check(target, raw)
        except ProxyError as exc:
            await _answer(send, exc.status, exc.body())
            return
        if refusal is not None:
            await _answer(send, *refusal)
            return
        inner = dict(scope, headers=[h for h in scope["headers"] if h[0] not in _DROPPED])
        inner[_TARGET] = target
        await self.manager.handle_request(inner, _replay(raw, receive), send)

    async def _pre_check(self, target: _Target, raw: bytes) -> tuple[int, bytes] | None:
        """The order rule, before the SDK sees the request: the answer, or None to go on.

        In a session armed with a replay plan, ``tools/call`` is answered here from the plan
        and ``tools/list`` is a replay miss: neither reaches the SDK or the upstream.
        """
        try:
            message = json.loads(raw) if raw else None
        except ValueError:
            return None  # the SDK answers a parse error
        if isinstance(message, list):
            raise MalformedBody("JSON-RPC batches are not served")
        armed = target.session.replay is not None
        if armed and isinstance(message, dict) and message.get("method") == "tools/list":
            miss = ReplayMiss("tools/list is not served under replay: the record holds no list")
            return miss.status, _refusal_body(message.get("id"), miss)
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return None
        params = message.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return None  # the SDK answers invalid params
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return None
        try:
            ask = self._ask(target, params["name"], arguments, params.get("_meta"))
        except ReplyNotCommitted as exc:
            body = _refusal_body(message.get("id"), exc)  # names no reply: nothing to record
            return exc.status, body
        try:
            await self.calls.check(target.session, ask)
        except ReplyNotCommitted as exc:
            body = _refusal_body(message.get("id"), exc)
            await self.calls.refuse(target.session, ask, body)
            return exc.status, body
        if armed:
            return await self._replayed(target, ask, message.get("id"))
        return None

    async def _replayed(
        self, target: _Target, ask: ToolAsk, request_id: object
    ) -> tuple[int, bytes]:
        """Serve an admitted call from the replay plan: the recorded ``tool.result`` is
        appended with ``replayed_from``; a call the plan does not hold is refused (409
        ``replay_miss``, recorded). No tool transport is touched either way."""
        session = target.session
        plan = session.replay
        assert plan is not None
        try:
            recorded, result_seq = plan.tool_result(ask.server, ask.tool, ask.arguments)
        except ReplayMiss as exc:
            body = _refusal_body(request_id, exc)
            await self.calls.refuse(session, ask, body)
            return exc.status, body
        call_seq = await self.calls.admit(session, ask)
        await self.calls.result(
            session,
            call_seq,
            recorded.outcome,
            result_bytes=recorded.result_bytes,
            error_bytes=recorded.error_bytes,
            replayed_from=result_seq,
        )
        rid = _request_id(request_id)
        if recorded.outcome == "COMMITTED" and recorded.result_bytes is not None:
            result = json.loads(recorded.result_bytes)
            return 200, canonical_json({"jsonrpc": "2.0", "id": rid, "result": result})
        error = json.loads(recorded.error_bytes) if recorded.error_bytes else None
        if not isinstance(error, dict):
            error = {"code": types.INTERNAL_ERROR, "message": "the recorded call got no reply"}
        return 200, canonical_json({"jsonrpc": "2.0", "id": rid, "error": error})

    def _ask(
        self, target: _Target, tool: str, arguments: dict[str, Any] | None, meta: object
    ) -> ToolAsk:
        named = named_reply(meta)
        if named is None:
            raise ReplyNotCommitted(
                "the call names no model reply: _meta needs affidavit/reply_seq and affidavit/call_id"
            )
        try:
            canonical = canonical_json(arguments if arguments is not None else {})
        except ValueError as exc:
            raise MalformedBody(f"the tool arguments are not I-JSON: {exc}") from None
        link = target.link
        idempotent = tool in link.config.idempotent_tools
        return ToolAsk(link.name, tool, canonical, named, idempotent)

    # -- the SDK's handlers --------------------------------------------------------------------

    async def _list(self, ctx: Any, params: types.PaginatedRequestParams) -> dict[str, Any]:
        link = _target(ctx).link
        request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=params.cursor))
        try:
            upstream = await link.session()
        except Exception as exc:
            raise _unavailable(link, exc) from None
        try:
            return (await upstream.send_request(request, _Raw, link.config.timeout_s)).members()
        except MCPError as exc:
            await link.lost(exc, upstream)
            raise
        except Exception as exc:
            raise _unavailable(link, exc) from None

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> dict[str, Any]:
        target = _target(ctx)
        if target.session.replay is not None:  # the route serves these: never go live here
            raise _refused(ReplayMiss("a replayed tool call is served only from its plan"))
        try:  # checked again on what the SDK parsed: the rule holds whatever the route read
            ask = self._ask(target, params.name, params.arguments, params.meta)
        except ProxyError as exc:
            raise _refused(exc) from None
        try:
            call_seq = await self.calls.admit(target.session, ask)
        except ReplyNotCommitted as exc:
            refused = _refused(exc)
            error = refused.error.model_dump(mode="json", by_alias=True, exclude_none=True)
            await self.calls.refuse(target.session, ask, canonical_json(error))
            raise refused from None
        except ProxyError as exc:
            raise _refused(exc) from None
        task = asyncio.create_task(self._run(target, params, call_seq))
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)  # a client that leaves cancels this, not the call

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its awaiter may be gone

    async def _run(
        self, target: _Target, params: types.CallToolRequestParams, call_seq: int
    ) -> dict[str, Any]:
        link, session = target.link, target.session
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=params.name, arguments=params.arguments)
        )
        try:
            upstream = await link.session()
        except Exception as exc:
            await self.calls.result(session, call_seq, "UNKNOWN")
            raise _unavailable(link, exc) from None
        try:
            answer = await upstream.send_request(request, _Raw, link.config.timeout_s)
        except MCPError as exc:
            await link.lost(exc, upstream)
            error = exc.error.model_dump(mode="json", by_alias=True, exclude_none=True)
            outcome: Outcome = "UNKNOWN" if exc.code in _NO_ANSWER else "FAILED"
            await self.calls.result(session, call_seq, outcome, error_bytes=canonical_json(error))
            raise
        except Exception as exc:
            await self.calls.result(session, call_seq, "UNKNOWN")
            raise _unavailable(link, exc) from None
        result = answer.members()
        await self.calls.result(session, call_seq, "COMMITTED", result_bytes=canonical_json(result))
        return result


_DROPPED = frozenset(name.encode("latin-1") for name in CREDENTIAL_HEADERS)


def _target(ctx: Any) -> _Target:
    target = ctx.request.scope.get(_TARGET) if ctx.request is not None else None
    assert isinstance(target, _Target), "the gateway's route sets the target"
    return target


def _refused(exc: ProxyError) -> MCPError:
    """A proxy refusal as a JSON-RPC error: the stable code in ``data.code``."""
    data = {"code": exc.code, "message": str(exc)}
    return MCPError(types.INVALID_REQUEST, f"{exc.code}: {exc}", data)


def _unavailable(link: _Link, exc: BaseException) -> MCPError:
    message = f"upstream_unavailable: MCP server {link.name!r}: {type(exc).__name__}: {exc}"
    return MCPError(types.INTERNAL_ERROR, message, {"code": "upstream_unavailable"})


def _request_id(request_id: object) -> str | int | None:
    if isinstance(request_id, str | int) and not isinstance(request_id, bool):
        return request_id
    return None


def _refusal_body(request_id: object, exc: ProxyError) -> bytes:
    """A JSON-RPC error (so MCP clients read it) carrying the proxy's stable code; a replay
    miss also carries ``nearest`` and ``diff`` in ``data``."""
    error = _refused(exc).error.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(exc, ReplayMiss):
        describe = getattr(exc.nearest, "describe", None)
        error["data"] = {
            **error.get("data", {}),
            "nearest": describe() if callable(describe) else None,
            "diff": exc.diff,
        }
    return canonical_json({"jsonrpc": "2.0", "id": _request_id(request_id), "error": error})


async def _read(receive: Receive, limit: int) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(f"the body exceeds {limit} bytes")
        if not message.get("more_body"):
            break
    return bytes(body)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """The body already read, once, then whatever the client sends next (a disconnect)."""
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
