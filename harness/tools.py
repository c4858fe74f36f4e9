"""The agent's tools: what the model is offered, and how a call reaches the tool.

Every tool goes through the proxy, which records it:

- ``web_fetch {url}``: the proxy's fetch endpoint (``POST {base_url}/v1/fetch``), GET only;
- ``web_search {query}``: a GET of the appliance's search endpoint through the same endpoint;
- ``{server}__{tool}``: an MCP tool, reached with the official ``mcp`` SDK at the proxy's
  streamable-HTTP route ``{base_url}/mcp/{server}``, whatever the server really is.

Every tool says whether it is idempotent: resume may re-send a call whose outcome is unknown
only then. Both web tools are (they only GET); an MCP tool is when the appliance lists it.

A ``Toolbox`` runs calls. ``ProxyToolbox`` goes live through the proxy; ``harness.replay``
has the record-backed one. Both turn an answer into the text the model sees with the same
functions (``fetch_text``, ``mcp_text``), so a reconstruction renders what the live turn saw.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import quote

import httpx

from record.limits import MAX_TOOLS, JsonRefused, load_json
from record.schema import ToolResult

__all__ = [
    "BUILTIN",
    "ProxyToolbox",
    "ReplayMissed",
    "ToolCallFailed",
    "ToolOutput",
    "ToolSpec",
    "Toolbox",
    "catalogue_from_request",
    "fetch_body",
    "fetch_text",
    "mcp_text",
    "recorded_output",
]

#: Longest tool text handed to the model (the rest is cut, and the cut is said).
MAX_TOOL_TEXT = 1200
USER_AGENT = "affidavit-harness"
SEP = "__"  # between an MCP server's name and its tool's in the function name
#: A tool's name as the model APIs take it (OpenAI's rule, the stricter of the two): one
#: outside it would make every model request of the session fail.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The largest input schema a listed tool may bring (JSON bytes): the catalogue is sent with
#: every model request, which the proxy takes up to its ``max_body_bytes``.
MAX_SCHEMA_BYTES = 64 * 1024
#: the proxy's error codes for a fetch of which not a byte went out: recorded ``FAILED``, so
#: the model is told why and the turn goes on (no decision: the call surely did not happen)
SURELY_NOT_SENT = frozenset({"upstream_unreachable"})

Outcome = Literal["COMMITTED", "FAILED", "UNKNOWN"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model is offered it, and where it lives."""

    name: str  # the function name the model calls
    description: str
    parameters: dict[str, Any]
    idempotent: bool
    kind: Literal["fetch", "search", "mcp"]
    server: str = ""  # for MCP: the proxy's server name
    tool: str = ""  # for MCP: the tool's own name

    def function(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


WEB_FETCH = ToolSpec(
    "web_fetch",
    "Fetch a web page and return its text.",
    {
        "type": "object",
        "properties": {"url": {"type": "string", "maxLength": 48}},
        "required": ["url"],
        "additionalProperties": False,
    },
    idempotent=True,
    kind="fetch",
)
WEB_SEARCH = ToolSpec(
    "web_search",
    "Search the web and return the results page.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 48}},
        "required": ["query"],
        "additionalProperties": False,
    },
    idempotent=True,
    kind="search",
)
BUILTIN = {spec.name: spec for spec in (WEB_FETCH, WEB_SEARCH)}


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call gave: the text for the model and how the call ended."""

    text: str
    outcome: Outcome
    seq: int | None = None  # where its result is recorded, when known
    #: why a ``FAILED`` call failed, for people (the proxy's message); the model's ``text`` is
    #: kept as it always was, so that turns recorded earlier still reconstruct byte for byte
    reason: str = ""

    def why(self) -> str:
        """The failure shown to a person: the reason when there is one, else the text."""
        return self.reason or self.text


class ToolCallFailed(Exception):
    """A tool call with no known outcome (the proxy recorded it ``UNKNOWN``, or never answered)."""

    def __init__(self, message: str, *, outcome: Outcome = "UNKNOWN") -> None:
        super().__init__(message)
        self.outcome = outcome


class ReplayMissed(Exception):
    """A tool call under replay that the record does not hold: the turn stops (never live)."""


class Toolbox(Protocol):
    def call(
        self, spec: ToolSpec, arguments: bytes, *, reply_seq: int, call_id: str
    ) -> ToolOutput: ...


def clip(text: str) -> str:
    if len(text) <= MAX_TOOL_TEXT:
        return text
    return text[:MAX_TOOL_TEXT] + f"\n[cut: {len(text) - MAX_TOOL_TEXT} more characters]"


def fetch_body(
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    search_url: str | None,
    *,
    reply_seq: int | None = None,
    call_id: str | None = None,
) -> bytes:
    """The fetch endpoint's request body for a web tool's call (exact: it is recorded), naming
    the reply and call it answers when given (the proxy admits it only as that call)."""
    if spec.kind == "fetch":
        url = str(arguments.get("url", ""))
    else:
        if not search_url:
            raise ToolCallFailed("web_search has no search endpoint configured", outcome="FAILED")
        url = search_url.replace("{query}", quote(str(arguments.get("query", "")), safe=""))
    body: dict[str, Any] = {"method": "GET", "url": url, "headers": {"user-agent": USER_AGENT}}
    if reply_seq is not None and call_id is not None:
        body.update(reply_seq=reply_seq, call_id=call_id)
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _error_code(answer: bytes) -> str:
    """The proxy's ``error.code`` in an error answer ("" when it names none)."""
    return _error(answer)[0]


def _error(answer: bytes) -> tuple[str, str]:
    """The proxy's ``error.code`` and ``error.message`` in an error answer ("" for each one it
    does not name)."""
    try:
        parsed = load_json(answer)
    except JsonRefused:
        return "", ""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return "", ""
    code, message = error.get("code"), error.get("message")
    return (code if isinstance(code, str) else ""), (message if isinstance(message, str) else "")


def fetch_text(status: int, answer: bytes) -> ToolOutput:
    """The model's view of a fetch endpoint answer (live or from the record)."""
    try:
        parsed = load_json(answer)
    except JsonRefused:
        parsed = None
    if status != 200 or not isinstance(parsed, dict) or "body" not in parsed:
        code, message = _error(answer)
        text = f"fetch failed: {status} {code}".strip()
        return ToolOutput(text, "FAILED", reason=clip(f"{text}: {message}" if message else text))
    body = base64.b64decode(parsed["body"]).decode("utf-8", "replace")
    note = parsed.get("affidavit")
    seq = note.get("seq") if isinstance(note, dict) else None
    text = f"HTTP {parsed.get('status')}\n{body}"
    return ToolOutput(clip(text), "COMMITTED", seq if isinstance(seq, int) else None)


def mcp_text(result: Mapping[str, Any]) -> str:
    """The model's view of an MCP ``tools/call`` result object (live or from the record)."""
    parts = []
    content = result.get("content")
    for item in content if isinstance(content, list) else []:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif isinstance(item, dict):
            parts.append(f"[{item.get('type', 'content')}]")
    text = "\n".join(parts)
    if result.get("isError"):
        text = "tool error: " + text
    return clip(text)


def recorded_output(result: ToolResult) -> ToolOutput:
    """The model's view of a recorded ``COMMITTED`` or ``FAILED`` tool outcome, for replays:
    a result that is not a JSON object (or is past ``record.limits``) reads as its text."""
    if result.outcome == "COMMITTED" and result.result_bytes is not None:
        try:
            parsed = load_json(result.result_bytes)
        except JsonRefused:
            parsed = None
        if isinstance(parsed, dict):
            return ToolOutput(mcp_text(parsed), "COMMITTED")
        return ToolOutput(clip(result.result_bytes.decode("utf-8", "replace")), "COMMITTED")
    try:
        error = load_json(result.error_bytes or b"{}")
    except JsonRefused:
        error = None
    message = error.get("message", "") if isinstance(error, dict) else ""
    return ToolOutput(f"tool error: {message}"[:1200], "FAILED")


def catalogue_from_request(
    request: Mapping[str, Any], idempotent: Mapping[str, bool]
) -> list[ToolSpec]:
    """The tools a recorded request offered, as specs: how replays see the catalogue the live
    turn saw (MCP ``tools/list`` answers are not recorded; the request that used them is)."""
    specs = []
    for item in request.get("tools") or []:
        if not isinstance(item, dict):
            continue
        if "function" in item:  # OpenAI: {"type": "function", "function": {…, "parameters"}}
            function = item["function"] if isinstance(item["function"], dict) else {}
        else:  # Anthropic: {"name", "description", "input_schema"}
            function = {**item, "parameters": item.get("input_schema")}
        name = str(function.get("name", ""))
        builtin = BUILTIN.get(name)
        if builtin is not None:
            specs.append(builtin)
            continue
        server, _, tool = name.partition(SEP)
        specs.append(
            ToolSpec(
                name,
                str(function.get("description", "")),
                dict(function.get("parameters") or {}),
                idempotent.get(name, False),
                "mcp",
                server,
                tool,
            )
        )
    return specs


class ProxyToolbox:
    """Live tools, every one through the proxy under the session's path and token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        search_url: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.unavailable: dict[str, str] = {}  # server -> why the catalogue left it out
        self.left_out: dict[str, str] = {}  # a listed tool's name (cut) -> why it was left out
        self.search_url = search_url
        self.http = httpx.Client(
            headers={"authorization": f"Bearer {token}"}, timeout=timeout, trust_env=False
        )

    def close(self) -> None:
        self.http.close()

    # -- the catalogue ------------------------------------------------------------------------

    def catalogue(self, mcp_servers: Mapping[str, Sequence[str]]) -> list[ToolSpec]:
        """The built-in web tools and every tool the proxy's MCP servers list. A server that
        cannot list its tools is left out (the proxy recorded why, as ``tool.unavailable``);
        its error is kept in ``unavailable``, and the other servers' tools stay. So is one
        whose tools would take the catalogue past ``MAX_TOOLS`` (the proxy would refuse every
        request), and a tool whose name the model APIs refuse or whose schema is too large
        for every request to carry (why: ``left_out``)."""
        specs = [WEB_FETCH] + ([WEB_SEARCH] if self.search_url else [])
        self.unavailable, self.left_out = {}, {}
        for server, idempotent in sorted(mcp_servers.items()):
            try:
                tools = self.list_tools(server)
            except ToolCallFailed as exc:
                self.unavailable[server] = str(exc)
                continue
            if len(specs) + len(tools) > MAX_TOOLS:  # the proxy refuses a request with more
                self.unavailable[server] = (
                    f"{server}: lists {len(tools)} tools, which would take the catalogue past "
                    f"{MAX_TOOLS}"
                )
                continue
            for tool in tools:
                name = f"{server}{SEP}{tool.name}"
                why = _unusable(name, tool.input_schema)
                if why is not None:
                    self.left_out[name[:80]] = why
                    continue
                hint = tool.annotations.idempotent_hint if tool.annotations else None
                specs.append(
                    ToolSpec(
                        name,
                        (tool.description or "")[:200],
                        dict(tool.input_schema),
                        tool.name in idempotent or bool(hint),
                        "mcp",
                        server,
                        tool.name,
                    )
                )
        return specs

    def list_tools(self, server: str) -> list[Any]:
        """The tools ``server`` lists through the proxy (the SDK's ``Tool`` models);
        ``ToolCallFailed`` with the proxy's words if it cannot."""
        from mcp.shared.exceptions import MCPError

        try:
            return asyncio.run(self._list(server))
        except Exception as exc:
            cause: BaseException = exc
            while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                cause = cause.exceptions[0]  # the SDK's task groups wrap the error
            if isinstance(cause, MCPError):
                raise ToolCallFailed(cause.error.message) from None
            raise ToolCallFailed(f"{server}: {type(cause).__name__}: {cause}") from None

    async def _list(self, server: str) -> list[Any]:
        async with self._mcp(server) as session:
            listed = await session.list_tools()
            return list(listed.tools)

    # -- calls ----------------------------------------------------------------------------------

    def call(self, spec: ToolSpec, arguments: bytes, *, reply_seq: int, call_id: str) -> ToolOutput:
        args = json.loads(arguments)
        if spec.kind in ("fetch", "search"):
            body = fetch_body(spec, args, self.search_url, reply_seq=reply_seq, call_id=call_id)
            try:
                answer = self.http.post(f"{self.base_url}/v1/fetch", content=body)
            except httpx.HTTPError as exc:
                raise ToolCallFailed(f"{spec.name}: the proxy did not answer: {exc}") from exc
            if (
                answer.status_code in (502, 503)
                and _error_code(answer.content) not in SURELY_NOT_SENT
            ):
                raise ToolCallFailed(f"{spec.name}: {answer.text[:200]}")
            if answer.status_code == 409:
                code = _error_code(answer.content)
                if code == "replay_miss":
                    raise ReplayMissed(f"{spec.name}: {answer.text[:400]}")
                if code == "reply_not_committed":
                    raise ToolCallFailed(f"{spec.name}: {answer.text[:400]}", outcome="FAILED")
            return fetch_text(answer.status_code, answer.content)
        return asyncio.run(self._call_mcp(spec, args, reply_seq, call_id))

    async def _call_mcp(
        self, spec: ToolSpec, args: dict[str, Any], reply_seq: int, call_id: str
    ) -> ToolOutput:
        import mcp_types
        from mcp.shared.exceptions import MCPError

        no_answer = {mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT}

        meta: Any = {
            "affidavit/reply_seq": reply_seq,
            "affidavit/call_id": call_id,
            "affidavit/idempotency_key": call_id,
        }
        try:
            async with self._mcp(spec.server) as session:
                # ``send_request``, not ``call_tool``: that one lists the tools after a call to
                # check its output schema, an unrecorded call a replay refuses (and a cost).
                request = mcp_types.CallToolRequest(
                    params=mcp_types.CallToolRequestParams(
                        name=spec.tool, arguments=args, _meta=meta
                    )
                )
                result = await session.send_request(request, mcp_types.CallToolResult)
        except MCPError as exc:
            data = exc.error.data if isinstance(exc.error.data, dict) else {}
            if exc.code in no_answer or data.get("code") == "upstream_unavailable":
                raise ToolCallFailed(f"{spec.name}: {exc}") from exc  # recorded UNKNOWN
            if data.get("code") == "replay_miss":
                raise ReplayMissed(f"{spec.name}: {exc}") from exc
            if data.get("code") == "reply_not_committed":
                raise ToolCallFailed(f"{spec.name}: {exc}", outcome="FAILED") from exc
            return ToolOutput(clip(f"tool error: {exc}"), "FAILED")
        except Exception as exc:  # the connection broke: the outcome is not known here
            raise ToolCallFailed(f"{spec.name}: {type(exc).__name__}: {exc}") from exc
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return ToolOutput(mcp_text(dumped), "FAILED" if result.is_error else "COMMITTED")

    def _mcp(self, server: str) -> Any:
        import contextlib

        import httpx2  # the mcp SDK's HTTP client
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        url = f"{self.base_url}/mcp/{server}"
        headers = {"authorization": f"Bearer {self.token}"}

        @contextlib.asynccontextmanager
        async def opened() -> Any:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=120, trust_env=False) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                yield session

        return opened()


def _unusable(name: str, schema: Mapping[str, Any]) -> str | None:
    """Why a listed tool cannot be offered to the model (``None``: it can). A server is
    outside input: a name the APIs refuse, or a schema too large to send with every request,
    would fail each model call of the session, not just this tool's."""
    if not FUNCTION_NAME.fullmatch(name):
        return f"its name is not 1 to 64 of A-Z a-z 0-9 _ - ({len(name)} characters)"
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is {size} bytes (at most {MAX_SCHEMA_BYTES})"
    return None
