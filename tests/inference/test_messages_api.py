"""``POST /v1/messages`` on the embedded engine: Anthropic's Messages API through the official
``anthropic`` SDK, on the shipped tiny model served on loopback.

Proved here: the SDK's ``messages.stream`` helper and a plain ``messages.create`` parse the
engine's events and message; a forced tool call (``tool_choice`` ``tool``) comes back as a
``tool_use`` block whose input validates against the tool's ``input_schema`` and whose id is
the derived one (``record.digest.tool_call_id`` over this request's prompt digest); a pinned
reply is the same bytes every time, streamed or not, with its id from the request digest; the
``reproducibility`` block sits where the proxy reads it; ``stop_sequences`` end with
``stop_sequence``; a conversation with ``tool_use`` and ``tool_result`` blocks is answered;
bad requests get Anthropic's error object naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("torch", "fastapi", "uvicorn", "httpx", "anthropic", "jsonschema"):
    pytest.importorskip(_module, reason="the Messages API tests need the `engine` and `dev` extras")

import anthropic  # noqa: E402
import httpx  # noqa: E402
import jsonschema  # noqa: E402

from egress_proxy.providers import reply_facts  # noqa: E402
from inference.messages_api import MessagesRequest, chat_request  # noqa: E402
from inference.server import Engine, create_app  # noqa: E402
from record.digest import Domain, digest_hex, prompt_digest, tool_call_id  # noqa: E402
from tests.inference.serving import serve_in_thread  # noqa: E402

TIMEOUT_S = 60.0
CLOCK = "2025-06-01T12:00:00Z"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER: Any = {"name": "get_weather", "description": "the weather", "input_schema": SCHEMA}
CLOCK_TOOL: Any = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    e = Engine(tiny_model_dir, model_name="tiny").start()
    yield e
    e.close()


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    yield from serve_in_thread(create_app(engine), timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)


def _request(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 12, "messages": [{"role": "user", "content": text}]} | (
        fields
    )


def _post(http: httpx.Client, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post("/v1/messages", content=content)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of an SSE body; asserts the framing and ``message_stop`` last."""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: ") :])
        assert event["type"] == name[len("event: ") :]
        out.append((event["type"], event))
    assert out[0][0] == "message_start" and out[-1][0] == "message_stop"
    return out


def test_a_message_through_the_sdk(sdk: anthropic.Anthropic) -> None:
    system: Any = [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]
    message = sdk.messages.create(
        model="tiny",
        max_tokens=8,
        system=system,
        messages=[{"role": "user", "content": "hi"}],
        # this SDK dropped the sampling arguments; the API (and the engine) still take them
        extra_body={"seed": 7, "clock": CLOCK, "temperature": 0.8, "top_p": 0.95, "top_k": 40},
    )
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_") and len(message.id) == 4 + 32
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    (block,) = message.content
    assert block.type == "text" and block.text
    extra = message.model_extra or {}
    repro = extra["reproducibility"]
    sampling = {k: repro[k] for k in ("seed", "temperature", "top_p", "top_k")}
    assert sampling == {"seed": 7, "temperature": 0.8, "top_p": 0.95, "top_k": 40}
    assert repro["clock"] == CLOCK and repro["max_tokens"] == 8
    assert repro["request_id"] == "req_" + message.id[len("msg_") :]
    sent = {"model": "tiny", "system": system, "messages": [{"role": "user", "content": "hi"}]}
    assert repro["prompt_digest"] == prompt_digest(sent)  # the Messages prompt, as the proxy's
    assert extra["system_fingerprint"] == repro["system_fingerprint"]


def test_the_stream_helper_and_a_forced_tool_call(sdk: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": "weather in Oslo?"}]
    choice: Any = {"type": "tool", "name": "get_weather"}
    with sdk.messages.stream(
        model="tiny",
        max_tokens=200,
        messages=messages,
        tools=[WEATHER, CLOCK_TOOL],
        tool_choice=choice,
        extra_body={"seed": 9},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", final
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, SCHEMA)  # the grammar kept to the schema
    sent = {"model": "tiny", "messages": messages, "tools": [WEATHER, CLOCK_TOOL]}
    assert call.id == tool_call_id(prompt_digest({**sent, "tool_choice": choice}), 9, 0)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and "text" not in kinds

    # the same request, not streamed: the same message
    again = sdk.messages.create(
        model="tiny", max_tokens=200, messages=messages, tools=[WEATHER, CLOCK_TOOL],
        tool_choice=choice, extra_body={"seed": 9},
    )  # fmt: skip
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in final.content]


def test_any_none_and_auto_tool_choices(sdk: anthropic.Anthropic, http: httpx.Client) -> None:
    tools = [WEATHER, CLOCK_TOOL]
    anyone = sdk.messages.create(
        model="tiny", max_tokens=200, messages=[{"role": "user", "content": "go"}], tools=tools,
        tool_choice={"type": "any"}, extra_body={"seed": 2},
    )  # fmt: skip
    (call,) = anyone.content
    assert call.type == "tool_use" and call.name in ("get_weather", "get_time")
    assert anyone.stop_reason == "tool_use"
    for seed in range(3):
        none = _post(
            http,
            _request("hi", tools=tools, tool_choice={"type": "none"}, seed=seed, max_tokens=30),
        ).json()
        assert [b["type"] for b in none["content"]] == ["text"], none
        assert "<tool_call>" not in none["content"][0]["text"]
        assert none["stop_reason"] in ("end_turn", "max_tokens")
    auto = _post(http, _request("hi", tools=tools, seed=1, max_tokens=30)).json()
    assert auto["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


def test_a_pinned_reply_is_the_same_bytes_every_time(http: httpx.Client) -> None:
    raw = json.dumps(_request("same bytes please", seed=3, clock=CLOCK, strict_cache=True)).encode()
    first, second = _post(http, raw), _post(http, raw)
    assert first.status_code == 200 and first.content == second.content
    reply = first.json()
    assert reply["id"] == "msg_" + digest_hex(Domain.REQUEST, raw)[:32]
    assert reply["reproducibility"]["kv_cache_mode"] == "strict"

    streamed = raw[:-1] + b',"stream":true}'
    one, two = _post(http, streamed), _post(http, streamed)
    assert one.headers["content-type"].startswith("text/event-stream")
    assert one.content == two.content
    events = _events(one.content)
    assert events[0][1]["message"]["id"] == "msg_" + digest_hex(Domain.REQUEST, streamed)[:32]
    text = "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta")
    assert text == reply["content"][0]["text"]
    (delta,) = [e for k, e in events if k == "message_delta"]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    # the proxy finds the engine's block and fingerprint in either shape
    (fp, block), (json_fp, json_block) = (
        reply_facts(one.content, streamed=True),
        reply_facts(first.content, streamed=False),
    )
    assert fp == json_fp == reply["system_fingerprint"]
    assert block is not None and json_block == reply["reproducibility"]
    assert block["request_id"] == "req_" + digest_hex(Domain.REQUEST, streamed)[:32]
    assert {**block, "request_id": None} == {**json_block, "request_id": None}

    other = _post(http, _request("same bytes please", seed=4, clock=CLOCK)).json()
    assert other["id"] != reply["id"]


def test_an_unpinned_request_reports_the_seed_it_drew(http: httpx.Client) -> None:
    request = _request("surprise me", strict_cache=True)
    a, b = _post(http, request).json(), _post(http, request).json()
    assert a["id"] != b["id"] and a["reproducibility"]["seed"] != b["reproducibility"]["seed"]
    replay = _post(http, {**request, "seed": a["reproducibility"]["seed"]}).json()
    assert replay["content"] == a["content"]


def test_stop_sequences_end_with_stop_sequence(http: httpx.Client) -> None:
    full, request = "", {}
    for seed in range(50):  # the first seed whose answer is long enough (deterministic)
        request = _request("a long answer", seed=seed, max_tokens=40, temperature=0.7)
        full = _post(http, request).json()["content"][0]["text"]
        if len(full) > 20 and "\ufffd" not in full[:16]:
            break
    stop = full[12:15]
    assert len(full) > 20 and stop
    cut = full[: full.index(stop)]
    reply = _post(http, {**request, "stop_sequences": ["never-seen", stop]}).json()
    assert reply["content"][0]["text"] == cut
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("stop_sequence", stop)
    events = _events(_post(http, {**request, "stop_sequences": [stop], "stream": True}).content)
    text = "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta")
    (delta,) = [e for k, e in events if k == "message_delta"]
    assert text == cut and delta["delta"]["stop_sequence"] == stop


def test_a_conversation_with_tool_use_and_tool_result_blocks(http: httpx.Client) -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo", "unit": "c"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "12 degrees"}]},
            {"type": "text", "text": "and so?"},
        ]},
    ]  # fmt: skip
    request = {"model": "tiny", "max_tokens": 5, "messages": messages, "tools": [WEATHER]}
    reply = _post(http, {**request, "system": "be brief", "seed": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["input_tokens"] > 40  # the history reached the template
    chat = chat_request(MessagesRequest.model_validate({**request, "system": "be brief"}))
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12 degrees"},
        {"role": "user", "content": "and so?"},
    ]  # fmt: skip
    assert chat["tools"] == [
        {"type": "function",
         "function": {"name": "get_weather", "parameters": SCHEMA, "description": "the weather"}}
    ]  # fmt: skip


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
BAD: list[tuple[str, Any, int, str]] = [
    ("no max_tokens", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, 400,
     "max_tokens"),
    ("temperature", _request("x", temperature=1.5), 400, "temperature"),
    ("role", {**_request("x"), "messages": [{"role": "system", "content": "x"}]}, 400,
     "messages[0].role"),
    ("image", {**_request("x"), "messages": [{"role": "user", "content": [IMAGE]}]}, 400,
     "messages[0].content[0].type: 'image'"),
    ("schema", _request("x", tools=[{"name": "t", "input_schema": {"type": "string"}}]), 400,
     "tools[0].input_schema"),
    ("server tool", _request("x", tools=[{"type": "web_search_20250305", "name": "w"}]), 400,
     "tools[0].type"),
    ("tool_choice", _request("x", tools=[WEATHER], tool_choice={"type": "some"}), 400,
     "tool_choice.type"),
    ("named tool", _request("x", tools=[WEATHER], tool_choice={"type": "tool", "name": "no"}),
     400, "'no'"),
    ("stops", _request("x", stop_sequences=["a", "b", "c", "d", "e"]), 400, "stop_sequences"),
    ("model", _request("x") | {"model": "claude"}, 404, "'claude'"),
    ("clock", _request("x", clock="yesterday"), 400, "clock"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_gets_an_anthropic_error(http: httpx.Client, case: tuple[Any, ...]) -> None:
    _, body, status, named = case
    reply = _post(http, body)
    assert reply.status_code == status, reply.text
    error = reply.json()
    assert error["type"] == "error" and named in error["error"]["message"], error
    wanted = "not_found_error" if status == 404 else "invalid_request_error"
    assert error["error"]["type"] == wanted


def test_the_sdk_raises_the_engine_error(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        sdk.messages.create(
            model="tiny",
            max_tokens=4,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"temperature": 3},
        )
