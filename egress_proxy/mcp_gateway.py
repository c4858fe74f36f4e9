"""MCP tool servers at the proxy: each configured server is a streamable-HTTP MCP server at
``/s/{session}/mcp/{server}``, whatever the upstream is.

Both sides are the official ``mcp`` SDK. Towards the client: the SDK's low-level ``Server``
(``tools/list``, ``tools/call``) behind its streamable-HTTP session manager (stateless, JSON
replies), mounted as one ASGI route. Towards the upstream: the SDK's ``ClientSession``
(``egress_proxy.mcp_upstream``), over ``stdio_client`` (a process the proxy spawns, by
default in a network namespace of its own: ``unshare --net``, so the tool reaches nothing,
loopback included) or ``streamable_http_client`` (a remote server, through
``transports.network``'s client).

The route runs the proxy's checks before the SDK sees a byte: token (401), server name (404),
body size (413), and for ``tools/call`` the admission rule (``egress_proxy.admission``): a
call that is no unserved call of its session's committed reply (named in ``_meta``, or matched
by name and canonical arguments) is answered 409 with a JSON-RPC error whose ``data.code``
says why, and recorded as refused. An admitted call is recorded
(``tool.call``, durable) before the upstream is asked, and its ``tool.result`` after: the
JSON-RPC ``result`` object as received (RFC 8785), ``COMMITTED``; an error reply, ``FAILED``;
no reply, ``UNKNOWN``. The call runs in a task of its own, so a client that leaves does not
stop the recording.

Each session gets its own process of a stdio server, started on its first use and stopped
once unused for the server's ``idle_timeout_s`` (a reaper task looks every few seconds), so
one session's tool state never reaches another's; a server marked ``shared`` (and every remote
server) is one upstream for all sessions. A server that cannot be started or cannot list its
tools answers a JSON-RPC error naming it (``data.code`` ``upstream_unavailable``, with its
stderr's last lines), and its session's stream gets a ``tool.unavailable`` entry; the other
servers are untouched. A call past the server's ``timeout_s`` is cancelled upstream
(``notifications/cancelled``), answered with a JSON-RPC error ``REQUEST_TIMEOUT`` whose
``data.code`` is ``tool_timeout``, recorded ``UNKNOWN`` with that error, and its server is
restarted without cutting other sessions' calls still running on it (``mcp_upstream``).

Importing this module loads the SDK (and its HTTP client): ``app`` imports it only when
``mcp_servers`` is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, ConfigDict
from starlette.types import Message, Receive, Scope, Send

from egress_proxy.errors import (
    BodyTooLarge,
    ConfigError,
    MalformedBody,
    NotFound,
    PastLimit,
    ProxyError,
    ReplayMiss,
    ReplyNotCommitted,
)
from egress_proxy.mcp_upstream import Link, ServerFailed
from egress_proxy.providers import CREDENTIAL_HEADERS
from egress_proxy.sessions import Session, SessionRegistry, token_from_headers
from egress_proxy.tool_config import RemoteServer, StdioServer, bearer_tokens, resolved
from egress_proxy.tools import (
    META_CALL_ID,
    META_REPLY_SEQ,
    Outcome,
    ToolAsk,
    ToolCalls,
    append,
    named_reply,
)
from record.digest import canonical_json
from record.limits import MAX_DEPTH, JsonRefused, OverLimit, load_json, nesting_depth
from record.log import Log
from record.schema import ToolUnavailable


class _Raw(BaseModel):
    """Any JSON-RPC ``result``, every member kept as received (not re-rendered by a model)."""

    model_config = ConfigDict(extra="allow")

    def members(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


logger = logging.getLogger(__name__)
_TARGET = "affidavit.tool_target"  # the ASGI scope key the route hands the handlers
#: Errors the SDK raises itself when no answer came: the call's fate is unknown.
_NO_ANSWER = frozenset({types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT})


@dataclass(frozen=True)
class _Target:
    session: Session
    link: Link
    protocol: str | None = None  # the client's ``mcp-protocol-version`` header


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
        calls: ToolCalls | None = None,
    ) -> None:
        if any(isinstance(s, StdioServer) and s.network == "none" for s in servers.values()):
            check_netns()
        self.tokens = bearer_tokens(servers, env)
        self.configs = {name: resolved(name, s, env) for name, s in servers.items()}
        #: The upstreams started so far, by (session id, server); "" for one all sessions use.
        self.links: dict[tuple[str, str], Link] = {}
        self.registry, self.max_body_bytes = registry, max_body_bytes
        self.calls = calls if calls is not None else ToolCalls(log)
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
            reaper = asyncio.create_task(self._reap())
            try:
                yield
            finally:
                reaper.cancel()
                if self._tasks:
                    await asyncio.wait(set(self._tasks), timeout=30)
                links, self.links = list(self.links.values()), {}
                await asyncio.gather(*(link.aclose() for link in links))

    def link(self, session_id: str, server: str) -> Link | None:
        """The upstream ``server`` is for this session (made, not started, on first ask)."""
        config = self.configs.get(server)
        if config is None:
            return None
        own = isinstance(config, StdioServer) and not config.shared
        key = (session_id if own else "", server)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = Link(server, config, self.tokens[server])
        return link

    async def _reap(self) -> None:
        """Stop every stdio process unused for its server's ``idle_timeout_s``."""
        timeouts = [c.idle_timeout_s for c in self.configs.values() if isinstance(c, StdioServer)]
        if not timeouts:
            return
        tick = min(5.0, max(0.05, min(timeouts) / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for key, link in list(self.links.items()):
                config = link.config
                if (
                    not isinstance(config, StdioServer)
                    or link.idle_for(now) < config.idle_timeout_s
                ):
                    continue
                if key[0]:  # a session's own: forgotten, a later use starts a new one
                    self.links.pop(key, None)
                if link.live:
                    logger.info(
                        "MCP server %r: stopped after %.0f s idle", link.name, config.idle_timeout_s
                    )
                if link.live or key[0]:  # a forgotten link's retired processes are waited for
                    try:
                        await link.aclose()
                    except Exception as exc:  # the reaper itself must live on
                        logger.warning("MCP server %r: stopping it failed: %r", link.name, exc)

    # -- the route -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            params = scope["path_params"]
            session = self.registry.authenticate(params["session_id"], token_from_headers(headers))
            link = self.link(session.id, params["server"])
            if link is None:
                raise NotFound(f"no MCP server named {params['server']!r} is configured")
            target = _Target(session, link, headers.get("mcp-protocol-version"))
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
        and never reaches the SDK or the upstream. ``tools/list`` still goes to the upstream:
        a list has no side effect, agent frameworks list before they call, and the record
        holds none (the tools a model was shown are in its recorded request, so a list that
        changed since shows up as that call's "request differs").
        """
        try:
            message = load_json(raw) if raw else None
        except OverLimit as exc:  # refused before the SDK parses it (its parser stops at ~200)
            raise PastLimit(f"the JSON-RPC body is past a limit: {exc}") from None
        except JsonRefused:
            return None  # the SDK answers a parse error
        if isinstance(message, list):
            raise MalformedBody("JSON-RPC batches are not served")
        armed = target.session.replay is not None
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
        try:  # the admission rule (egress_proxy.admission), checked without claiming
            await self.calls.check(target.session, ask)
        except ReplyNotCommitted as exc:
            body = _refusal_body(message.get("id"), exc)
            await self.calls.refuse(target.session, ask, body, exc)
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
            try:
                result = load_json(recorded.result_bytes)
            except JsonRefused:  # served as recorded, byte for byte, inside the envelope
                head = canonical_json({"jsonrpc": "2.0", "id": rid})[:-1]
                return 200, head + b',"result":' + recorded.result_bytes + b"}"
            if target.protocol is not None and is_version_at_least(target.protocol, _MODERN):
                result = _downstream(result, cacheable=False)  # the SDK's check is bypassed here
            return 200, canonical_json({"jsonrpc": "2.0", "id": rid, "result": result})
        try:
            error = load_json(recorded.error_bytes) if recorded.error_bytes else None
        except JsonRefused:
            error = None
        if not isinstance(error, dict):
            error = {"code": types.INTERNAL_ERROR, "message": "the recorded call got no reply"}
        return 200, canonical_json({"jsonrpc": "2.0", "id": rid, "error": error})

    def _ask(
        self, target: _Target, tool: str, arguments: dict[str, Any] | None, meta: object
    ) -> ToolAsk:
        named = named_reply(meta)
        if named is None and isinstance(meta, Mapping) and _NAMING & meta.keys():
            raise ReplyNotCommitted(  # a half or malformed name: never guessed at
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
        target = _target(ctx)
        link = self._current(target)
        request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=params.cursor))
        async with link.using():
            try:
                conn = await link.connect()
                async with link.holding(conn):
                    try:
                        answer = await conn.ask(request, _Raw)
                    except MCPError as exc:
                        link.lost(exc, conn)
                        raise
                return _downstream(answer.members(), cacheable=True)
            except Exception as exc:
                error = _unavailable(link, exc)
                await self._note(target, error)
                raise error from None

    def _current(self, target: _Target) -> Link:
        """The link to use now: the route's may have been reaped while the request waited.
        The caller enters ``using()`` before it awaits anything, so the reaper cannot take
        it in between."""
        link = self.link(target.session.id, target.link.name)
        assert link is not None, "a configured server"
        return link

    async def _note(self, target: _Target, error: MCPError) -> None:
        """Record that a server's tools are left out of this session, and why."""
        note = ToolUnavailable(server=target.link.name, error=error.error.message)
        try:
            await append(self.calls.log, target.session, note)
        except ProxyError as exc:
            logger.warning("MCP server %r: the note was not recorded: %s", target.link.name, exc)

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
            await self.calls.refuse(target.session, ask, canonical_json(error), exc)
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
        link = self._current(target)
        async with link.using():
            return await self._run_upstream(
                _Target(target.session, link, target.protocol), params, call_seq
            )

    async def _run_upstream(
        self, target: _Target, params: types.CallToolRequestParams, call_seq: int
    ) -> dict[str, Any]:
        link, session = target.link, target.session
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=params.name, arguments=params.arguments)
        )
        try:
            conn = await link.connect()
        except Exception as exc:
            unavailable = _unavailable(link, exc)
            await self.calls.result(session, call_seq, "UNKNOWN", error_bytes=_bytes(unavailable))
            raise unavailable from None
        async with link.holding(conn):
            try:
                answer = await conn.ask(request, _Raw)
            except MCPError as exc:
                link.lost(exc, conn)  # a timeout or a closed connection: the next call restarts
                error = _timed_out(link, params.name) if exc.code == types.REQUEST_TIMEOUT else exc
                outcome: Outcome = "UNKNOWN" if exc.code in _NO_ANSWER else "FAILED"
                error, error_bytes = _recordable_error(link, params.name, error)
                await self.calls.result(session, call_seq, outcome, error_bytes=error_bytes)
                raise error from None
            except Exception as exc:
                unavailable = _unavailable(link, exc)
                await self.calls.result(
                    session, call_seq, "UNKNOWN", error_bytes=_bytes(unavailable)
                )
                raise unavailable from None
        result = answer.members()
        try:
            result_bytes = _recordable(result)
        except ValueError as exc:  # it answered, so the call is settled: never sent again
            invalid = _reply_invalid(link, params.name, "a result", exc)
            await self.calls.result(session, call_seq, "FAILED", error_bytes=_bytes(invalid))
            raise invalid from None
        await self.calls.result(session, call_seq, "COMMITTED", result_bytes=result_bytes)
        return _downstream(result, cacheable=False)


#: The first protocol version whose results need ``resultType`` (and ``ttlMs``/``cacheScope``).
_MODERN = "2026-07-28"


def _downstream(result: dict[str, Any], *, cacheable: bool) -> dict[str, Any]:
    """An upstream's result as a client of any protocol version can take it.

    The upstream answered under the version the proxy negotiated with it; the client may
    have negotiated a newer one (2026-07-28 requires ``resultType``, and ``ttlMs`` and
    ``cacheScope`` on cacheable results such as ``tools/list``). Members the upstream sent
    are kept as they are; missing ones get the protocol's defaults (complete, not cached,
    private). The record keeps the upstream's result as received.
    """
    defaults: dict[str, Any] = {"resultType": "complete"}
    if cacheable:
        defaults |= {"ttlMs": 0, "cacheScope": "private"}
    return {**defaults, **result}


_DROPPED = frozenset(name.encode("latin-1") for name in CREDENTIAL_HEADERS)
_NAMING = frozenset({META_REPLY_SEQ, META_CALL_ID})  # the _meta members that name a reply


def _target(ctx: Any) -> _Target:
    target = ctx.request.scope.get(_TARGET) if ctx.request is not None else None
    assert isinstance(target, _Target), "the gateway's route sets the target"
    return target


def _refused(exc: ProxyError) -> MCPError:
    """A proxy refusal as a JSON-RPC error: the stable code in ``data.code``."""
    data = {"code": exc.code, "message": str(exc)}
    return MCPError(types.INVALID_REQUEST, f"{exc.code}: {exc}", data)


def _error_object(error: MCPError) -> dict[str, Any]:
    return error.error.model_dump(mode="json", by_alias=True, exclude_none=True)


def _bytes(error: MCPError) -> bytes:
    """A JSON-RPC ``error`` object as recorded: RFC 8785 JSON."""
    return canonical_json(_error_object(error))


def _recordable(value: dict[str, Any]) -> bytes:
    """``value`` as recorded (RFC 8785 JSON), or ``ValueError`` when the record could not keep
    it or its readers could not read it back: nesting past ``record.limits.MAX_DEPTH``, a
    number RFC 8785 cannot write (the SDK reads ``NaN``, ``1e400`` and integers past 2**53),
    a lone surrogate. (Canonical numbers are short: depth is the one limit left to check.)"""
    depth = nesting_depth(value)
    if depth > MAX_DEPTH:
        raise OverLimit(f"arrays and objects nest {depth} deep (at most {MAX_DEPTH})")
    return canonical_json(value)


def _recordable_error(link: Link, tool: str, error: MCPError) -> tuple[MCPError, bytes]:
    """An upstream's JSON-RPC error and its recorded bytes; one the record cannot keep is
    replaced by ``upstream_reply_invalid``, its message kept."""
    try:
        return error, _recordable(_error_object(error))
    except ValueError as exc:
        invalid = _reply_invalid(link, tool, f"an error ({error.error.message[:200]!r})", exc)
        return invalid, _bytes(invalid)


def _reply_invalid(link: Link, tool: str, what: str, exc: ValueError) -> MCPError:
    """An upstream's answer the record cannot keep as received: ``upstream_reply_invalid``."""
    message = (
        (
            f"upstream_reply_invalid: MCP server {link.name!r} answered tool {tool!r} with {what} "
            f"the record cannot keep: {str(exc)[:200]}"
        )
        .encode("utf-8", "backslashreplace")
        .decode()
    )  # itself recorded: no lone surrogate
    data = {"code": "upstream_reply_invalid", "server": link.name, "tool": tool}
    return MCPError(types.INTERNAL_ERROR, message, data)


def _timed_out(link: Link, tool: str) -> MCPError:
    """A ``tools/call`` past its server's ``timeout_s``: the SDK's own timeout code
    (``REQUEST_TIMEOUT``), with ``data.code`` ``tool_timeout`` naming the server and tool."""
    timeout = link.config.timeout_s
    message = (
        f"tool_timeout: MCP server {link.name!r}: tool {tool!r} gave no answer within "
        f"{timeout:g} s; the call was cancelled and the server is restarted"
    )
    data = {"code": "tool_timeout", "server": link.name, "tool": tool, "timeout_s": timeout}
    return MCPError(types.REQUEST_TIMEOUT, message, data)


def _unavailable(link: Link, exc: BaseException) -> MCPError:
    if isinstance(exc, MCPError) and exc.code == types.REQUEST_TIMEOUT:
        what = f"no answer within {link.config.timeout_s:g} s; cancelled, the server is restarted"
    elif isinstance(exc, MCPError):
        what = exc.error.message
    elif isinstance(exc, ServerFailed):
        what = str(exc)
    elif isinstance(exc, TimeoutError):
        what = f"no answer within {link.config.timeout_s:g} s"
    else:
        what = f"{type(exc).__name__}: {exc}"
    message = f"upstream_unavailable: MCP server {link.name!r}: {what}"
    return MCPError(types.INTERNAL_ERROR, message, {"code": "upstream_unavailable"})


#: The largest integer RFC 8785 writes exactly (I-JSON's safe range): a JSON-RPC id past it
#: cannot be echoed in a canonical answer, so it is answered as ``null``, as JSON-RPC does an
#: id it cannot read (found by fuzzing).
_MAX_SAFE_ID = 2**53 - 1


def _request_id(request_id: object) -> str | int | None:
    if isinstance(request_id, str):
        return request_id
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        return request_id if abs(request_id) <= _MAX_SAFE_ID else None
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
