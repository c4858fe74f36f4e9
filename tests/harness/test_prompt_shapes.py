"""Any prompt shape through a pinned session (#14 line 1), with the official ``openai`` SDK
against the proxy and the real engine behind it: several client system messages and the
``developer`` role, content as lists of text parts, ``name`` fields, an assistant message
with ``tool_calls`` and ``content: null``, a ``tool`` message, and a tool whose parameter is
``Optional`` (JSON Schema ``anyOf`` with ``null``, once refused). The clock is folded into
the client's first system message (no message is added), the record keeps the rule, the
engine's block names the prompt the proxy recorded and the token ids it ran, and a second
pinned call gives the same bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

import openai

from harness.session import open_session
from record.seal import KeyPair
from tests.harness.rig import CLOCK, PINS, HarnessRig, harness_rig, model_exchanges

LINE = f"Current date and time: {CLOCK} (UTC)"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            },
            "required": ["city"],
        },
    },
}
MESSAGES: Any = [
    {"role": "system", "content": "You are a framework's assistant."},
    {"role": "developer", "content": [{"type": "text", "text": "Use tools when needed."}]},
    {"role": "system", "content": "Be brief.", "name": "policy"},
    {
        "role": "user",
        "name": "alice",
        "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "the weather?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessRig]:
    with harness_rig(tmp_path_factory.mktemp("shapes"), mcp=False) as running:
        yield running


@pytest.mark.parametrize(
    "tool_choice", ["auto", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_every_prompt_shape_reaches_the_engine_through_a_pinned_session(
    rig: HarnessRig, tool_choice: Any
) -> None:
    state = open_session(rig.home, PINS)
    client = openai.OpenAI(base_url=f"{state.base_url}/v1", api_key=state.token, max_retries=0)
    replies = [
        client.chat.completions.with_raw_response.create(
            model=rig.up.appliance.model,
            messages=MESSAGES,
            tools=[WEATHER],
            tool_choice=tool_choice,
        )
        for _ in range(2)
    ]
    client.close()
    first, second = (json.loads(r.content) for r in replies)
    assert first["choices"] == second["choices"]  # pinned: the same reply
    if tool_choice != "auto":
        (call,) = first["choices"][0]["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        assert isinstance(arguments["city"], str)
        assert arguments.get("days") is None or isinstance(arguments["days"], int)
    key = KeyPair.read(rig.home.user_key_file)
    pairs = model_exchanges(rig.up.appliance.store, state.session_id, key)
    assert len(pairs) == 2
    (request, reply), (_, again) = pairs
    sent = json.loads(request.request_bytes)
    # the clock folded into the client's first system message: no message added
    assert len(sent["messages"]) == len(MESSAGES)
    assert sent["messages"][0] == {
        "role": "system",
        "content": f"{LINE}\n\n{MESSAGES[0]['content']}",
    }
    assert sent["messages"][1:] == MESSAGES[1:]  # names, parts, null content: as sent
    assert request.clock == CLOCK and request.clock_rule == "fold"
    assert reply.outcome == "COMMITTED" and reply.reproducibility is not None
    assert reply.reproducibility["prompt_digest"] == request.prompt_digest
    ran = reply.reproducibility["prompt_tokens_digest"]
    assert isinstance(ran, str) and ran.startswith("sha256:")
    assert again.reproducibility is not None
    assert again.reproducibility["prompt_tokens_digest"] == ran
    assert again.response_digest == reply.response_digest


def test_session_new_json_gives_any_client_what_it_needs(
    rig: HarnessRig, capsys: pytest.CaptureFixture[str]
) -> None:
    """The outsider's flow: the CLI opens a session, the SDKs use what it printed."""
    from harness.cli import main

    args = ["session", "new", "--pin", "seed=3,max_tokens=8", "--home", str(rig.home.root)]
    assert main([*args, "--json"]) == 0
    opened = json.loads(capsys.readouterr().out)
    assert opened["openai_base_url"] == opened["base_url"] + "/v1"
    chat = openai.OpenAI(base_url=opened["openai_base_url"], api_key=opened["token"])
    reply = chat.chat.completions.create(
        model=rig.up.appliance.model, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].finish_reason == "length"  # the session's max_tokens pin: 8
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    wrong = openai.OpenAI(base_url=opened["openai_base_url"], api_key="not-the-token")
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=rig.up.appliance.model, messages=[])
