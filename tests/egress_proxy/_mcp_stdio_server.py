"""A tiny stdio MCP server for the proxy's tests, written with the SDK's low-level ``Server``.

Run as a script (the proxy spawns it): ``python _mcp_stdio_server.py``. Its tools:

- ``echo {text}``: the text back;
- ``dial {port}``: try to connect to 127.0.0.1:port, say whether it could (the proxy runs
  it in a network namespace of its own, where it must not);
- ``kinds {store, stream}``: the ``(seq, kind)`` of every entry of a stream, read from the
  store file read-only in its own connection (envelopes are clear), so a test can see what
  was durable when the tool ran;
- ``fail``: a JSON-RPC error;
- ``exit``: the process ends mid-call (no answer ever comes).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

TOOLS = [
    types.Tool(name=name, input_schema={"type": "object"})
    for name in ("echo", "dial", "kinds", "fail", "exit")
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


def _dial(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return "connected"
    except OSError as exc:
        return f"no connection: {exc}"


def _kinds(store: str, stream: str) -> list[list[Any]]:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT seq, line FROM entries WHERE stream = ? ORDER BY seq", (stream,)
        )
        return [[seq, json.loads(line)["kind"]] for seq, line in rows]
    finally:
        conn.close()


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "echo":
        text = str(args.get("text", ""))
    elif params.name == "dial":
        text = _dial(int(args["port"]))
    elif params.name == "kinds":
        text = json.dumps(_kinds(str(args["store"]), str(args["stream"])))
    elif params.name == "exit":
        os._exit(3)
    elif params.name == "fail":
        raise MCPError(types.INVALID_PARAMS, "fail: as asked", {"why": "test"})
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("test-stdio", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
