"""Sessions survive a restart of the proxy (``session_book`` and ``SessionRegistry.restore``).

Each test runs a real proxy over a real SQLite store and session book in front of a scripted
loopback upstream, drives it with the official ``openai`` SDK, stops it, and starts a second
proxy on the same port, store and book. The client keeps its ``base_url`` and token:

- the session answers again, with the pins last set (a ``pins.set`` after opening), the
  derived tool-call ids of a pinned session still taken back to the upstream's ids, and a
  wrong token still refused;
- the token itself is in neither the book nor the record (only its SHA-256, in the book),
  and a model call writes nothing to the book (no extra fsync on the per-call path);
- a replay plan armed before the restart continues at the step it had reached, so the next
  step is judged against its own recorded twin, and its earlier verdicts are kept; the tool
  results it served stay served, so the next call gets the next recorded result;
- a session opened with no book is gone after a restart (the book is what carries it).

The SIGKILL case, at random phases with resume, is ``tests/harness/test_proxy_restart.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from egress_proxy.replay_plan import VERDICT_KEY
from egress_proxy.server import ProxyServer
from egress_proxy.session_book import SessionBook
from record.digest import tool_call_id
from record.log import Log
from record.schema import ModelRequest, ModelResponse, ToolResult
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Script,
    proxy_config,
    read_bodies,
)
from tests.egress_proxy.tool_rig import REMOTE_TOKEN, Remote, meta, rpc

SEED = 77
UPSTREAM_IDS = ["call_Rnd0upstreamA", "call_Rnd0upstreamB"]


def tool_reply(ids: list[str]) -> bytes:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }
    choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
    reply = {
        "id": "r",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }
    return json.dumps(reply).encode()


def text_reply(text: str) -> bytes:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "finish_reason": "stop", "message": message}
    reply = {
        "id": "r",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }
    return json.dumps(reply).encode()


@dataclass
class Place:
    """What outlives a proxy: its store, key, session book and port; and the upstream."""

    store: Path
    book: Path
    appliance: KeyPair
    user: KeyPair
    upstream: FakeUpstream
    upstream_url: str
    port: int = 0


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as server:
        yield Place(
            tmp_path / "record.db",
            tmp_path / "proxy-sessions.db",
            KeyPair.generate(),
            KeyPair.generate(),
            upstream,
            server.url,
        )
    assert not upstream.errors, upstream.errors


@contextmanager
def proxy_at(place: Place, tools_url: str | None = None) -> Iterator[ProxyServer]:
    """One run of the proxy; the first picks a port, later runs take the same one.
    ``tools_url``: a remote MCP server mounted as ``remote``."""
    log = Log.open(place.store, appliance_key=place.appliance)
    servers = {
        "remote": {
            "transport": "streamable_http",
            "url": tools_url,
            "bearer_token_env": "TEST_REMOTE_MCP_TOKEN",
        }
    }
    config = proxy_config(place.upstream_url, **({"mcp_servers": servers} if tools_url else {}))
    env = {**ENV, "TEST_REMOTE_MCP_TOKEN": REMOTE_TOKEN}
    try:
        with ProxyServer(config, log, env=env, port=place.port, sessions=place.book) as proxy:
            place.port = proxy.port
            yield proxy
    finally:
        log.close()


def book_bytes(book: Path) -> list[bytes]:
    """The session book's files as they are on disk (the database, its WAL)."""
    return [p.read_bytes() for p in sorted(book.parent.glob(book.name + "*"))]


def sdk(base_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=token, max_retries=0)


def test_a_session_keeps_its_url_token_pins_and_tool_ids_across_a_restart(place: Place) -> None:
    with proxy_at(place) as first:
        opened = first.registry.open_session([place.user.recipient], {"app": "x"}, {"seed": 1})
        first.registry.set_pins(opened.session_id, {"seed": SEED, "temperature": 0.5})
        place.upstream.script = Script(chunks=[tool_reply(UPSTREAM_IDS)])
        client = sdk(opened.openai_base_url, opened.token)
        before = book_bytes(place.book)
        asked = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert book_bytes(place.book) == before  # a call writes nothing to the book
        delivered = [c.id for c in asked.choices[0].message.tool_calls or []]
        url = first.url
    bodies = read_bodies(place.store, opened.session_id, place.user)
    request = next(b for _, b in bodies.values() if isinstance(b, ModelRequest))
    assert delivered == [tool_call_id(request.prompt_digest, SEED, n) for n in range(2)]

    with proxy_at(place) as second:
        assert second.url == url  # the same port: the client's base_url still names it
        assert second.restored.sessions == [opened.session_id] and not second.restored.left_out
        restored = second.registry.get(opened.session_id)
        assert restored is not None and restored.labels == {"app": "x"}
        place.upstream.script = Script(chunks=[text_reply("done")])
        place.upstream.received.clear()
        messages: list[Any] = [
            {"role": "user", "content": "hi"},
            asked.choices[0].message.model_dump(exclude_none=True, include={"role", "tool_calls"}),
            *[{"role": "tool", "tool_call_id": d, "content": "ok"} for d in delivered],
        ]
        again = client.chat.completions.create(model="m", messages=messages)  # same client
        assert again.choices[0].message.content == "done"
        assert again.model_extra is not None and again.model_extra["affidavit"]["seq"] > 0
        (sent,) = [json.loads(r.body) for r in place.upstream.received]
        # the pins last set, and the upstream's own ids: the derived ones went back
        assert sent["seed"] == SEED and sent["temperature"] == 0.5
        assert [c["id"] for c in sent["messages"][1]["tool_calls"]] == UPSTREAM_IDS
        assert [m["tool_call_id"] for m in sent["messages"][2:]] == UPSTREAM_IDS
        with pytest.raises(openai.AuthenticationError):
            sdk(opened.openai_base_url, opened.token + "x").chat.completions.create(
                model="m", messages=[]
            )
        assert len(place.upstream.received) == 1  # the refused call never left

    token = opened.token.encode()
    assert token not in place.book.read_bytes() and token not in place.store.read_bytes()
    booked = SessionBook(place.book)
    try:
        (row,) = booked.sessions()
    finally:
        booked.close()
    assert row.token_digest == hashlib.sha256(token).digest() and row.armed is None


def test_an_armed_replay_continues_at_the_step_it_had_reached(place: Place) -> None:
    prompts = [[{"role": "user", "content": f"step {n}"}] for n in range(2)]
    replies = [text_reply("first"), text_reply("second")]
    with proxy_at(place) as first:
        old = first.registry.open_session([place.user.recipient])
        client = sdk(old.openai_base_url, old.token)
        for prompt, reply in zip(prompts, replies, strict=True):
            place.upstream.script = Script(chunks=[reply])
            client.chat.completions.create(model="m", messages=prompt)
        _, opened = first.registry.arm_replay(
            None, old.session_id, recipients=[place.user.recipient]
        )
        assert opened is not None
        replay = sdk(opened.openai_base_url, opened.token)
        place.upstream.script = Script(chunks=[replies[0]])
        replay.chat.completions.create(model="m", messages=prompts[0])

    with proxy_at(place) as second:
        assert opened.session_id in second.restored.sessions
        session = second.registry.get(opened.session_id)
        assert session is not None and session.replay is not None
        plan = session.replay
        assert plan.source == old.session_id and plan.position == 1 and len(plan.verdicts) == 1
        place.upstream.script = Script(chunks=[replies[1]])
        replay.chat.completions.create(model="m", messages=prompts[1])
        summary = plan.summary()

    bodies = read_bodies(place.store, opened.session_id, place.user)
    verdicts = [
        (b.reproducibility or {})[VERDICT_KEY]
        for _, b in bodies.values()
        if isinstance(b, ModelResponse)
    ]
    assert [v["step"] for v in verdicts] == [0, 1]  # type: ignore[index]
    assert all(v["request_identical"] and v["reply_identical"] for v in verdicts)  # type: ignore[index]
    assert summary["steps_run"] == 2 and summary["verdicts"] == verdicts


def test_an_armed_replay_serves_the_next_recorded_tool_result_after_a_restart(
    place: Place,
) -> None:
    """Two recorded calls with the same arguments are served in recorded order: the one
    served before the restart stays served, so the next call gets the second result."""
    remote = Remote(on_call=lambda name, args, headers: f"live answer {len(remote.calls)}")
    twice = [("c1", "peek", {"q": 1}), ("c2", "peek", {"q": 1})]
    reply = tool_reply_asking(twice)
    with LoopbackServer(remote.app()) as far, proxy_at(place, far.url + "/mcp") as first:
        old = first.registry.open_session([place.user.recipient])
        seq = ask(place, old, reply)
        recorded = [tool_call(old, seq, cid) for cid, _, _ in twice]
        assert [r.status_code for r in recorded] == [200, 200] and len(remote.calls) == 2
        _, opened = first.registry.arm_replay(
            None, old.session_id, recipients=[place.user.recipient]
        )
        assert opened is not None
        new_seq = ask(place, opened, reply)
        assert tool_call(opened, new_seq, "c1").status_code == 200

    with LoopbackServer(remote.app()) as far, proxy_at(place, far.url + "/mcp") as second:
        assert opened.session_id in second.restored.sessions
        served = tool_call(opened, new_seq, "c2")
        assert served.status_code == 200, served.text
        session = second.registry.get(opened.session_id)
        assert session is not None and session.replay is not None
        assert session.replay.summary()["tools_replayed"] == 2
    assert len(remote.calls) == 2  # nothing went live under the plan
    old_bodies = read_bodies(place.store, old.session_id, place.user)
    results = [s for s, (_, b) in sorted(old_bodies.items()) if isinstance(b, ToolResult)]
    new_bodies = read_bodies(place.store, opened.session_id, place.user)
    replayed = [b.replayed_from for _, b in new_bodies.values() if isinstance(b, ToolResult)]
    assert replayed == results  # c1 then c2, each its own recorded result


def tool_reply_asking(calls: list[tuple[str, str, dict[str, Any]]]) -> bytes:
    tool_calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(a)}}
        for cid, name, a in calls
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
    return json.dumps({"id": "r", "object": "chat.completion", "choices": [choice]}).encode()


def ask(place: Place, session: Any, reply: bytes) -> int:
    """One model call whose committed reply is ``reply``; the reply's seq."""
    place.upstream.script = Script(chunks=[reply])
    raw = sdk(session.openai_base_url, session.token).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "go"}]
    )
    seq: int = raw.http_response.json()["affidavit"]["seq"]
    return seq


def tool_call(session: Any, reply_seq: int, call_id: str) -> Any:
    params = {"name": "peek", "arguments": {"q": 1}, "_meta": meta(reply_seq, call_id)}
    return rpc(session, "remote", "tools/call", params)


def test_a_session_not_in_the_book_is_gone_after_a_restart(place: Place) -> None:
    """Without the book (a proxy run with no ``sessions``), nothing survives: the book is
    what carries the token across, not some other memory."""
    log = Log.open(place.store, appliance_key=place.appliance)
    try:
        with ProxyServer(proxy_config(place.upstream_url), log, env=ENV) as bare:
            place.port = bare.port
            opened = bare.registry.open_session([place.user.recipient])
    finally:
        log.close()
    with proxy_at(place) as second:
        assert second.restored.sessions == []
        with pytest.raises(openai.AuthenticationError):
            sdk(opened.openai_base_url, opened.token).chat.completions.create(
                model="m", messages=[]
            )
