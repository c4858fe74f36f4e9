"""Helpers for the proxy's tests: real servers on loopback and readers of the record.

The upstream is a raw ASGI app under uvicorn on 127.0.0.1 (a free port): it records every
request it receives and plays the reply a test scripted, in the chunks given, optionally
pausing on a gate or cutting the connection mid-body. The proxy is ``ProxyServer`` over a
real SQLite store.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from egress_proxy.config import ProxyConfig, parse_config
from egress_proxy.server import ProxyServer
from egress_proxy.sse import EventSplitter, parse_event
from record.backends import open_store
from record.log import Log
from record.reader import StreamKeys
from record.schema import Entry, Strict, parse_entry
from record.seal import KeyPair

OPENAI_KEY = "sk-upstream-openai-0123456789"
ANTHROPIC_KEY = "sk-ant-upstream-0123456789"
ENV = {"TEST_OPENAI_KEY": OPENAI_KEY, "TEST_ANTHROPIC_KEY": ANTHROPIC_KEY}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Script:
    """One scripted reply. ``gate``: wait for it after the first ``pause_after`` chunks."""

    chunks: Sequence[bytes] = (b"{}",)
    status: int = 200
    content_type: str = "application/json"
    cut: bool = False  # drop the connection after the chunks, without ending the body
    gate: threading.Event | None = None
    pause_after: int = 1
    waiting: threading.Event = field(default_factory=threading.Event)  # set while at the gate
    delay_s: float = 0.0  # between chunks


@dataclass
class FakeUpstream:
    """The scripted upstream. ``on_request(received)`` runs before any reply byte is sent."""

    script: Script = field(default_factory=Script)
    queue: list[Script] = field(default_factory=list)  # played first, one per request
    received: list[Received] = field(default_factory=list)
    on_request: Callable[[Received], None] | None = None
    errors: list[BaseException] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        got = Received(
            scope["path"],
            {k.decode().lower(): v.decode() for k, v in scope["headers"]},
            await request_body(receive),
        )
        self.received.append(got)
        if self.on_request is not None:
            try:
                self.on_request(got)
            except BaseException as exc:  # reported by the test, not lost in uvicorn's log
                self.errors.append(exc)
        s = self.queue.pop(0) if self.queue else self.script
        headers = [(b"content-type", s.content_type.encode())]
        await send({"type": "http.response.start", "status": s.status, "headers": headers})
        for i, chunk in enumerate(s.chunks):
            if s.gate is not None and i == s.pause_after:
                s.waiting.set()
                await asyncio.to_thread(s.gate.wait, 10)
                s.waiting.clear()
            if s.delay_s and i:
                await asyncio.sleep(s.delay_s)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if s.cut:
            raise ConnectionAbortedError("scripted cut")  # uvicorn drops the connection
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def request_body(receive: Any) -> bytes:
    """An ASGI request's whole body, its ``http.request`` messages joined."""
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return bytes(body)


class LoopbackServer:
    """Any ASGI app under uvicorn on 127.0.0.1, a free port, in a thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def chunked(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes: boundaries fall inside events, as on a network."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def proxy_config(
    upstream_url: str,
    *,
    inject_clock: bool = False,
    engine_extensions: bool = False,
    **overrides: Any,
) -> ProxyConfig:
    """Both providers on ``upstream_url``. The clock is off unless asked for, so a test of the
    byte path sees the client's request unchanged; ``test_clock.py`` turns it on."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "providers": {
            "openai": {
                "api": "openai",
                "base_url": upstream_url,
                "api_key_env": "TEST_OPENAI_KEY",
                "inject_clock": inject_clock,
                "engine_extensions": engine_extensions,
            },
            "anthropic": {
                "api": "anthropic",
                "base_url": upstream_url,
                "api_key_env": "TEST_ANTHROPIC_KEY",
                "inject_clock": inject_clock,
            },
        },
        "mounts": {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"},
    }
    doc.update(overrides)
    return parse_config(doc)


def read_bodies(
    store_path: Path | str, stream: str, key: KeyPair
) -> dict[int, tuple[Entry, Strict]]:
    """Every entry of ``stream`` with its opened body, read from the store (a file or a
    PostgreSQL URL) read-only."""
    store = open_store(store_path, readonly=True)
    try:
        entries = [parse_entry(e.line) for e in store.entries(stream)]
    finally:
        store.close()
    keys = StreamKeys.collect(stream, entries, key)
    return {e.seq: (e, keys.open(e)) for e in entries}


@dataclass
class Rig:
    """An upstream, a proxy in front of it, its store, and the keys that open the record."""

    upstream: FakeUpstream
    upstream_url: str
    proxy: ProxyServer
    log: Log
    store_path: Path
    user: KeyPair
    appliance: KeyPair

    def open_session(self, pins: dict[str, Any] | None = None) -> Any:
        return self.proxy.registry.open_session([self.user.recipient], {"test": "yes"}, pins)

    def bodies(self, stream: str) -> dict[int, tuple[Entry, Strict]]:
        return read_bodies(self.store_path, stream, self.user)


def split_annotation(delivered: bytes) -> tuple[bytes, dict[str, Any], int]:
    """``(delivered minus the annotation event, the annotation, its event index)``.

    Fails unless there is exactly one annotation event, whole, on an event boundary.
    """
    splitter = EventSplitter()
    blocks = splitter.feed(delivered)
    found = []
    for i, block in enumerate(blocks):
        event = parse_event(block)
        data = event.json() or {}
        if event.name == "affidavit" or "affidavit" in data:
            found.append(i)
    assert len(found) == 1, f"{len(found)} annotation events"
    index = found[0]
    event = parse_event(blocks[index])
    found_data = event.json()
    assert found_data is not None
    if event.name == "affidavit":
        assert found_data["type"] == "affidavit"
    else:
        assert found_data["object"] == "chat.completion.chunk"
        assert found_data["choices"] == []
    rest = b"".join(blocks[:index] + blocks[index + 1 :]) + splitter.tail
    return rest, found_data["affidavit"], index
