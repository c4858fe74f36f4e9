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
#: the id ``affidavit up --model tiny`` serves the tiny model under
TINY_SERVED = "affidavit-tiny"
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
    engine: Any  # inference.server.Engine, in this process


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
def harness_rig(
    tmp: Path, *, mcp: bool = True, store: str | None = None, ledger: Path | None = None
) -> Iterator[HarnessRig]:
    """``store``: the record's store (default: the home's SQLite file); ``ledger``: the file
    the ledger server writes (default: in ``tmp``), shared by appliances that share a world."""
    ledger = ledger or tmp / "ledger.txt"
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
        with (
            in_process_engine(home) as (engine, provider),
            running_appliance(
                home,
                provider=provider,
                model=TINY_SERVED,
                mcp_servers=servers,
                search_url=url + "/search?q={query}",
                fetch_allow=("127.0.0.1/32",),  # the loopback web: refused unless allow-listed
                env=env,
                clock=CLOCK,
                store=store,
            ) as up,
        ):
            yield HarnessRig(home, up, web, url, ledger, remote, engine)


@contextmanager
def in_process_engine(home: Home) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The tiny model's engine in this process, and the proxy provider that reaches it:
    what ``affidavit up`` runs as a process of its own, here so that a test can read the
    engine's counters and plant a fault in it (``up`` itself runs it apart: see
    ``test_up.py``)."""
    import torch

    from inference.engine_token import new_token, write_token_file
    from inference.make_model import make_model
    from inference.server import Engine, create_app

    torch.set_num_threads(1)  # two cores: the proxy and the harness need the other
    home.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home.root / "model"
    if not (path / "config.json").is_file():
        make_model(path)
    engine = Engine(path, model_name=TINY_SERVED).start()
    try:
        token_file = write_token_file(home.root / "engine.token", new_token())
        with _serve(create_app(engine, token=token_file.read_text().strip())) as url:
            yield (
                engine,
                {
                    "api": "openai",
                    "base_url": url,
                    "engine_extensions": True,
                    "api_key_file": str(token_file),
                },
            )
    finally:
        engine.close()


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
