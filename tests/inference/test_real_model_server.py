"""The engine serving the real default model (SmolLM2-135M-Instruct, whose chat template
knows nothing of tools) to the official ``openai`` SDK over loopback HTTP: a forced tool
call parsed, ``content: null`` and tool results accepted,
``tool_choice: "none"`` answered in words with the tools left out of the prompt, the
block naming where the weights came from, and structured output through the SDK's parse
helpers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("torch", reason="the engine needs the `engine` extra")

from harness.up import _serve
from inference.pull import KNOWN_MODELS

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "web_fetch",
            "description": "Fetch a web page",
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {"type": "string"},
                    "max_bytes": {"type": "integer"},  # optional: not in "required"
                },
                "required": ["url"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def engine(smollm2_gguf: Path) -> Iterator[Any]:
    import torch

    from inference.server import Engine

    torch.set_num_threads(1)
    running = Engine(smollm2_gguf, model_name="smollm2-135m").start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def client(engine: Any) -> Iterator[Any]:
    import openai

    from inference.server import create_app

    with _serve(create_app(engine)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_a_forced_call_parses_and_the_block_names_the_pulled_file(client: Any) -> None:
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Fetch http://127.0.0.1/demo please."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "web_fetch"}},
        seed=3,
        temperature=0.7,
        max_tokens=96,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "web_fetch"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["url"], str)
    assert arguments.get("max_bytes") is None or isinstance(arguments["max_bytes"], int)
    block = reply.model_extra["reproducibility"]
    known = KNOWN_MODELS["smollm2-135m"]
    assert block["weights_source"] == {
        "format": "gguf",
        "file": known.filename,
        "file_sha256": known.file_sha256,
        "package": known.package,
        "version": known.version,
    }


def test_null_content_and_tool_results_render_and_none_answers_in_words(
    client: Any, engine: Any
) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Search the web for the demo page and tell me what it says."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "web_fetch",
                        "arguments": '{"url": "http://127.0.0.1/demo"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "HTTP 200\nDemo page, version 0."},
    ]
    body = {"model": "smollm2-135m", "messages": messages, "tools": TOOLS, "seed": 42}
    for choice, shown in (("auto", True), ("none", False)):
        job, _ = engine.prepare(json.dumps({**body, "tool_choice": choice}).encode(), {})
        prompt = engine.tokenizer.decode(job.prompt_ids)
        assert ('"name": "web_fetch"' in prompt.split("<|im_start|>user")[0]) is shown, choice
        assert '<tool_call>\n{"name": "web_fetch", "arguments": {"url": ' in prompt
        assert "<tool_response>\nHTTP 200\nDemo page, version 0.\n</tool_response>" in prompt
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        seed=42,
        temperature=0.7,
        max_tokens=48,
    )
    text = reply.choices[0].message.content
    assert reply.choices[0].message.tool_calls is None
    assert "<tool_call>" not in text and "<tool_response>" not in text, text


# --- structured output (#14 line 3): the SDK's parse helpers with a pydantic model ----------


class Forecast(BaseModel):
    city: Annotated[str, Field(max_length=24)]
    sky: Literal["sunny", "cloudy", "rain"]
    high_c: Annotated[int, Field(ge=-40, le=50)]
    warnings: Annotated[list[Annotated[str, Field(max_length=16)]], Field(max_length=2)]


def test_parse_helper_gets_a_pydantic_object(client: Any) -> None:
    messages: Any = [{"role": "user", "content": "Give me the forecast for Paris as JSON."}]
    reply = client.chat.completions.parse(
        model="smollm2-135m",
        messages=messages,
        response_format=Forecast,
        seed=5,
        temperature=0.7,
        max_tokens=120,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop", message.content
    assert isinstance(message.parsed, Forecast)  # the SDK validated it with the model
    assert Forecast.model_validate_json(message.content) == message.parsed
    with client.chat.completions.stream(
        model="smollm2-135m",
        messages=messages,
        response_format=Forecast,
        seed=5,
        temperature=0.7,
        max_tokens=120,
    ) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].message.parsed == message.parsed  # same pinned bytes


def test_json_object_mode_answers_an_object(client: Any) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "Describe a cat in JSON."}],
            response_format={"type": "json_object"},
            seed=seed,
            temperature=0.7,
            max_tokens=120,
        )
        if reply.choices[0].finish_reason == "length":
            continue  # a free-form object may run long; the next seed is tried
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
        return
    pytest.fail("no json_object reply completed within 120 tokens in 3 seeds")


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
            "type",
        ),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "json_schema.name"),
        ({"type": "xml"}, "response_format.type"),
    ],
)
def test_an_invalid_response_format_is_a_400_naming_it(
    client: Any, response_format: Any, message: str
) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "hi"}],
            response_format=response_format,
            max_tokens=4,
        )
    error = caught.value.body
    assert isinstance(error, dict) and message in error["message"]
    assert str(error["param"]).startswith("response_format")
