"""A stdio MCP server that hangs on demand, for the proxy's fault tests (the SDK's ``Server``).

Run as a script (the proxy spawns it). It appends one JSON line per event to the file
``FAULT_LOG`` names, each with this process's ``pid``:

- ``{"event": "call", "tool", "arguments", "id"}`` when a tool call starts (``id``: the
  JSON-RPC id the proxy gave it);
- ``{"event": "received", "method": "notifications/cancelled", "params"}`` for every
  ``notifications/cancelled`` read from stdin, written as it is read, before the SDK acts on
  it (so the line is there even if the process is stopped straight after).

Its tools:

- ``hang {}``: never answers (sleeps until cancelled);
- ``wait_for {path}``: answers its pid once the file ``path`` exists (a call the test holds
  open and then lets go);
- ``pid {}``: this process's id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

TOOLS = [
    types.Tool(name=name, input_schema={"type": "object"}) for name in ("hang", "wait_for", "pid")
]


def note(event: dict[str, Any]) -> None:
    with open(os.environ["FAULT_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({**event, "pid": os.getpid()}) + "\n")


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    note({"event": "call", "tool": params.name, "arguments": args, "id": ctx.request_id})
    if params.name == "hang":
        await anyio.sleep_forever()
    elif params.name == "wait_for":
        while not Path(str(args["path"])).exists():
            await anyio.sleep(0.05)
    elif params.name != "pid":
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(os.getpid()))])


server = Server("test-hang", on_list_tools=list_tools, on_call_tool=call_tool)


async def tap(
    source: ObjectReceiveStream[SessionMessage | Exception],
    sink: ObjectSendStream[SessionMessage | Exception],
) -> None:
    """Pass every message on, noting each ``notifications/cancelled`` as it arrives."""
    async with source, sink:
        async for item in source:
            if isinstance(item, SessionMessage):
                message = item.message.model_dump(mode="json", by_alias=True, exclude_none=True)
                if message.get("method") == "notifications/cancelled":
                    note(
                        {
                            "event": "received",
                            "method": message["method"],
                            "params": message.get("params"),
                        }
                    )
            await sink.send(item)


async def main() -> None:
    async with stdio_server() as (read, write), anyio.create_task_group() as tasks:
        sink, tapped = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        tasks.start_soon(tap, read, sink)
        await server.run(tapped, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
