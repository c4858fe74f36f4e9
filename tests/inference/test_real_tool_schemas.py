"""Tool schemas as real tools write them, forced on the real model (#14 line 2).

The schemas come from software nobody here wrote: four MCP servers from PyPI
(``mcp-server-time``, ``mcp-server-git``, ``mcp-server-fetch``, ``duckduckgo-mcp-server``),
listed over stdio with the official ``mcp`` client, and typed Python functions turned into
schemas by pydantic the way agent frameworks do (``Optional``, ``Literal``, nested models
under ``$defs``, discriminated unions, bounds, patterns, sets, maps). Each tool is called
once on SmolLM2-135M-Instruct with ``tool_choice`` naming it, through the official
``openai`` SDK; every argument object must pass ``jsonschema`` against the tool's schema
less the keywords the grammar leaves unconstrained (``inference.schema``).

A small model's free strings can run long: a call cut by ``max_tokens`` (``finish_reason``
``length``) is tried again under the next seed, at most :data:`TRIES` times; every call
that completes is validated.

A real-model run at length (~3.5 min on 2 cores): ``make test-long`` runs it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field, create_model

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")
    pytest.importorskip("llguidance", reason="the grammar engine comes with the `engine` extra")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from openai import OpenAI

from inference.schema import without_unconstrained
from inference.server import Engine, create_app
from tests.inference.serving import serve_in_thread

pytestmark = pytest.mark.long

TRIES = 4
MAX_TOKENS = 120
BIN = Path(sys.executable).parent


# --- typed functions, as an agent framework declares its tools ------------------------------


class Address(BaseModel):
    street: Annotated[str, Field(max_length=30)]
    city: str
    country_code: Annotated[str, Field(pattern=r"^[A-Z]{2}$")] = "FR"


class Line(BaseModel):
    sku: Annotated[str, Field(min_length=1, max_length=12)]
    quantity: Annotated[int, Field(ge=1, le=99)]


class Card(BaseModel):
    kind: Literal["card"]
    last4: Annotated[str, Field(pattern=r"^[0-9]{4}$")]


class Invoice(BaseModel):
    kind: Literal["invoice"]
    days: Annotated[int, Field(ge=0, le=90)] = 30


def place_order(
    lines: Annotated[list[Line], Field(min_length=1, max_length=3)],
    ship_to: Address,
    payment: Annotated[Card | Invoice, Field(discriminator="kind")],
    note: str | None = None,
) -> None:
    """Order goods."""


def set_alarm(
    hour: Annotated[int, Field(ge=0, le=23)],
    minute: Annotated[int, Field(ge=0, le=59)] = 0,
    days: set[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = None,
    label: Annotated[str, Field(max_length=20)] | None = None,
) -> None:
    """Set an alarm."""


def convert(
    amount: Annotated[float, Field(gt=0, lt=1e9)],
    source: Literal["EUR", "USD", "GBP"],
    target: Literal["EUR", "USD", "GBP"],
    rates: dict[str, Annotated[float, Field(ge=0)]] | None = None,
) -> None:
    """Convert money."""


def tag_photo(
    photo_id: Annotated[str, Field(pattern=r"^img-[0-9]{3}$")],
    tags: Annotated[list[Annotated[str, Field(max_length=10)]], Field(max_length=4)],
    rating: Literal[1, 2, 3, 4, 5] | None = None,
    public: bool = False,
) -> None:
    """Tag a photo."""


FUNCTIONS: list[Callable[..., None]] = [place_order, set_alarm, convert, tag_photo]


def function_schema(function: Callable[..., None]) -> dict[str, Any]:
    """The arguments' schema of a typed function, as agent frameworks build it."""
    fields: dict[str, Any] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[name] = (parameter.annotation, default)
    model = create_model(f"{function.__name__}_args", **fields)
    return model.model_json_schema()


# --- the MCP servers -------------------------------------------------------------------------


def _servers(repo: Path) -> dict[str, list[str]]:
    return {
        "time": [str(BIN / "mcp-server-time")],
        "git": [str(BIN / "mcp-server-git"), "--repository", str(repo)],
        "fetch": [str(BIN / "mcp-server-fetch")],
        "duckduckgo": [str(BIN / "duckduckgo-mcp-server")],
    }


async def _list_tools(command: list[str]) -> list[tuple[str, dict[str, Any]]]:
    params = StdioServerParameters(command=command[0], args=command[1:])
    with open("/dev/null", "w") as quiet:
        async with (
            stdio_client(params, errlog=quiet) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
    return [(tool.name, dict(tool.input_schema)) for tool in listed.tools]


@pytest.fixture(scope="module")
def mcp_tools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Any]]]:
    repo = tmp_path_factory.mktemp("git") / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    servers = _servers(repo)
    missing = [cmd[0] for cmd in servers.values() if not Path(cmd[0]).exists()]
    if missing:
        pytest.skip(f"MCP servers from the dev extra are not installed: {missing}")
    assert shutil.which("git"), "mcp-server-git needs git"
    return {name: asyncio.run(_list_tools(cmd)) for name, cmd in servers.items()}


@pytest.fixture(scope="module")
def sdk(smollm2_gguf: Path) -> Iterator[OpenAI]:
    engine = Engine(smollm2_gguf, model_name="smollm2").start()
    try:
        for url in serve_in_thread(create_app(engine), timeout_s=120):
            yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    finally:
        engine.close()


def _force(
    sdk: OpenAI, tools: list[tuple[str, Any]], name: str
) -> tuple[list[dict[str, Any]], int]:
    """The completed calls' arguments for ``name`` and how many tries were cut short."""
    openai_tools: Any = [
        {"type": "function", "function": {"name": n, "description": "", "parameters": s}}
        for n, s in tools
    ]
    choice: Any = {"type": "function", "function": {"name": name}}
    cut = 0
    for seed in range(TRIES):
        reply = sdk.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": f"Call {name} with sensible arguments."}],
            tools=openai_tools,
            tool_choice=choice,
            seed=seed,
            temperature=0.7,
            max_tokens=MAX_TOKENS,
        )
        choice_ = reply.choices[0]
        if choice_.finish_reason == "length":
            cut += 1
            continue
        assert choice_.finish_reason == "tool_calls", choice_
        [call] = choice_.message.tool_calls or []
        assert call.type == "function" and call.function.name == name
        return [json.loads(call.function.arguments)], cut
    return [], cut


@pytest.mark.timeout(900)  # one forced generation per tool of four servers on the real model
def test_mcp_servers_tools_forced_on_the_real_model(
    sdk: OpenAI, mcp_tools: dict[str, list[tuple[str, Any]]]
) -> None:
    assert len(mcp_tools) >= 4
    optional_seen = False
    for server, tools in mcp_tools.items():
        assert tools, f"{server} listed no tools"
        for name, schema in tools:
            properties = schema.get("properties", {}).values()
            optional_seen |= any({"type": "null"} in p.get("anyOf", []) for p in properties)
            arguments, cut = _force(sdk, tools, name)
            assert arguments, f"{server}/{name}: every one of {TRIES} tries ran past max_tokens"
            for value in arguments:
                jsonschema.validate(value, without_unconstrained(schema))
            print(f"{server}/{name}: {json.dumps(arguments[0])[:100]} ({cut} cut short)")
    assert optional_seen  # the `Optional` parameters that used to be refused were exercised


def test_typed_functions_forced_on_the_real_model(sdk: OpenAI) -> None:
    tools = [(f.__name__, function_schema(f)) for f in FUNCTIONS]
    keywords = json.dumps([schema for _, schema in tools])
    for keyword in ("$defs", "$ref", "oneOf", "anyOf", "pattern", "uniqueItems", "maximum"):
        assert keyword in keywords  # the schemas really use what the issue names
    for name, schema in tools:
        arguments, cut = _force(sdk, tools, name)
        assert arguments, f"{name}: every one of {TRIES} tries ran past max_tokens"
        for value in arguments:
            jsonschema.validate(value, without_unconstrained(schema))
        print(f"{name}: {json.dumps(arguments[0])[:100]} ({cut} cut short)")
