"""The fallback for chat templates without tool support (``inference.tool_prompt``).

- SmolLM2-135M-Instruct's template (which only concatenates ``content``) renders a
  conversation with tools, calls and results byte for byte as the tiny ChatML-with-tools
  template does, so the fallback is the documented layout;
- ``content: null`` renders as ``""`` instead of failing, with or without tools;
- ``supports_tools`` tells the two templates apart;
- text parts are joined, other parts refused by name;
- a call's arguments as a JSON string or as an object render the same;
- templates that read ``tools`` see the conversation unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference.tokenizer import ChatTemplateError, ChatTokenizer
from inference.tool_prompt import fallback_messages, tools_block

# SmolLM2-135M-Instruct's own chat template, exactly as its files carry it.
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
    " Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' +"
    " message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}},
]


def _conversation(arguments: Any = '{"city": "Île-de-France"}') -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Weather in Île-de-France, and ping?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "ping", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
        {"role": "user", "content": "Thanks."},
    ]


@pytest.fixture(scope="module")
def tiny(request: pytest.FixtureRequest) -> ChatTokenizer:
    """The tiny model's tokenizer and its ChatML-with-tools template."""
    tiny_model_dir: Path = request.getfixturevalue("tiny_model_dir")
    return ChatTokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def smollm(tiny: ChatTokenizer) -> ChatTokenizer:
    """The same tokenizer with SmolLM2's template, which never reads ``tools``."""
    return ChatTokenizer(tiny._tokenizer, SMOLLM_TEMPLATE, tiny.special_tokens)


def test_supports_tools_tells_the_templates_apart(
    tiny: ChatTokenizer, smollm: ChatTokenizer
) -> None:
    assert tiny.supports_tools is True
    assert smollm.supports_tools is False
    assert ChatTokenizer(tiny._tokenizer, None, {}).supports_tools is False


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_fallback_renders_as_the_chatml_tools_template(
    tiny: ChatTokenizer, smollm: ChatTokenizer, generation_prompt: bool
) -> None:
    messages = _conversation()
    expected = tiny.render(messages, tools=TOOLS, add_generation_prompt=generation_prompt)
    rendered = smollm.render(messages, tools=TOOLS, add_generation_prompt=generation_prompt)
    assert rendered == expected
    assert messages == _conversation()  # the caller's messages are left as they were
    # The layout spelled out, so a reader can rebuild it without the tiny template.
    assert rendered.startswith(
        "<|im_start|>system\nYou answer briefly.\n\n" + tools_block(TOOLS) + "<|im_end|>\n"
    )
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Île-de-France"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n'
        "<tool_response>\npong\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
    ) in rendered
    assert json.dumps(TOOLS[0], ensure_ascii=False) in rendered


def test_fallback_without_a_system_message_matches_too(
    tiny: ChatTokenizer, smollm: ChatTokenizer
) -> None:
    messages = _conversation()[1:]
    rendered = smollm.render(messages, tools=TOOLS)
    assert rendered == tiny.render(messages, tools=TOOLS)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n")
    assert "SmolLM" not in rendered


def test_assistant_text_before_calls_matches(tiny: ChatTokenizer, smollm: ChatTokenizer) -> None:
    messages = _conversation()
    messages[2]["content"] = "Let me check."
    assert smollm.render(messages, tools=TOOLS) == tiny.render(messages, tools=TOOLS)
    assert "<|im_start|>assistant\nLet me check.\n<tool_call>\n" in smollm.render(
        messages, tools=TOOLS
    )


def test_null_content_renders_empty_without_tools(smollm: ChatTokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again"},
    ]
    rendered = smollm.render(messages, add_generation_prompt=False)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
        " Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n"
    )
    assert "# Tools" not in rendered


def test_text_parts_are_joined_and_other_parts_refused(smollm: ChatTokenizer) -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    rendered = smollm.render([{"role": "user", "content": parts}])
    assert "<|im_start|>user\nHello, world<|im_end|>\n" in rendered
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(ChatTemplateError, match="image_url"):
        smollm.render([{"role": "user", "content": [*parts, *image]}])


def test_string_and_object_arguments_render_the_same(smollm: ChatTokenizer) -> None:
    as_string = _conversation('{"city":"Île-de-France"}')
    as_object = _conversation({"city": "Île-de-France"})
    rendered = smollm.render(as_string, tools=TOOLS)
    assert rendered == smollm.render(as_object, tools=TOOLS)
    assert rendered == smollm.render(as_string, tools=TOOLS, parse_tool_arguments=False)
    assert '"arguments": {"city": "Île-de-France"}}' in rendered


def test_arguments_that_are_not_json_go_in_as_is() -> None:
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}],
        }
    ]
    assert fallback_messages(messages, None) == [
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "f", "arguments": {not json}\n</tool_call>',
        }
    ]


def test_templates_with_tool_support_are_left_alone(tiny: ChatTokenizer) -> None:
    # The fallback would join these parts; a template that reads ``tools`` gets them as is.
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        tiny.render(messages)
