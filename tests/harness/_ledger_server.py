"""A stdio MCP server with a side effect, for the harness's resume tests.

Run as a script (the proxy spawns it in its own network namespace). ``LEDGER`` (environment)
names a file; its tools:

- ``append_note {text}``: appends one line (the text's ``repr``) to the ledger: not
  idempotent (a second call adds a second line);
- ``count_notes {}``: how many lines the ledger has: idempotent;
- ``hang_once {}``: the first call (no marker file yet) kills this server mid-call, so the
  proxy records the outcome ``UNKNOWN``; later calls answer ``done``. Not idempotent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 12}},
    "required": ["text"],
}
NONE: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = [
    types.Tool(name="append_note", description="Append a note.", input_schema=TEXT),
    types.Tool(name="count_notes", description="Count the notes.", input_schema=NONE),
    types.Tool(name="hang_once", description="Do a thing once.", input_schema=NONE),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    ledger = Path(os.environ["LEDGER"])
    args = params.arguments or {}
    if params.name == "append_note":
        with ledger.open("a") as out:
            out.write(f"{str(args.get('text', ''))!r}\n")
        text = "noted"
    elif params.name == "count_notes":
        text = str(len(ledger.read_text().splitlines())) if ledger.exists() else "0"
    elif params.name == "hang_once":
        marker = ledger.with_suffix(".hung")
        if not marker.exists():
            marker.write_text("x")
            os._exit(3)
        text = "done"
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("ledger", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
