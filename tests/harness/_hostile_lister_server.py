"""A stdio MCP server, written raw, whose ``tools/list`` is hostile, for
``test_catalogue_limits.py``. ``LISTING`` picks what it lists:

- ``odd``: a name with a NUL and an escape sequence, a name 10,000 characters long, a tool
  whose input schema is a megabyte, and one good tool ``fine``;
- ``many``: 2,000 tools.

Every ``tools/call`` answers ``{"content": [{"type": "text", "text": "ok"}]}``.
"""

from __future__ import annotations

import json
import os
import sys

OBJECT = {"type": "object"}


def listing() -> list[dict[str, object]]:
    if os.environ["LISTING"] == "many":
        return [{"name": f"t{i}", "inputSchema": OBJECT} for i in range(2000)]
    huge = {"type": "object", "description": "x" * 1_000_000}
    return [
        {"name": "a\x00b\x1b[31m", "inputSchema": OBJECT},
        {"name": "x" * 10_000, "inputSchema": OBJECT},
        {"name": "huge", "inputSchema": huge},
        {"name": "fine", "inputSchema": OBJECT},
    ]


def main() -> None:
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        reply: dict[str, object] = {"jsonrpc": "2.0", "id": message["id"]}
        if message["method"] == "initialize":
            reply["result"] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "lister", "version": "1"},
            }
        elif message["method"] == "tools/list":
            reply["result"] = {"tools": listing()}
        else:
            reply["result"] = {"content": [{"type": "text", "text": "ok"}]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
