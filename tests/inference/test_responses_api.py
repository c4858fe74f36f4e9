"""``POST /v1/responses`` on the engine, read by the official ``openai`` SDK.

Uvicorn serves one :class:`Engine` on the shipped tiny model. Proved here: the SDK's
``responses.stream`` helper and ``responses.create`` parse the replies (events in order, with
``sequence_number`` from 0, and the ``reproducibility`` block where the proxy reads it); a
forced function call's arguments parse and match the schema, with a derived ``call_id``; a
second step that feeds the ``function_call`` and its ``function_call_output`` back is served;
a pinned reply is the same bytes on every run, streamed or not, and its ids are derived from
the request; server-side state (``previous_response_id``, ``store``, ``conversation``,
``background``) and unsupported items get a 400 naming the member.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest

for _module in ("torch", "fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="the server tests need the `engine` and `dev` extras")

import httpx  # noqa: E402
import openai  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from egress_proxy.sse import iter_events  # noqa: E402
from inference.responses_api import chat_request, parse_responses_request  # noqa: E402
from inference.server import Engine, create_app  # noqa: E402
from inference.tool_calls import derived_tool_call_ids  # noqa: E402
from record.digest import Domain, digest_hex, prompt_digest  # noqa: E402
from tests.inference.serving import serve_in_thread  # noqa: E402

TIMEOUT_S = 60.0
CLOCK = "2025-06-01T12:00:00Z"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER: Any = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
PINNED = {"seed": 7, "clock": CLOCK, "strict_cache": True}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    e = Engine(tiny_model_dir, model_name="tiny").start()
    yield e
    e.close()


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    yield from serve_in_thread(create_app(engine), timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as session:
        yield session


def test_the_stream_helper_reads_text_events_in_order(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiny",
        instructions="Answer briefly.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}],
        max_output_tokens=6,
        extra_body=PINNED,
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # six tokens cannot hold an end token: max_output_tokens cut it
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas and "".join(deltas) == done.text
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage is not None and last.response.usage.output_tokens == 6
    (message,) = last.response.output
    assert message.type == "message" and message.content[0].text == done.text  # type: ignore[union-attr]
    assert last.response.created_at == 1748779200  # the clock, not the wall


def test_a_forced_function_call_parses_and_a_second_step_takes_its_output(
    client: openai.OpenAI,
) -> None:
    with client.responses.stream(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        extra_body=PINNED,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.status == "completed"
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
    assert len(arguments["city"]) <= 12
    assert call.call_id.startswith("call_") and call.id == "fc_" + call.call_id[5:]

    conversation: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
    ]  # fmt: skip
    second = client.responses.create(
        model="tiny",
        input=conversation,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        extra_body=PINNED,
    )
    assert second.status in ("completed", "incomplete")
    assert [item.type for item in second.output] == ["message"]
    assert second.output_text  # words, not a call: tool_choice none


def test_a_pinned_reply_is_the_same_bytes_and_its_ids_are_derived(http: httpx.Client) -> None:
    body: dict[str, Any] = {
        "model": "tiny",
        "input": "Weather?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 64,
        **PINNED,
    }
    raw = json.dumps(body).encode()
    first = http.post("/v1/responses", content=raw)
    again = http.post("/v1/responses", content=raw)
    assert first.status_code == 200, first.text
    assert first.content == again.content
    reply = first.json()
    h = digest_hex(Domain.REQUEST, raw)[:32]
    assert reply["id"] == f"resp_{h}" and reply["created_at"] == 1748779200
    block = reply["reproducibility"]  # a top-level member: where the proxy reads it
    assert block["request_id"] == f"req_{h}" and block["seed"] == 7
    assert block["prompt_digest"] == prompt_digest(body)  # the Responses request's own prompt
    (call,) = reply["output"]
    assert [call["call_id"]] == derived_tool_call_ids(prompt_digest(body), 7, 1)

    streamed = json.dumps({**body, "stream": True}).encode()
    one = http.post("/v1/responses", content=streamed)
    two = http.post("/v1/responses", content=streamed)
    assert one.status_code == 200 and one.content == two.content
    events = [e.json() for e in iter_events(one.content)]
    assert all(e is not None for e in events)
    last = events[-1]
    assert last is not None and last["type"] == "response.completed"
    assert last["reproducibility"]["prompt_digest"] == prompt_digest({**body, "stream": True})
    assert last["response"]["output"][0]["call_id"] == call["call_id"]  # same prompt, seed


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("previous_response_id", "resp_abc"),
        ("store", True),
        ("conversation", "conv_abc"),
        ("background", True),
    ],
)
def test_server_side_state_is_refused_naming_the_member(
    client: openai.OpenAI, member: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="hi", extra_body={member: value})
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == member and error["code"] == "unsupported_parameter"
    assert member in error["message"]


def test_store_false_is_accepted(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/responses",
        json={"model": "tiny", "input": "hi", "store": False, "max_output_tokens": 2},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["store"] is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
    ],
)
def test_unsupported_input_gets_a_400_naming_it(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    reply = http.post("/v1/responses", json={"model": "tiny", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_responses_request_becomes_the_chat_request_it_means() -> None:
    body = {
        "model": "tiny",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use metric."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 9,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "seed": 3, "top_k": 4, "strict_cache": True, "parallel_tool_calls": False,
    }  # fmt: skip
    request, _ = parse_responses_request(json.dumps(body).encode())
    chat = chat_request(request)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use metric."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
    ]  # fmt: skip
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}
    }  # fmt: skip
    assert (chat["max_tokens"], chat["seed"], chat["top_k"], chat["strict_cache"]) == (
        9, 3, 4, True
    )  # fmt: skip
    assert "parallel_tool_calls" not in chat


class Reading(BaseModel):
    """A structured answer: ``text.format`` constrains the reply through the same grammar."""

    label: Annotated[str, Field(max_length=10)]
    level: Literal["low", "high"]
    value: Annotated[int, Field(ge=0, le=9)]


def test_the_parse_helper_gets_a_pydantic_object_from_text_format(client: openai.OpenAI) -> None:
    reply = client.responses.parse(
        model="tiny",
        input="Read the gauge.",
        text_format=Reading,
        max_output_tokens=60,
        extra_body=PINNED,
    )
    assert reply.status == "completed"
    assert isinstance(reply.output_parsed, Reading)  # the SDK validated it with the model
    assert Reading.model_validate_json(reply.output_text) == reply.output_parsed
