"""The harness tests' appliance: the real engine, proxy and control plane in this process,
a loopback web whose page changes on every fetch, and two MCP servers behind the proxy: our
ledger (a side effect, spawned under ``unshare --net``) and ``mcp-server-time`` from PyPI,
both stdio, and a remote streamable-HTTP one (``remote``, with a bearer token)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.demo import ChangingWeb
from harness.session import read_bodies
from harness.state import Home
from harness.up import TINY_MODEL, RunningAppliance, _serve, running_appliance
from record.schema import ModelRequest, ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.tool_rig import REMOTE_TOKEN

LEDGER_SERVER = Path(__file__).with_name("_ledger_server.py")
#: The instant the proxy injects into every prompt: fixed, so the tiny model's replies (and
#: so the tool calls a test expects) are the same on every run.
CLOCK = "2026-07-22T09:30:00Z"
PINS = {"seed": 42, "temperature": 0.7, "top_p": 0.95, "max_tokens": 200, "strict_cache": True}


def named(tool: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool}}


@dataclass
class Remote:
    """A remote streamable-HTTP MCP server (the SDK's), one tool ``peek {word}``."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Any:
        import mcp_types as types
        from mcp.server.lowlevel.server import Server

        schema = {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 8}},
            "required": ["word"],
            "additionalProperties": False,
        }

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            tool = types.Tool(name="peek", description="Peek at a word.", input_schema=schema)
            return types.ListToolsResult(tools=[tool])

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            self.calls.append(dict(params.arguments or {}))
            text = f"peeked at {len(self.calls)} words"
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

        server = Server("harness-remote", on_list_tools=list_tools, on_call_tool=call_tool)
        return server.streamable_http_app(json_response=True, host="127.0.0.1")


@dataclass
class HarnessRig:
    home: Home
    up: RunningAppliance
    web: ChangingWeb
    web_url: str
    ledger: Path
    remote: Remote


@contextmanager
def web_appliance(home: Home) -> Iterator[RunningAppliance]:
    """The tiny engine behind the proxy with the changing loopback web for ``web_fetch`` and
    ``web_search``, no MCP servers: the fixed clock, so its turns come out the same."""
    with (
        _serve(ChangingWeb()) as web,
        running_appliance(
            home,
            engine=TINY_MODEL,
            search_url=web + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),
            clock=CLOCK,
        ) as running,
    ):
        yield running


@contextmanager
def harness_rig(tmp: Path, *, mcp: bool = True) -> Iterator[HarnessRig]:
    ledger = tmp / "ledger.txt"
    servers: dict[str, Any] = {}
    if mcp:
        servers = {
            "ledger": {
                "transport": "stdio",
                "command": sys.executable,
                "args": [str(LEDGER_SERVER)],
                "env": {"LEDGER": str(ledger)},
                "idempotent_tools": ["count_notes"],
            },
            "time": {
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                "idempotent_tools": ["get_current_time"],
            },
        }
    web, remote = ChangingWeb(), Remote()
    home = Home(tmp / "home")
    env = {"TEST_REMOTE_MCP_TOKEN": REMOTE_TOKEN}
    with _serve(web) as url, _serve(remote.app()) as far:
        if mcp:
            servers["remote"] = {
                "transport": "streamable_http",
                "url": far + "/mcp",
                "bearer_token_env": "TEST_REMOTE_MCP_TOKEN",
                "idempotent_tools": ["peek"],
            }
        with running_appliance(
            home,
            engine=TINY_MODEL,
            mcp_servers=servers,
            search_url=url + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),  # the loopback web: refused unless allow-listed
            env=env,
            clock=CLOCK,
        ) as up:
            yield HarnessRig(home, up, web, url, ledger, remote)


def model_exchanges(
    store: str | Path, session: str, key: KeyPair
) -> list[tuple[ModelRequest, ModelResponse]]:
    """Each recorded model reply of a session with the request it answers, in order."""
    bodies = dict(read_bodies(store, session, key))
    pairs = []
    for body in bodies.values():
        if isinstance(body, ModelResponse):
            request = bodies[body.request_seq]
            assert isinstance(request, ModelRequest)
            pairs.append((request, body))
    return pairs


@dataclass
class Recorded:
    """One session's recorded turn, and what the tests need to read it back."""

    rig: HarnessRig
    session: str
    key: KeyPair
    result: Any

    @property
    def store(self) -> str:
        return self.rig.up.appliance.store


@contextmanager
def recorded_turn(tmp: Path, api: str, text: str = "What does the web say?") -> Iterator[Recorded]:
    """A pinned turn (``web_search`` forced, then words) on the model API ``api``, no MCP."""
    from harness.agent import TurnPolicy
    from harness.session import LABEL_API, open_session, run_turn

    policy = TurnPolicy(3, (named("web_search"), "none"))
    with harness_rig(tmp, mcp=False) as rig:
        state = open_session(rig.home, PINS, policy=policy, labels={LABEL_API: api})
        result = run_turn(rig.home, state.session_id, text)
        yield Recorded(rig, state.session_id, KeyPair.read(rig.home.user_key_file), result)
