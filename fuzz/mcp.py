"""MCP messages at the proxy's tool route (``egress_proxy.mcp_gateway``): the proxy's own
pre-check of a JSON-RPC body (batches, ``tools/call`` naming, the admission rule), on a real
gateway over a real record, then the SDK's reading of the same body as its streamable-HTTP
transport does it.

Typed errors: ``ProxyError`` (the route answers it with its status) and the SDK's
``ValueError`` / ``ValidationError`` (it answers a JSON-RPC parse or params error).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pydantic_core
from mcp_types import jsonrpc_message_adapter
from pydantic import ValidationError

from egress_proxy.errors import ProxyError
from egress_proxy.mcp_gateway import McpGateway, _Target
from egress_proxy.sessions import SessionRegistry
from egress_proxy.tool_config import RemoteServer
from fuzz.common import dumps, nested
from record.log import Log
from record.seal import KeyPair

ERRORS: tuple[type[BaseException], ...] = (ProxyError, ValueError, ValidationError)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply


class _Rig:
    """One gateway, one session, one (never contacted) remote server, on a temporary record."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="affidavit-fuzz-mcp-"))
        atexit.register(self.close)
        self.log = Log.open(self.folder / "record.db", appliance_key=KeyPair.generate())
        registry = SessionRegistry(self.log)
        opened = registry.open_session([KeyPair.generate().recipient])
        server = RemoteServer(transport="streamable_http", url="http://127.0.0.1:9/mcp")
        self.gateway = McpGateway(
            {"srv": server}, self.log, registry, env={}, max_body_bytes=1 << 20
        )
        session = registry.get(opened.session_id)
        link = self.gateway.link(opened.session_id, "srv")
        assert session is not None and link is not None
        self.target = _Target(session, link, "2025-06-18")
        self.loop = asyncio.new_event_loop()

    def pre_check(self, raw: bytes) -> Any:
        return self.loop.run_until_complete(self.gateway._pre_check(self.target, raw))

    def close(self) -> None:
        self.loop.close()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_rig: _Rig | None = None


def seeds() -> list[bytes]:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    return [
        dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
        dumps({**call, "params": {"name": "peek", "arguments": {"a": 1}}}),
        dumps(
            {
                **call,
                "params": {
                    "name": "peek",
                    "arguments": {},
                    "_meta": {"affidavit/reply_seq": 3, "affidavit/call_id": "call_1"},
                },
            }
        ),
        dumps({**call, "params": {"name": "peek", "arguments": {"d": nested(200)}}}),
        dumps([{"jsonrpc": "2.0", "id": 2, "method": "ping"}]),
        dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        dumps({"jsonrpc": "2.0", "id": 1, "result": {}}),
    ]


def target(data: bytes) -> None:
    global _rig
    if _rig is None:
        _rig = _Rig()
    with contextlib.suppress(ProxyError):
        _rig.pre_check(data)
    with contextlib.suppress(ValueError, ValidationError):
        jsonrpc_message_adapter.validate_python(pydantic_core.from_json(data), by_name=False)
