"""A stdio MCP server with state in its process, for the per-session lifecycle tests.

Run as a script (the proxy spawns it). Its tools:

- ``bump {}``: adds one to a counter held in memory and answers the new value, so two
  callers that share a process see each other's bumps and two that do not, do not;
- ``pid {}``: this process's id, so a test can check that an idle process is gone.

With ``CRASH_AT_START`` set in its environment it writes that text to stderr and exits 4
before it reads a byte: a server that crashes at start. With ``FAIL_LIST`` set it starts
but answers ``tools/list`` with a JSON-RPC error carrying that text.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

TOOLS = [types.Tool(name=name, input_schema={"type": "object"}) for name in ("bump", "pid")]
COUNT = 0


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    if os.environ.get("FAIL_LIST"):
        raise MCPError(types.INTERNAL_ERROR, os.environ["FAIL_LIST"])
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    global COUNT
    if params.name == "bump":
        COUNT += 1
        text = str(COUNT)
    elif params.name == "pid":
        text = str(os.getpid())
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("test-counter", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    crash = os.environ.get("CRASH_AT_START")
    if crash:
        sys.stderr.write(crash + "\n")
        sys.exit(4)
    anyio.run(main)
