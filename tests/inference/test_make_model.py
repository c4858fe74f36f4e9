"""The model that ships with the product: known answers, tokenizer and chat template.

- ``make_model`` run twice, in two fresh directories, gives the committed known answers
  (``inference/data/tiny_model.sha256``): the weights digest and every file's SHA-256;
- its tokenizer round-trips text and keeps the chat and tool tags as single tokens;
- its chat template lists tools, renders assistant tool calls (arguments given as a JSON
  string or an object) and groups ``tool`` messages; the Jinja environment runs the
  constructs real Qwen2/Qwen3/Llama templates use.

The command line is tested in ``test_engine_cli.py``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.make_model import known_answers, make_model
from inference.model import DecoderModel
from inference.tokenizer import ChatTemplateError, ChatTokenizer
from inference.weights import weights_digest

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_make_model_twice_gives_the_known_answers(tmp_path: Path) -> None:
    expected = known_answers()
    assert set(expected) == {
        "weights_digest",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    first = make_model(tmp_path / "a")
    second = make_model(tmp_path / "b")
    assert first.answers() == expected
    assert second.answers() == expected
    for name in expected.keys() - {"weights_digest"}:
        data = (tmp_path / "a" / name).read_bytes()
        assert data == (tmp_path / "b" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == expected[name]
    assert weights_digest(tmp_path / "b") == expected["weights_digest"]


def test_make_model_refuses_a_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        make_model(tmp_path)


def test_the_model_loads_and_generates_deterministically(tiny_model_dir: Path) -> None:
    model = DecoderModel.load(tiny_model_dir)
    tokenizer = ChatTokenizer.from_dir(tiny_model_dir)
    assert model.config.vocab_size == tokenizer.vocab_size == 768
    ids = tokenizer.encode(tokenizer.render([{"role": "user", "content": "Hello!"}]))

    def generate() -> list[int]:
        cache = model.new_cache()
        logits = model.prefill(cache, ids)
        out = []
        for _ in range(10):
            out.append(int(logits.argmax()))
            logits = model.decode([cache], [out[-1]])[0]
        return out

    assert generate() == generate()


def test_tokenizer_round_trips_text(tiny_model_dir: Path) -> None:
    tokenizer = ChatTokenizer.from_dir(tiny_model_dir)
    samples = [
        "The quick brown fox jumps over the lazy dog.",
        '{"url": "https://example.com/a?b=1&c=2", "n": [1, 2.5, null]}',
        "def f(x):\n    return x * 2  # doubled\n\n\ttab",
        "Ünïcödé — émoji 🦊 and 中文 text, never in the corpus",
        "  leading and trailing spaces  ",
    ]
    for text in samples:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert len(tokenizer.encode('{"url": "https://example.com/"}')) < 20


def test_special_and_tool_tags_are_single_tokens(tiny_model_dir: Path) -> None:
    tokenizer = ChatTokenizer.from_dir(tiny_model_dir)
    for tag in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"):
        ids = tokenizer.encode(f"a{tag}b")
        assert tokenizer.token_to_id(tag) in ids
        assert len(tokenizer.encode(tag)) == 1
    im_end, eot = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    assert im_end is not None and eot is not None
    assert tokenizer.eos_token_ids == tuple(sorted({im_end, eot}))
    call = tokenizer.encode("<tool_call>{}</tool_call>")
    assert "<tool_call>" in tokenizer.decode(call, skip_special_tokens=True)


def test_chat_template_renders_tools_and_tool_calls(tiny_model_dir: Path) -> None:
    tokenizer = ChatTokenizer.from_dir(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo and Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": '{"t": 3}'},
        {"role": "tool", "tool_call_id": "c1", "content": '{"t": 18}'},
    ]
    text = tokenizer.render(messages, tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\n"
        '{"t": 3}\n</tool_response>\n<tool_response>\n{"t": 18}\n</tool_response><|im_end|>\n'
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'  # type: ignore[index]

    plain = tokenizer.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n"
    with pytest.raises(ChatTemplateError, match="system message"):
        tokenizer.render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


# Written for this test: the Jinja constructs the stock Qwen2.5, Qwen3 and Llama 3.x
# templates rely on (namespace, reversed slices, string tests and methods, tojson with
# arguments, the strftime_now fallback, loop controls, the generation block).
REAL_WORLD_CONSTRUCTS = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages[::-1] %}
  {%- if ns.last_user < 0 and m.role == 'user' and m.content is string %}
    {%- set ns.last_user = (messages|length - 1) - loop.index0 %}
  {%- endif %}
{%- endfor %}
{%- if not date_string is defined %}
  {%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}
  {%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- endif %}
{{- 'date=' + date_string + ' last_user=' ~ ns.last_user + '\\n' }}
{%- for t in tools %}{{- t.function.name | tojson }}{{- t | tojson(indent=1) | length > 10 }}{%- endfor %}
{%- for m in messages %}
  {%- if m.role == 'assistant' and m.tool_calls is defined %}
    {%- for c in m.tool_calls %}{{- '\\n' + c.function.arguments | tojson(sort_keys=true) }}{%- break %}{%- endfor %}
  {%- elif m.content.startswith('skip') %}{%- continue %}
  {%- else %}{% generation %}{{- '\\n' + m.content | trim }}{% endgeneration %}
  {%- endif %}
{%- endfor %}
{{- '\\n' + bos_token|string + '|' + eos_token }}"""


def test_jinja_environment_runs_real_template_constructs(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": REAL_WORLD_CONSTRUCTS, "bos_token": None, "eos_token": "<e>"}
    import json

    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = ChatTokenizer.from_dir(tmp_path)
    messages = [
        {"role": "user", "content": "  first  "},
        {"role": "user", "content": "skip me"},
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "f", "arguments": '{"b": "é", "a": 1}'}},
                {"function": {"name": "g", "arguments": "{}"}},
            ],
        },
    ]
    text = tokenizer.render(messages, tools=[WEATHER_TOOL])
    assert text == (
        'date=26 Jul 2024 last_user=1\n"get_weather"True\nfirst\n{"a": 1, "b": "é"}\nNone|<e>'
    )
    dated = tokenizer.render(messages, tools=[WEATHER_TOOL], now=datetime(2025, 3, 1))
    assert dated.startswith("date=01 Mar 2025 ")
