"""Tool calls between model text and the OpenAI wire shape.

- derived ids are ``record.digest.tool_call_id`` per ordinal: deterministic, distinct per
  ordinal, per seed (``None`` included) and per prompt;
- ``openai_tool_calls`` and the stream deltas have OpenAI's shape and refuse mismatches;
- ``parse_tool_calls`` splits free text into content and calls, keeps the arguments as
  written, and leaves malformed or unclosed blocks in the content;
- a call made under the grammar, turned into an assistant message and rendered by the tiny
  model's chat template, reads exactly as generated (the layout is the template's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.tool_calls import (
    derived_tool_call_ids,
    openai_tool_call_deltas,
    openai_tool_calls,
    parse_tool_calls,
)
from record.digest import prompt_digest, tool_call_id

DIGEST = prompt_digest({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})


def test_derived_ids_are_deterministic_and_distinct() -> None:
    ids = derived_tool_call_ids(DIGEST, 7, 4)
    assert ids == derived_tool_call_ids(DIGEST, 7, 4)
    assert ids == [tool_call_id(DIGEST, 7, ordinal) for ordinal in range(4)]
    assert len(set(ids)) == 4
    assert all(i.startswith("call_") and len(i) == len("call_") + 24 for i in ids)
    assert derived_tool_call_ids(DIGEST, 7, 2) == ids[:2]
    others = derived_tool_call_ids(DIGEST, 8, 4) + derived_tool_call_ids(DIGEST, None, 4)
    other_prompt = prompt_digest({"model": "tiny", "messages": []})
    others += derived_tool_call_ids(other_prompt, 7, 4)
    assert len(set(ids + others)) == 16
    assert derived_tool_call_ids(DIGEST, 7, 0) == []
    with pytest.raises(ValueError, match="count"):
        derived_tool_call_ids(DIGEST, 7, -1)


def test_openai_shapes() -> None:
    calls = [("get_weather", '{"city": "Paris"}'), ("ping", "{}")]
    ids = derived_tool_call_ids(DIGEST, 1, 2)
    assert openai_tool_calls(calls, ids) == [
        {
            "id": ids[0],
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": ids[1], "type": "function", "function": {"name": "ping", "arguments": "{}"}},
    ]
    deltas = openai_tool_call_deltas(calls, ids)
    assert [d["index"] for d in deltas] == [0, 1]
    assert [{k: v for k, v in d.items() if k != "index"} for d in deltas] == openai_tool_calls(
        calls, ids
    )
    with pytest.raises(ValueError, match="2 tool calls but 1 ids"):
        openai_tool_calls(calls, ids[:1])
    with pytest.raises(ValueError, match="distinct"):
        openai_tool_calls(calls, [ids[0], ids[0]])


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Just words.", "Just words.", []),
        ("  spaced  ", "  spaced  ", []),
        (
            '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>',
            "",
            [("a", '{"x": 1}')],
        ),
        (
            'Sure.\n<tool_call>{"name":"a","arguments":{"x":[1, 2]}}</tool_call>\n'
            '<tool_call>\n{"arguments": {}, "name": "b"}\n</tool_call>',
            "Sure.",
            [("a", '{"x":[1, 2]}'), ("b", "{}")],
        ),
        (  # arguments as a string holding an object
            '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>',
            "",
            [("a", '{"x": 1}')],
        ),
        (  # malformed blocks stay in the content; the good one is taken
            'A <tool_call>{"name": "a"}</tool_call> B <tool_call>not json</tool_call> '
            '<tool_call>{"name": "c", "arguments": {}}</tool_call>',
            'A <tool_call>{"name": "a"}</tool_call> B <tool_call>not json</tool_call>',
            [("c", "{}")],
        ),
        (
            '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
            '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
            [],
        ),
        (
            '<tool_call>{"name": "", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "", "arguments": {}}</tool_call>',
            [],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}, "x": 1}</tool_call>',
            '<tool_call>{"name": "a", "arguments": {}, "x": 1}</tool_call>',
            [],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>',
            '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>',
            [],
        ),
        (  # cut off by max_tokens: unclosed
            'ok <tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{"name": "b", "ar',
            'ok  <tool_call>{"name": "b", "ar',
            [("a", "{}")],
        ),
        (  # a stray opening tag before a good block
            '<tool_call> oops <tool_call>{"name": "a", "arguments": {}}</tool_call>',
            "<tool_call> oops",
            [("a", "{}")],
        ),
    ],
)
def test_parse_tool_calls(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    assert parse_tool_calls(text) == (content, calls)
    for _, arguments in calls:
        assert isinstance(json.loads(arguments), dict)


def test_parse_tool_calls_is_reexported_by_the_grammar_module() -> None:
    pytest.importorskip("torch", reason="the grammar needs torch (the `engine` extra)")
    from inference import constrained

    assert constrained.parse_tool_calls is parse_tool_calls


def test_a_grammar_call_re_renders_exactly_as_generated(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("torch", reason="the grammar needs torch (the `engine` extra)")
    tiny_model_dir: Path = request.getfixturevalue("tiny_model_dir")  # needs the engine too
    from inference.constrained import ToolCallGrammar, Vocabulary
    from inference.protocol import TokenTable
    from inference.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.from_dir(tiny_model_dir)
    vocabulary = Vocabulary.build(
        tokenizer.to_json(),
        TokenTable.load(tiny_model_dir, tokenizer.vocab_size).raw,
        tokenizer.eos_token_ids,
        vocab_size=tokenizer.vocab_size,
        tag_ids={t: tokenizer.token_to_id(t) for t in ("<tool_call>", "</tool_call>")},
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "days": {"type": "integer"},
                        "units": {"type": "array", "items": {"enum": ["c", "f"]}},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = tokenizer.render(messages, tools=tools)
    for city, rendered_city in [("Paris", "Paris"), ("Île-de-France", "Île-de-France")]:
        # The tiny vocabulary has "Î" only as two partial byte tokens: the text is decoded
        # from the tokens' bytes, so the pair still reads as one character. (The grammar
        # writes a non-ASCII character as itself, never as a \u escape, as the template does.)
        generated = (
            '<tool_call>\n{"name": "get_weather", "arguments": '
            f'{{"city": "{city}", "days": 3, "units": ["c", "f"]}}}}\n</tool_call>'
        )
        grammar = ToolCallGrammar(vocabulary, tools, "required")
        for token_id in tokenizer.encode(generated):
            grammar.advance(token_id)
        assert grammar.complete and grammar.text == generated
        call_ids = derived_tool_call_ids(DIGEST, 3, 1)
        message = {"role": "assistant", "tool_calls": openai_tool_calls(grammar.calls(), call_ids)}
        rendered = tokenizer.render([*messages, message], tools=tools, add_generation_prompt=False)
        expected = generated.replace(city, rendered_city)
        assert rendered == prompt + expected + "<|im_end|>\n"
