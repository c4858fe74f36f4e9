"""Constrained output on llguidance: the tools check, the schema preparation, the grammars.

- ``validate_tools`` takes any valid JSON Schema that describes an object and names what is
  wrong with anything else; ``check_schema`` names the path of an invalid schema;
- ``grammar_schema`` narrows a copy (no invented properties, exact integers, patterns the
  grammar engine cannot compile dropped) and never touches the client's schema;
- the token grammar: tags are single tokens where the vocabulary has them, only end tokens
  follow a complete call, a refused token is refused, padding rows are never allowed, and
  the same tokens give the same masks in a fresh grammar;
- the shipped tiny model's own logits, sampled under the grammar for many seeds, always
  give a call (or a ``response_format`` value) that ``jsonschema`` validates against the
  schema less the unconstrained keywords; a named choice forces its tool. (The time per
  mask is measured by ``bench/grammar_mask.py``, never asserted here.)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")
    pytest.importorskip("llguidance", reason="the grammar engine comes with the `engine` extra")

from inference.constrained import (
    GrammarError,
    JsonGrammar,
    ToolCallGrammar,
    Vocabulary,
    validate_tools,
)
from inference.model import DecoderModel
from inference.protocol import TokenTable
from inference.sampling import Sampler, SamplingParams
from inference.schema import check_schema, grammar_schema, without_unconstrained
from inference.tokenizer import ChatTokenizer

SEEDS = 20


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for the tiny model's steps (far too small to gain from two, and
    a busy neighbour on a shared 2-core machine kept the second thread waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12, "description": "where"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 14}, {"type": "null"}]},
    },
    "required": ["city"],
}
BOOK = {
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
                "age": {"type": "integer", "exclusiveMinimum": 0},
            },
            "required": ["name", "age"],
        }
    },
    "type": "object",
    "properties": {
        "guest": {"$ref": "#/$defs/Guest"},
        "rooms": {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1, "maxItems": 3},
        "tags": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z]{1,5}$"},
            "maxItems": 2,
            "uniqueItems": True,
        },
        "paid": {"type": "boolean", "default": False},
        "note": {"type": ["string", "null"], "maxLength": 6},
        "kind": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"single": {"const": True}},
                    "required": ["single"],
                },
                {"type": "object", "properties": {"beds": {"type": "integer", "maximum": 4}}},
            ]
        },
    },
    "required": ["guest", "rooms"],
}
MEASURE = {
    "type": "object",
    "properties": {"value": {"type": "number"}, "scale": {"const": 10}},
    "required": ["value"],
    "additionalProperties": {"type": "integer", "maximum": 99},
}


def _tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"{name} things"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [
    _tool("get_weather", WEATHER),
    _tool("book", BOOK),
    _tool("ping"),
    _tool("measure", MEASURE),
]
SCHEMAS = {
    "get_weather": WEATHER,
    "book": BOOK,
    "ping": {"type": "object", "additionalProperties": False},
    "measure": MEASURE,
}


def valid(value: Any, schema: Any) -> None:
    """``jsonschema`` against the schema less the keywords the grammar leaves unconstrained."""
    jsonschema.validate(value, without_unconstrained(schema))


# --- the tools check and the schema preparation ----------------------------------------------


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([], "non-empty list"),
        ({"type": "function"}, "non-empty list"),
        ([{"type": "retrieval"}], "tools[0].type must be 'function'"),
        ([{"type": "function"}], "tools[0].function must be an object"),
        ([{"type": "function", "function": {}}], "tools[0].function.name is missing"),
        ([_tool("bad name!")], "function.name must be 1-64"),
        ([_tool("a"), _tool("a")], "tools[1].function.name 'a' is declared twice"),
        ([_tool("a", {"type": "array"})], "must describe an object"),
        ([_tool("a", [])], "a schema is a JSON object or a boolean"),  # type: ignore[arg-type]
        (
            [_tool("a", {"type": "object", "properties": {"x": {"type": "date"}}})],
            "parameters.properties.x.type: not valid JSON Schema",
        ),
        (
            [
                _tool(
                    "a",
                    {"type": "object", "properties": {"x": {"type": "string", "maxLength": -1}}},
                )
            ],
            "parameters.properties.x.maxLength: not valid JSON Schema",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"type": ["null", "null"]}}})],
            "parameters.properties.x.type: not valid JSON Schema",
        ),
        ([_tool("a", {"type": "object", "required": "x"})], "parameters.required"),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}})],
            "$ref '#/$defs/nope' points at nothing",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"$ref": "https://x/s.json"}}})],
            "is not local",
        ),
        ([{"type": "function", "function": {"name": "a", "extra": 1}}], "unsupported members"),
    ],
)
def test_validate_tools_names_the_problem(tools: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        validate_tools(tools)
    assert message in str(caught.value)


def test_validate_tools_takes_what_real_tools_write_and_returns_a_copy() -> None:
    optional = {  # pydantic's `x: str | None = None` and friends
        "type": "object",
        "properties": {
            "x": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "y": {"type": "string", "pattern": "^(?=a)a+$", "format": "regex"},
            "z": {"not": {"type": "null"}},
        },
    }
    tools = [*TOOLS, _tool("optional", optional), _tool("untyped", {"properties": {}})]
    checked = validate_tools(tools)
    assert checked == tools and checked[1] is not tools[1]
    checked[1]["function"]["parameters"]["required"].append("paid")
    assert BOOK["required"] == ["guest", "rooms"]


def test_grammar_schema_narrows_a_copy() -> None:
    schema = copy.deepcopy(BOOK)
    schema["properties"]["both"] = {
        "allOf": [{"type": "object", "properties": {"a": {}}}, {"properties": {"b": {}}}]
    }
    schema["properties"]["re"] = {"type": "string", "pattern": "^(a)\\1$"}
    before = copy.deepcopy(schema)
    prepared = grammar_schema(schema)
    assert schema == before  # the client's schema is never changed
    assert prepared["additionalProperties"] is False
    assert prepared["$defs"]["Guest"]["additionalProperties"] is False
    assert prepared["$defs"]["Guest"]["properties"]["age"]["maximum"] == 2**53 - 1
    assert prepared["properties"]["kind"]["oneOf"][1]["properties"]["beds"] == {
        "type": "integer",
        "maximum": 4,
        "minimum": -(2**53 - 1),
    }
    assert all("additionalProperties" not in s for s in prepared["properties"]["both"]["allOf"])
    assert "pattern" not in prepared["properties"]["re"]  # back-references: not compiled
    assert prepared["properties"]["tags"]["items"]["pattern"] == "^[a-z]{1,5}$"
    assert prepared["x-guidance"]["item_separator"] == ", "
    assert "additionalProperties" not in grammar_schema(MEASURE)["properties"]
    assert grammar_schema(MEASURE)["additionalProperties"] == {
        "type": "integer",
        "maximum": 99,
        "minimum": -(2**53 - 1),
    }


def test_exact_integer_bounds_never_narrow_a_schema_into_nothing() -> None:
    high = grammar_schema({"type": "integer", "minimum": 2**60})
    assert high["minimum"] == 2**60 and "maximum" not in high
    low = grammar_schema({"type": "integer", "exclusiveMaximum": -(2**60)})
    assert "minimum" not in low and low["exclusiveMaximum"] == -(2**60)


def test_check_schema_names_the_path() -> None:
    with pytest.raises(ValueError, match=r"^fmt\.properties\.a\.minimum: not valid JSON Schema"):
        check_schema({"properties": {"a": {"minimum": "1"}}}, "fmt")
    check_schema(True, "fmt")
    check_schema({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{}]}, "fmt")


# --- the token grammar -----------------------------------------------------------------------


class Vocab:
    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = ChatTokenizer.from_dir(model_dir)
        self.table = TokenTable.load(model_dir, self.tokenizer.vocab_size)
        self.end_ids = self.tokenizer.eos_token_ids
        self.open_id = self.tokenizer.token_to_id("<tool_call>")
        self.close_id = self.tokenizer.token_to_id("</tool_call>")
        self.vocabulary = self.build(self.tokenizer.vocab_size)

    def build(self, size: int) -> Vocabulary:
        table = TokenTable.load(self.model_dir, size) if size != len(self.table.raw) else self.table
        return Vocabulary.build(
            self.tokenizer.to_json(),
            table.raw,
            self.end_ids,
            vocab_size=size,
            tag_ids={"<tool_call>": self.open_id, "</tool_call>": self.close_id},
        )

    model_dir: Path

    def grammar(self, choice: str | Mapping[str, Any] = "required") -> ToolCallGrammar:
        return ToolCallGrammar(self.vocabulary, TOOLS, choice)


@pytest.fixture(scope="module")
def vocab(tiny_model_dir: Path) -> Vocab:
    Vocab.model_dir = tiny_model_dir
    return Vocab(tiny_model_dir)


def test_tool_choice_must_name_a_known_function(vocab: Vocab) -> None:
    choices: list[tuple[str | dict[str, Any], str]] = [
        ("auto", "does not constrain"),
        ({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
        ({"type": "function"}, "tool_choice must be"),
    ]
    for choice, message in choices:
        with pytest.raises(ValueError, match=message):
            ToolCallGrammar(vocab.vocabulary, TOOLS, choice)


def test_tags_are_single_tokens_and_only_end_tokens_follow(vocab: Vocab) -> None:
    assert vocab.open_id is not None and vocab.close_id is not None
    grammar = vocab.grammar({"type": "function", "function": {"name": "ping"}})
    assert grammar.allowed().nonzero().flatten().tolist() == [vocab.open_id]
    text = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    ids = vocab.tokenizer.encode(text)
    assert ids[0] == vocab.open_id and ids[-1] == vocab.close_id
    for token_id in ids:
        assert not grammar.complete and grammar.allowed()[token_id]
        grammar.advance(token_id)
    assert grammar.complete and grammar.text == text
    assert grammar.calls() == [("ping", "{}")]
    assert grammar.allowed().nonzero().flatten().tolist() == list(vocab.end_ids)


def test_a_string_holding_a_tag_still_gives_the_call(vocab: Vocab) -> None:
    """The grammar fixed where the call ends; a closing tag's text inside a string is data."""
    grammar = vocab.grammar({"type": "function", "function": {"name": "get_weather"}})
    arguments = '{"city": "</tool_call>"}'
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    head, tail = text[11:-12].split("</tool_call>")  # spelled in pieces, not as the tag token
    pieces = [*vocab.tokenizer.encode(head + "</tool_call"), *vocab.tokenizer.encode(">" + tail)]
    ids = [vocab.open_id, *pieces, vocab.close_id]
    for token_id in ids:
        assert token_id is not None
        grammar.advance(token_id)
    assert grammar.complete and grammar.calls() == [("get_weather", arguments)]


def test_advance_refuses_a_token_the_mask_excludes(vocab: Vocab) -> None:
    grammar = vocab.grammar()
    x = vocab.tokenizer.encode("x")[0]
    assert not grammar.allowed()[x]
    with pytest.raises(ValueError, match="does not continue"):
        grammar.advance(x)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.grammar().advance(vocab.vocabulary.size)
    assert vocab.grammar().calls() == []  # not complete: nothing to report


def test_a_padded_vocabulary_never_allows_the_padding(vocab: Vocab) -> None:
    known = vocab.tokenizer.vocab_size
    padded = vocab.build(known + 32)  # checkpoints round the embedding up
    grammar = ToolCallGrammar(padded, TOOLS, "required")
    while not grammar.complete:
        mask = grammar.allowed()
        assert mask.shape == (known + 32,) and not mask[known:].any()
        grammar.advance(int(mask.nonzero()[-1]))
    with pytest.raises(ValueError, match="inside the vocabulary"):
        Vocabulary.build(vocab.tokenizer.to_json(), vocab.table.raw, [known + 99], vocab_size=known)


def test_the_same_tokens_give_the_same_masks(vocab: Vocab) -> None:
    generator = torch.Generator().manual_seed(7)
    first, path = vocab.grammar(), []
    masks = []
    while not first.complete and len(path) < 60:
        mask = first.allowed()
        masks.append(mask)
        ids = mask.nonzero().flatten()
        path.append(int(ids[torch.randint(len(ids), (1,), generator=generator)]))
        first.advance(path[-1])
    second = vocab.grammar()
    for token_id, mask in zip(path, masks, strict=True):
        assert torch.equal(second.allowed(), mask)
        second.advance(token_id)


def generate(
    model: DecoderModel,
    grammar: ToolCallGrammar | JsonGrammar,
    prefix: tuple[Any, torch.Tensor],
    seed: int,
    end_ids: tuple[int, ...],
    *,
    must_complete: bool = True,
) -> None:
    """Sample a whole output from the model's logits under the grammar."""
    cache, logits = prefix[0].clone(), prefix[1]
    sampler = Sampler(SamplingParams(temperature=1.0), seed=seed)
    for _ in range(400):
        mask = grammar.allowed()
        if grammar.complete and set(mask.nonzero().flatten().tolist()) <= set(end_ids):
            break
        token = sampler.sample(logits, mask).token_id
        if token in end_ids:
            break
        grammar.advance(token)
        logits = model.decode([cache], [token])[0]
    if must_complete:
        assert grammar.complete, grammar.text


@pytest.fixture(scope="module")
def prefix(tiny_model: DecoderModel, vocab: Vocab) -> tuple[Any, torch.Tensor]:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = vocab.tokenizer.encode(vocab.tokenizer.render(messages, tools=TOOLS))
    cache = tiny_model.new_cache()
    return cache, tiny_model.prefill(cache, prompt)


def test_model_driven_calls_always_validate(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor]
) -> None:
    names = set()
    for seed in range(SEEDS):
        grammar = vocab.grammar()
        generate(tiny_model, grammar, prefix, seed, vocab.end_ids)
        [(name, arguments)] = grammar.calls()
        value = json.loads(arguments)
        valid(value, SCHEMAS[name])
        assert json.loads(grammar.text[len("<tool_call>") : -len("</tool_call>")]) == {
            "name": name,
            "arguments": value,
        }
        names.add(name)
    assert len(names) >= 3  # the model's choice among the tools is free


def test_a_named_choice_forces_its_tool(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor]
) -> None:
    for seed in range(5):
        grammar = vocab.grammar({"type": "function", "function": {"name": "book"}})
        generate(tiny_model, grammar, prefix, seed, vocab.end_ids)
        [(name, arguments)] = grammar.calls()
        assert name == "book"
        valid(json.loads(arguments), BOOK)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {
            "type": "object",
            "properties": {
                "answer": {"type": "string", "maxLength": 10},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            },
            "required": ["answer", "score"],
        },
    ],
)
def test_model_driven_json_output_validates(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor], schema: Any
) -> None:
    completed = 0
    for seed in range(8):  # a random model's free keys may run past the 400 tokens
        grammar = JsonGrammar(vocab.vocabulary, schema)
        generate(tiny_model, grammar, prefix, seed, vocab.end_ids, must_complete=False)
        if grammar.complete:
            valid(json.loads(grammar.text), schema)
            completed += 1
    assert completed >= 2


def test_json_output_with_tools_is_a_value_or_a_call(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor]
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    first = JsonGrammar(vocab.vocabulary, schema, tools=TOOLS).allowed()
    assert vocab.open_id is not None and first[vocab.open_id]
    assert first[vocab.tokenizer.encode("{")[0]]
    for seed in range(6):
        grammar = JsonGrammar(vocab.vocabulary, schema, tools=TOOLS)
        generate(tiny_model, grammar, prefix, seed, vocab.end_ids)
        if grammar.text.startswith("<tool_call>"):
            continue
        valid(json.loads(grammar.text), schema)


def test_an_invalid_response_schema_is_named(vocab: Vocab) -> None:
    with pytest.raises(ValueError, match=r"response_format schema\.type: not valid JSON Schema"):
        JsonGrammar(vocab.vocabulary, {"type": "objekt"})


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"x": {"enum": []}}, "required": ["x"]},
        {"type": "object", "properties": {"x": False}, "required": ["x"]},
        {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 5, "maximum": 1}},
            "required": ["x"],
        },
    ],
)
def test_a_schema_nothing_satisfies_names_its_tool(vocab: Vocab, parameters: Any) -> None:
    """Valid JSON Schema, but no value can satisfy it: the model could never call the tool."""
    tools = [_tool("ping"), _tool("never", parameters)]
    with pytest.raises(GrammarError, match=r"^tool 'never' parameters: Unsatisfiable"):
        ToolCallGrammar(vocab.vocabulary, tools, "required")
