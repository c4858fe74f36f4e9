"""Derived tool-call ids, against real proxies on loopback, real provider captures and the
real embedded engine, through the official SDKs.

- Pinned sessions, upstream with random ids (the recorded OpenAI and Anthropic captures,
  streamed in 61-byte pieces, and non-streamed replies): the client gets exactly the
  upstream's bytes with each id replaced by ``tool_call_id(prompt_digest, seed, ordinal)``
  (ordinals in order of first appearance), plus the annotation; the SDK assembles the
  message with the derived ids. The record keeps the upstream's bytes verbatim and the
  mapping in ``reproducibility["affidavit_tool_call_ids"]``; the annotation repeats it.
- The next request quotes the derived ids (``assistant.tool_calls[].id``,
  ``tool.tool_call_id``; Anthropic ``tool_use.id``, ``tool_result.tool_use_id``): the upstream
  receives its own ids, the record keeps both what the client sent and what was sent; so it
  does after the session is unpinned.
- Unpinned sessions: the client's bytes are the upstream's plus the annotation, byte for
  byte; no mapping is recorded.
- The embedded engine, pinned through the proxy (clock and strict cache as engine
  extensions): it derives the same ids itself, so the mapping is the identity and the
  client's bytes are the engine's plus the annotation; the engine's block names the
  record's prompt digest and the injected clock.
- The rewrite itself: only ``id`` values are replaced, whole tokens, never text that merely
  contains an id; the result is the same whatever the chunking.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from egress_proxy.clock import Clock
from egress_proxy.server import ProxyServer
from egress_proxy.sse import EventSplitter, iter_events
from egress_proxy.tool_ids import RECORD_KEY, Deriver, ToolIdTable, map_back, replace_id_tokens
from record.digest import prompt_digest, tool_call_id
from record.log import Log
from record.schema import ModelRequest, ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    Rig,
    Script,
    chunked,
    proxy_config,
    read_bodies,
    split_annotation,
)

OPENAI_PARALLEL = "openai/f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin"
OPENAI_SINGLE = "openai/2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin"
ANTHROPIC_TOOL_USE = "anthropic/tool_use_response.txt"
SEED = 1234
CLOCK = "2026-11-30T14:20:30Z"
#: A tool without parameters: the tiny model's grammar-bound call is ``{}``, within budget.
GET_TIME: Any = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def streams(vectors: Path) -> Path:
    return vectors / "provider-streams"


def ids_of(data: bytes, prefix: bytes) -> list[str]:
    """Upstream ids in order of first appearance, found the simple way (the test's oracle)."""
    found: list[str] = []
    for piece in data.split(b'"id":"' + prefix)[1:]:
        value = (prefix + piece.split(b'"', 1)[0]).decode()
        if value not in found:
            found.append(value)
    return found


def substituted(data: bytes, mapping: list[tuple[str, str]]) -> bytes:
    for upstream, derived in mapping:
        assert data.count(f'"{upstream}"'.encode()) == 1  # the capture names each id once
        data = data.replace(f'"{upstream}"'.encode(), f'"{derived}"'.encode())
    return data


def entries(rig: Rig, stream: str, note: dict[str, Any]) -> tuple[ModelRequest, ModelResponse]:
    bodies = rig.bodies(stream)
    request, response = bodies[note["request_seq"]][1], bodies[note["seq"]][1]
    assert isinstance(request, ModelRequest) and isinstance(response, ModelResponse)
    return request, response


def expected_mapping(data: bytes, prefix: bytes, request: ModelRequest) -> list[tuple[str, str]]:
    return [
        (upstream, tool_call_id(request.prompt_digest, SEED, ordinal))
        for ordinal, upstream in enumerate(ids_of(data, prefix))
    ]


@pytest.mark.parametrize("capture", [OPENAI_PARALLEL, OPENAI_SINGLE])
def test_openai_streams_deliver_derived_ids_and_take_them_back(
    fresh: Rig, streams: Path, capture: str
) -> None:
    rig = fresh
    data = (streams / capture).read_bytes()
    session = rig.open_session(pins={"seed": SEED, "temperature": 0})
    rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")
    ask = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"weather?"}]}'
    delivered = httpx.post(
        f"{session.openai_base_url}/chat/completions",
        content=ask,
        headers={"authorization": f"Bearer {session.token}"},
    ).content
    rest, note, _ = split_annotation(delivered)
    request, response = entries(rig, session.session_id, note)
    mapping = expected_mapping(data, b"call_", request)
    assert len(mapping) == (2 if capture == OPENAI_PARALLEL else 1)
    assert rest == substituted(data, mapping)  # the upstream's bytes, ids replaced, no more
    assert response.response_bytes == data  # the record keeps the upstream's own
    pairs = [{"upstream": u, "derived": d} for u, d in mapping]
    assert response.reproducibility == {RECORD_KEY: pairs}
    assert note["tool_call_ids"] == pairs

    # The SDK assembles the message with the derived ids, and quotes them back next time.
    rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    messages: Any = [{"role": "user", "content": "weather?"}]
    with gpt.chat.completions.stream(model="m", messages=messages) as stream:
        message = stream.get_final_completion().choices[0].message
    assert [c.id for c in message.tool_calls or []] == [d for _, d in mapping]
    messages.append(message.model_dump(exclude_none=True, include={"role", "tool_calls"}))
    messages += [{"role": "tool", "tool_call_id": d, "content": "sunny"} for _, d in mapping]
    rig.upstream.script = Script(chunks=[b'{"id":"x","object":"chat.completion","choices":[]}'])
    raw = gpt.chat.completions.with_raw_response.create(model="m", messages=messages)
    note = raw.parse().model_extra["affidavit"]  # type: ignore[index]
    sent = json.loads(rig.upstream.received[-1].body)
    assert [c["id"] for c in sent["messages"][1]["tool_calls"]] == [u for u, _ in mapping]
    assert [m["tool_call_id"] for m in sent["messages"][2:]] == [u for u, _ in mapping]
    request, _ = entries(rig, session.session_id, note)
    assert request.request_bytes == rig.upstream.received[-1].body
    assert request.prompt_digest == prompt_digest(sent)
    quoted = json.loads(request.input_bytes)
    assert [m["tool_call_id"] for m in quoted["messages"][2:]] == [d for _, d in mapping]

    rig.proxy.registry.set_pins(session.session_id, None)  # issued ids still go back
    raw = gpt.chat.completions.with_raw_response.create(model="m", messages=messages)
    assert raw.parse().model_extra["affidavit"]["tool_call_ids"] is None  # type: ignore[index]
    sent = json.loads(rig.upstream.received[-1].body)
    assert [m["tool_call_id"] for m in sent["messages"][2:]] == [u for u, _ in mapping]


def test_a_cut_stream_records_the_ids_it_delivered(fresh: Rig, streams: Path) -> None:
    rig = fresh
    data = (streams / OPENAI_SINGLE).read_bytes()
    head = b"\n\n".join(data.split(b"\n\n", 2)[:2]) + b"\n\n"  # two events: the id is in them
    rig.upstream.script = Script(chunks=[head], content_type="text/event-stream", cut=True)
    session = rig.open_session(pins={"seed": SEED})
    got = b""
    with httpx.Client(timeout=10) as client, pytest.raises(httpx.HTTPError):
        request = client.build_request(
            "POST",
            f"{session.openai_base_url}/chat/completions",
            content=b'{"model":"m","stream":true,"messages":[]}',
            headers={"authorization": f"Bearer {session.token}"},
        )
        response = client.send(request, stream=True)
        seq = int(response.headers["affidavit-request-seq"])
        for chunk in response.iter_raw():
            got += chunk
    deadline = time.monotonic() + 10
    while not isinstance(
        reply := rig.bodies(session.session_id).get(seq + 1, (None, None))[1], ModelResponse
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    request_entry = rig.bodies(session.session_id)[seq][1]
    assert isinstance(request_entry, ModelRequest)
    ((upstream, derived),) = expected_mapping(data, b"call_", request_entry)
    assert reply.outcome == "UNKNOWN" and reply.response_bytes == head
    assert reply.reproducibility == {RECORD_KEY: [{"upstream": upstream, "derived": derived}]}
    assert got == substituted(head, [(upstream, derived)])


def test_a_non_streamed_reply_gets_derived_ids_too(fresh: Rig) -> None:
    rig = fresh
    upstream_ids = ["call_Zq0randomA", "call_Zq0randomB"]
    reply = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": 'I will call "call_Zq0randomA" twice',  # text is not an id
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        for i in upstream_ids
                    ],
                },
            }
        ],
    }
    data = json.dumps(reply, indent=2).encode()
    rig.upstream.script = Script(chunks=[data])
    session = rig.open_session(pins={"seed": SEED})
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = gpt.chat.completions.with_raw_response.create(model="m", messages=[])
    completion = raw.parse()
    note = completion.model_extra["affidavit"]  # type: ignore[index]
    request, response = entries(rig, session.session_id, note)
    derived = [tool_call_id(request.prompt_digest, SEED, n) for n in range(2)]
    message = completion.choices[0].message
    assert [c.id for c in message.tool_calls or []] == derived
    assert message.content == 'I will call "call_Zq0randomA" twice'
    expected = data
    for upstream, new in zip(upstream_ids, derived, strict=True):
        expected = expected.replace(f'"id": "{upstream}"'.encode(), f'"id": "{new}"'.encode())
    delivered = raw.http_response.content
    assert delivered.startswith(expected[:-1]) and delivered.endswith(b"}")  # then the splice
    assert response.response_bytes == data
    assert response.reproducibility == {
        RECORD_KEY: [
            {"upstream": u, "derived": d} for u, d in zip(upstream_ids, derived, strict=True)
        ]
    }


def test_anthropic_tool_use_ids_are_derived_and_taken_back(fresh: Rig, streams: Path) -> None:
    rig = fresh
    data = (streams / ANTHROPIC_TOOL_USE).read_bytes()
    session = rig.open_session(pins={"seed": SEED, "top_k": 5})
    rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    messages: Any = [{"role": "user", "content": "weather in Paris?"}]
    with claude.messages.stream(model="m", max_tokens=100, messages=messages) as stream:
        message = stream.get_final_message()
    bodies = rig.bodies(session.session_id)
    response = bodies[max(bodies)][1]
    assert isinstance(response, ModelResponse)
    request = bodies[response.request_seq][1]
    assert isinstance(request, ModelRequest)
    mapping = expected_mapping(data, b"toolu_", request)
    ((upstream, derived),) = mapping
    assert message.content[1].type == "tool_use" and message.content[1].id == derived
    assert response.response_bytes == data
    assert response.reproducibility == {RECORD_KEY: [{"upstream": upstream, "derived": derived}]}

    rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")
    delivered = httpx.post(
        f"{session.base_url}/v1/messages",
        content=json.dumps({"model": "m", "max_tokens": 9, "stream": True, "messages": messages}),
        headers={"x-api-key": session.token},
    ).content
    rest, note, _ = split_annotation(delivered)
    assert rest == substituted(data, mapping)
    assert note["tool_call_ids"] == [{"upstream": upstream, "derived": derived}]

    messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
    result = {"type": "tool_result", "tool_use_id": derived, "content": "sunny"}
    messages.append({"role": "user", "content": [result]})
    rig.upstream.script = Script(
        chunks=[b'{"id":"m","type":"message","role":"assistant","content":[],"model":"m"}']
    )
    claude.messages.create(model="m", max_tokens=9, messages=messages)
    sent = json.loads(rig.upstream.received[-1].body)
    assert sent["messages"][1]["content"][1]["id"] == upstream
    assert sent["messages"][2]["content"][0]["tool_use_id"] == upstream


def test_unpinned_sessions_get_the_upstream_bytes_and_the_annotation_only(
    fresh: Rig, streams: Path
) -> None:
    rig = fresh
    session = rig.open_session()
    for capture, path in ((OPENAI_PARALLEL, "/v1/chat/completions"), (ANTHROPIC_TOOL_USE, "")):
        data = (streams / capture).read_bytes()
        rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")
        delivered = httpx.post(
            session.base_url + (path or "/v1/messages"),
            content=b'{"model":"m","stream":true,"max_tokens":5,"messages":[]}',
            headers={"authorization": f"Bearer {session.token}"},
        ).content
        rest, note, _ = split_annotation(delivered)
        assert rest == data
        assert note["tool_call_ids"] is None
        _, response = entries(rig, session.session_id, note)
        assert response.response_bytes == data and response.reproducibility is None


def test_only_whole_id_values_are_replaced_whatever_the_chunking() -> None:
    table = {"call_a": "call_X"}
    raw = b'{"id" : "call_a", "text": "call_a", "x": {"id":"call_b"}, "k": ["call_a"]}'
    assert replace_id_tokens(raw, table) == (
        b'{"id" : "call_X", "text": "call_a", "x": {"id":"call_b"}, "k": ["call_a"]}'
    )
    tricky = b'{"content":"say \\"id\\":\\"call_a\\"","id":"call_a"}'
    assert replace_id_tokens(tricky, table) == tricky.replace(b'"id":"call_a"}', b'"id":"call_X"}')

    events = (
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a"}]}}]}\r\n'
        b"\r\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"call_a"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":\n'  # one event, two data lines
        b'data: [{"index":1,"id":"call_b"}]}}]}\n\n'  # (re-emitted as one line)
        b"data: [DONE]\n\n"
    )
    whole = Deriver("openai", "sha256:" + "0" * 64, 7)
    scanned = Deriver("openai", "sha256:" + "0" * 64, 7).scan(events, streamed=True)
    expected = b"".join(whole.rewrite_event(block) for block in _blocks(events))
    assert whole.pairs == scanned and [u for u, _ in scanned] == ["call_a", "call_b"]
    assert expected.count(b"call_a") == 1  # the content text, untouched
    for size in (1, 3, 17, len(events)):
        deriver = Deriver("openai", "sha256:" + "0" * 64, 7)
        got = _run(deriver.rewrite_stream(_chunks(events, size)))
        assert got == expected and deriver.pairs == scanned


def test_map_back_leaves_unknown_ids_alone() -> None:
    table = ToolIdTable()
    table.add("call_derived", "call_upstream")
    table.add("call_same", "call_same")  # identity: nothing to remember
    assert len(table) == 1
    request: dict[str, Any] = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "call_derived"}, {"id": "call_other"}]},
            {"role": "tool", "tool_call_id": "call_derived", "content": "x"},
        ]
    }
    back = map_back("openai", request, table)
    assert back is not None
    assert back["messages"][0]["tool_calls"] == [{"id": "call_upstream"}, {"id": "call_other"}]
    assert back["messages"][1]["tool_call_id"] == "call_upstream"
    assert request["messages"][1]["tool_call_id"] == "call_derived"  # the input is left alone
    assert map_back("openai", {"messages": [{"role": "user", "content": "hi"}]}, table) is None


def test_the_engine_derives_the_same_ids_so_the_mapping_is_the_identity(
    engine_url: str, tmp_path: Path
) -> None:
    user = KeyPair.generate()
    config = proxy_config(engine_url, inject_clock=True, engine_extensions=True)
    with (
        Log.open(tmp_path / "r.db", appliance_key=KeyPair.generate()) as log,
        ProxyServer(config, log, env=ENV, clock=Clock.fixed(CLOCK)) as proxy,
    ):
        session = proxy.registry.open_session(
            [user.recipient], pins={"seed": SEED, "temperature": 0.7, "strict_cache": True}
        )
        ask = {
            "model": "tiny",
            "stream": True,
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "weather in Oslo?"}],
            "tools": [GET_TIME],
            "tool_choice": "required",
        }
        delivered = httpx.post(
            f"{session.openai_base_url}/chat/completions",
            json=ask,
            headers={"authorization": f"Bearer {session.token}"},
            timeout=60,
        ).content
    rest, note, _ = split_annotation(delivered)
    bodies = {
        s: b for s, (_, b) in read_bodies(tmp_path / "r.db", session.session_id, user).items()
    }
    request, response = bodies[note["request_seq"]], bodies[note["seq"]]
    assert isinstance(request, ModelRequest) and isinstance(response, ModelResponse)
    assert rest == response.response_bytes  # identity: not one byte rewritten
    sent = json.loads(request.request_bytes)
    assert (sent["clock"], sent["strict_cache"], sent["seed"]) == (CLOCK, True, SEED)
    ids = [
        call["id"]
        for event in iter_events(rest)
        for choice in (event.json() or {}).get("choices", [])
        for call in choice.get("delta", {}).get("tool_calls", [])
        if "id" in call
    ]
    assert ids and ids == [tool_call_id(request.prompt_digest, SEED, n) for n in range(len(ids))]
    block = response.reproducibility or {}
    assert block[RECORD_KEY] == [{"upstream": i, "derived": i} for i in ids]
    assert block["prompt_digest"] == request.prompt_digest == note["prompt_digest"]
    assert (block["clock"], block["kv_cache_mode"], block["seed"]) == (CLOCK, "strict", SEED)
    assert note["clock"] == request.clock == CLOCK


def _blocks(data: bytes) -> list[bytes]:
    splitter = EventSplitter()
    blocks = splitter.feed(data)
    return [*blocks, splitter.tail] if splitter.tail else blocks


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _run(body: AsyncIterator[bytes]) -> bytes:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in body])

    return asyncio.run(collect())


def test_responses_call_ids_are_derived_in_every_event_and_taken_back() -> None:
    """A Responses stream names a call's ``call_id`` in several events (added, done, the
    completed response): each gets the one derived id; the item's own ``id`` stays."""
    digest = prompt_digest({"model": "m", "input": "hi"})
    item = {"type": "function_call", "id": "fc_up", "call_id": "call_up1", "name": "f",
            "arguments": "{}", "status": "completed"}  # fmt: skip
    events = [
        {"type": "response.output_item.added", "sequence_number": 0, "output_index": 0,
         "item": {**item, "arguments": "", "status": "in_progress"}},
        {"type": "response.output_item.done", "sequence_number": 1, "output_index": 0,
         "item": item},
        {"type": "response.completed", "sequence_number": 2,
         "response": {"id": "resp_up", "output": [item, {**item, "call_id": "call_up2"}]}},
    ]  # fmt: skip
    stream = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    table = ToolIdTable()
    deriver = Deriver("responses", digest, SEED, on_new=table.add)
    delivered = b"".join(deriver.rewrite_event(block) for block in _blocks(stream))
    first, second = tool_call_id(digest, SEED, 0), tool_call_id(digest, SEED, 1)
    assert deriver.pairs == [("call_up1", first), ("call_up2", second)]
    assert delivered == stream.replace(b"call_up1", first.encode()).replace(
        b"call_up2", second.encode()
    )  # every other byte where it was: the item id "fc_up" too
    assert Deriver("responses", digest, SEED).scan(stream, True) == deriver.pairs
    whole = json.dumps(events[2]["response"]).encode()
    assert (
        json.loads(Deriver("responses", digest, SEED).rewrite_json(whole))["output"][1]["call_id"]
        == second
    )
    asked = {
        "model": "m",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "id": "fc_up", "call_id": first, "name": "f",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": first, "output": "ok"},
            {"type": "function_call_output", "call_id": "call_unknown", "output": "ok"},
        ],
    }  # fmt: skip
    back = map_back("responses", asked, table)
    assert back is not None
    assert [i.get("call_id") for i in back["input"]] == [
        None,
        "call_up1",
        "call_up1",
        "call_unknown",
    ]
    assert map_back("responses", {"input": "hi"}, table) is None
