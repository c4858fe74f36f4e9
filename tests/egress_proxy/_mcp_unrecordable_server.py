"""A stdio MCP server, written raw (no SDK: the SDK cannot send these), whose tools answer
what the record cannot keep as received, for ``test_mcp_unrecordable.py``.

Each ``tools/call`` is answered by its tool's name:

- ``bigint``: a result holding 2**53 + 1 (past what RFC 8785 writes exactly);
- ``nan``: a result holding ``NaN``; ``inf``: one holding ``1e400``;
- ``deep``: a result nested 150 deep (past ``record.limits.MAX_DEPTH``);
- ``bad_error``: a JSON-RPC error whose ``data`` holds 2**53 + 1;
- ``bad_utf8``: a text holding the byte 0xFF, which is not UTF-8;
- ``ok``: ``{"content": [{"type": "text", "text": "fine"}]}``.
"""

from __future__ import annotations

import json
import sys

TOOLS = ["bigint", "nan", "inf", "deep", "bad_error", "bad_utf8", "ok"]
RESULTS = {
    "bigint": b'{"content":[{"type":"text","text":"big"}],"n":9007199254740993}',
    "nan": b'{"content":[{"type":"text","text":"nan"}],"n":NaN}',
    "inf": b'{"content":[{"type":"text","text":"inf"}],"n":1e400}',
    "deep": b'{"content":[{"type":"text","text":"deep"}],"d":' + b"[" * 150 + b"]" * 150 + b"}",
    "bad_utf8": b'{"content":[{"type":"text","text":"a\xffb"}]}',
    "ok": b'{"content":[{"type":"text","text":"fine"}]}',
}


def send(raw: bytes) -> None:
    sys.stdout.buffer.write(raw + b"\n")
    sys.stdout.buffer.flush()


def main() -> None:
    for line in sys.stdin.buffer:
        message = json.loads(line)
        method, rid = message.get("method"), message.get("id")
        if rid is None:
            continue  # a notification
        head = b'{"jsonrpc":"2.0","id":%s,' % json.dumps(rid).encode()
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "unrecordable", "version": "1"},
            }
            send(head + b'"result":' + json.dumps(result).encode() + b"}")
        elif method == "tools/list":
            tools = [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]
            send(head + b'"result":' + json.dumps({"tools": tools}).encode() + b"}")
        elif method == "tools/call" and message["params"]["name"] == "bad_error":
            send(
                head
                + b'"error":{"code":-32010,"message":"it broke","data":{"n":9007199254740993}}}'
            )
        elif method == "tools/call":
            send(head + b'"result":' + RESULTS[message["params"]["name"]] + b"}")
        else:
            send(head + b'"result":{}}')


if __name__ == "__main__":
    main()
