"""Constrained tool calls: the JSON acceptor, the tools check, and the token grammar.

- the character automaton accepts the ``json.dumps`` spelling of valid values (chosen, and
  random) and rejects each way of breaking the schema or the canonical layout (whitespace,
  key order, leading zeros, lone surrogates, lengths, counts, I-JSON number limits); a
  randomly mutated text that it still accepts always parses and validates;
- ``validate_tools`` names what is wrong with a malformed tools list or schema;
- the token mask equals a brute-force check of every token's text, state by state;
- the shipped tiny model's own logits, sampled under the grammar for 30 seeds, always give a
  call whose arguments parse and validate against the tool's schema, the mask is never
  empty before the end, and only end tokens follow the closing tag; a named choice forces
  its tool. The time per grammar step is printed (``-s``) and loosely bounded.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.constrained import GrammarDeadEnd, JsonAcceptor, ToolCallGrammar, validate_tools
from inference.json_acceptor import LitFrame, step
from inference.model import DecoderModel
from inference.sampling import Sampler, SamplingParams
from inference.tokenizer import ChatTokenizer

SEEDS = 30


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for this module's model steps, restored afterwards.

    The tiny model's matrices are far too small to gain from threads, and on a shared
    2-core machine a busy neighbour kept MKL's second thread waiting: 2 s of generation
    took over a minute. These tests check validity, not particular tokens, so nothing here
    depends on the thread count.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12, "description": "where"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city"],
}
BOOK = {
    "type": "object",
    "properties": {
        "guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
                "age": {"type": "integer"},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "rooms": {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1, "maxItems": 3},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 6},
    },
    "required": ["guest", "rooms"],
    "additionalProperties": False,
}
MEASURE = {
    "type": "object",
    "properties": {"value": {"type": "number"}, "scale": {"const": 10}},
    "required": ["value"],
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
    "any": {"type": "object"},
    "measure": MEASURE,
}


def conforms(value: Any, schema: Any) -> bool:
    """A small validator for the supported subset (``jsonschema`` is not installed)."""
    if schema is True:
        return True
    if "const" in schema:
        return _same(value, schema["const"])
    if "enum" in schema:
        return any(_same(value, option) for option in schema["enum"])
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is(value, name) for name in names):
            return False
    if isinstance(value, str):
        return bool(schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)))
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        return all(conforms(item, schema.get("items", True)) for item in value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                if not conforms(item, props[key]):
                    return False
            elif extra is False or (isinstance(extra, dict) and not conforms(item, extra)):
                return False
    return True


def _is(value: Any, name: str) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return {
        "string": isinstance(value, str),
        "integer": number and float(value).is_integer(),
        "number": number,
        "boolean": isinstance(value, bool),
        "null": value is None,
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[name]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def acceptor(schema: Any, separators: tuple[str, str] = (", ", ": ")) -> JsonAcceptor:
    return JsonAcceptor.from_schema(schema, separators=separators)


def accepts(schema: Any, text: str, separators: tuple[str, str] = (", ", ": ")) -> bool:
    a = acceptor(schema, separators)
    return a.feed_text(text) and a.complete


# --- the character automaton ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        (WEATHER, {"city": "Paris"}),
        (WEATHER, {"city": 'Zürich "x"\n', "unit": "fahrenheit", "days": -30}),
        (WEATHER, {"city": "", "days": 0}),
        (BOOK, {"guest": {"name": "Ann", "age": 7}, "rooms": [3, 1]}),
        (BOOK, {"guest": {"name": "B", "age": 1}, "rooms": [2], "tags": [], "paid": False}),
        (BOOK, {"guest": {"name": "B", "age": 1}, "rooms": [2], "note": None}),
        (BOOK, {"guest": {"name": "B", "age": 1}, "rooms": [2], "note": "short"}),
        (MEASURE, {"value": -0.5e-7, "scale": 10}),
        (MEASURE, {"value": 123456789012345}),
        ({"type": "object"}, {"a": [1, {"b": None}], "": "x", "c": True}),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, {"x": 1, "y": 2}),
        ({"type": "array", "items": {"type": "array", "items": {"type": "null"}}}, [[None], []]),
        ({"enum": [1, 12, 123, "a", [1, 2], {"k": "v"}]}, 12),
        ({"enum": [1, 12, 123, "a", [1, 2], {"k": "v"}]}, [1, 2]),
        ({"enum": [1, 12, 123, "a", [1, 2], {"k": "v"}]}, {"k": "v"}),
        ({"type": "string"}, "é\u2028🙂\t"),
        ({}, 3.25),
    ],
)
def test_acceptor_takes_the_json_dumps_spelling_of_valid_values(schema: Any, value: Any) -> None:
    assert conforms(value, schema)
    text = json.dumps(value, ensure_ascii=False)
    assert accepts(schema, text), text
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert accepts(schema, compact, separators=(",", ":")), compact


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        (WEATHER, "{}"),  # a required property missing
        (WEATHER, '{"days": 1, "city": "x"}'),  # not in the order of properties
        (WEATHER, '{"city":"x"}'),  # whitespace other than the separators
        (WEATHER, '{"city": "x" }'),
        (WEATHER, ' {"city": "x"}'),
        (WEATHER, '{"city": "x", "extra": 1}'),  # undeclared property
        (WEATHER, '{"city": "0123456789abc"}'),  # 13 > maxLength 12
        (WEATHER, '{"city": "x", "days": 1.0}'),  # integer with a fraction
        (WEATHER, '{"city": "x", "days": 01}'),  # leading zero
        (WEATHER, '{"city": "x", "days": 1234567890123456}'),  # 16 digits: beyond I-JSON
        (WEATHER, '{"city": "x", "unit": "kelvin"}'),
        (WEATHER, '{"city": "x",}'),
        (WEATHER, '{"city": "a\\ud800"}'),  # a lone surrogate escape
        (WEATHER, '{"city": "a\\x"}'),
        (WEATHER, '{"city": "a\tb"}'),  # a raw control character
        (BOOK, '{"guest": {"name": "", "age": 1}, "rooms": [1]}'),  # minLength 1
        (BOOK, '{"guest": {"name": "x", "age": 1}, "rooms": []}'),  # minItems 1
        (BOOK, '{"guest": {"name": "x", "age": 1}, "rooms": [1, 2, 3, 1]}'),  # maxItems 3
        (BOOK, '{"guest": {"name": "x", "age": 1}, "rooms": [4]}'),
        (BOOK, '{"guest": {"name": "x", "age": 1}, "rooms": [1], "paid": 1}'),
        (MEASURE, '{"value": 1e100}'),  # a 3-digit exponent
        (MEASURE, '{"value": 1.}'),
        (MEASURE, '{"value": -}'),
        (MEASURE, '{"value": 1, "scale": 100}'),
        ({"type": "array", "maxItems": 0}, "[1]"),
        ({"enum": [1, 12]}, "123"),
    ],
)
def test_acceptor_rejects_what_breaks_the_schema_or_the_layout(schema: Any, text: str) -> None:
    assert not accepts(schema, text)


_CHARS = ["a", "Z", " ", '"', "\\", "/", "\n", "\t", "\x01", "é", "\u2028", "🙂", "<"]


def random_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A random value that conforms to ``schema`` (the supported subset)."""
    if schema is True or not set(schema) - {"description"}:
        kinds = ["string", "integer", "number", "boolean", "null"]
        kind = rng.choice(kinds + (["array", "object"] if depth < 2 else []))
        return random_value({"type": kind}, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    types = schema["type"]
    kind = rng.choice([types] if isinstance(types, str) else types)
    if kind == "string":
        n = rng.randint(schema.get("minLength", 0), schema.get("maxLength", 8))
        return "".join(rng.choice(_CHARS) for _ in range(n))
    if kind == "integer":
        return rng.choice([0, -7, rng.randint(-(10**15) + 1, 10**15 - 1)])
    if kind == "number":
        return rng.choice([rng.randint(-99, 99), round(rng.uniform(-1e6, 1e6), 4), 1e-07, -2.5e20])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        n = rng.randint(schema.get("minItems", 0), schema.get("maxItems", 3))
        return [random_value(schema.get("items", True), rng, depth + 1) for _ in range(n)]
    props, required = schema.get("properties", {}), schema.get("required", [])
    if not props and schema.get("additionalProperties", True) is not False:
        extra = schema.get("additionalProperties", True)
        keys = ["".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 3))) for _ in range(2)]
        return {k: random_value(extra if extra is not True else True, rng, depth + 1) for k in keys}
    return {
        name: random_value(sub, rng, depth + 1)
        for name, sub in props.items()
        if name in required or rng.random() < 0.5
    }


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_acceptor_is_complete_and_sound_on_random_values(name: str) -> None:
    """Random valid values are accepted; a mutated text it accepts is still valid."""
    schema, rng = SCHEMAS[name], random.Random(name)
    accepted_mutants = 0
    for _ in range(150):
        value = random_value(schema, rng)
        text = json.dumps(value, ensure_ascii=False)
        assert conforms(value, schema) and accepts(schema, text), text
        for _ in range(4):
            i = rng.randrange(len(text) + 1)
            mutant = text[:i] + rng.choice(['"', ",", "1", "}", "]", "a", ""]) + text[i + 1 :]
            if accepts(schema, mutant):
                accepted_mutants += 1
                assert conforms(json.loads(mutant), schema), mutant
    assert accepted_mutants > 0


def test_acceptor_feed_and_copy() -> None:
    a = acceptor(WEATHER)
    assert a.feed_text('{"city": "P')
    fork = a.copy()
    assert not a.feed("\n")  # a refused character changes nothing
    assert a.state == fork.state
    assert a.feed_text('aris"}') and a.complete
    assert not fork.complete and fork.feed('"') and not fork.complete
    assert fork.feed("}") and fork.complete and not fork.feed(" ")
    number = acceptor({"type": "integer"})
    assert number.feed_text("12") and number.complete  # ends when nothing else may follow


# --- the tools check ------------------------------------------------------------------------


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
        ([_tool("a", {"type": "array"})], "parameters must be an object schema"),
        ([_tool("a", {"properties": {}})], "parameters must be an object schema"),
        (
            [
                _tool(
                    "a", {"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}
                )
            ],
            "parameters.properties.x: unsupported schema keyword 'pattern'",
        ),
        (
            [
                _tool(
                    "a", {"type": "object", "properties": {"x": {"type": "integer", "maximum": 3}}}
                )
            ],
            "unsupported schema keyword 'maximum'",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}})],
            "'type' is required alongside ['anyOf']",
        ),
        (
            [
                _tool(
                    "a",
                    {"type": "object", "properties": {"x": {"type": "integer", "maxLength": 3}}},
                )
            ],
            "'maxLength' does not apply to type integer",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"type": "date"}}})],
            "unknown type 'date'",
        ),
        ([_tool("a", {"type": "object", "required": ["x"]})], "required names 'x'"),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"enum": []}}})],
            "x.enum must be a non-empty list",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"type": "string", "enum": [1]}}})],
            "enum value 1 is not of type string",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"type": "array", "items": [{}]}}})],
            "tuple form",
        ),
        (
            [
                _tool(
                    "a",
                    {"type": "object", "properties": {"x": {"type": "string", "maxLength": -1}}},
                )
            ],
            "maxLength must be a non-negative integer",
        ),
        (
            [_tool("a", {"type": "object", "properties": {"x": 3}})],
            "a schema must be a JSON object",
        ),
        ([{"type": "function", "function": {"name": "a", "extra": 1}}], "unsupported members"),
        ([_tool("a", {"type": "object", "properties": {"x": False}})], "x: the schema false"),
        ([_tool("a", {"type": "object", "enum": [{}]})], "not an enum or const"),
        (
            [_tool("a", {"type": "object", "properties": {"x": {"const": 2**60}}})],
            "outside I-JSON's exact integers",
        ),
    ],
)
def test_validate_tools_names_the_problem(tools: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        validate_tools(tools)
    assert message in str(caught.value)


def test_validate_tools_returns_a_copy() -> None:
    checked = validate_tools(TOOLS)
    assert checked == TOOLS and checked[1] is not TOOLS[1]
    checked[1]["function"]["parameters"]["required"].append("paid")
    assert BOOK["required"] == ["guest", "rooms"]


def test_tool_choice_must_name_a_known_function(vocab: Vocab) -> None:
    choices: list[tuple[str | dict[str, Any], str]] = [
        ("auto", "does not constrain"),
        ({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
        ({"type": "function"}, "tool_choice must be"),
    ]
    for choice, message in choices:
        with pytest.raises(ValueError, match=message):
            ToolCallGrammar(TOOLS, choice, vocab.texts, vocab.end_ids)


# --- the token grammar ----------------------------------------------------------------------


class Vocab:
    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.texts = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
        self.end_ids = tokenizer.eos_token_ids
        specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_response>")
        self.forbidden = [tokenizer.token_to_id(t) or 0 for t in specials]

    def grammar(self, choice: str | Mapping[str, Any] = "required") -> ToolCallGrammar:
        return ToolCallGrammar(
            TOOLS, choice, self.texts, self.end_ids, forbidden_token_ids=self.forbidden
        )


@pytest.fixture(scope="module")
def vocab(tiny_model_dir: Path) -> Vocab:
    return Vocab(ChatTokenizer.from_dir(tiny_model_dir))


def brute_force_mask(grammar: ToolCallGrammar, vocab: Vocab) -> set[int]:
    """Every token whose whole text can follow, checked one token at a time."""
    state = grammar._state
    top = state[-1]
    if isinstance(top, LitFrame) and top.node.atomic:
        return {vocab.texts.index(top.node.text)}
    allowed = set()
    for token_id, text in enumerate(vocab.texts):
        if token_id in vocab.end_ids or token_id in vocab.forbidden or not text:
            continue
        if "\ufffd" in text or "<tool_call>" in text or "</tool_call>" in text:
            continue
        at: Any = state
        for ch in text:
            at = step(at, ch) if at is not None else None
        if at is not None:
            allowed.add(token_id)
    return allowed


def test_mask_equals_a_brute_force_check_of_every_token(vocab: Vocab) -> None:
    generator = torch.Generator().manual_seed(7)
    checked = 0
    for _ in range(3):
        grammar = vocab.grammar()
        while not grammar.complete:
            mask = grammar.allowed()
            assert set(mask.nonzero().flatten().tolist()) == brute_force_mask(grammar, vocab)
            checked += 1
            ids = mask.nonzero().flatten()
            grammar.advance(int(ids[torch.randint(len(ids), (1,), generator=generator)]))
        [(name, arguments)] = grammar.calls()
        assert conforms(json.loads(arguments), SCHEMAS[name])
    assert checked > 30


def test_tags_are_single_tokens_and_only_end_tokens_follow(vocab: Vocab) -> None:
    grammar = vocab.grammar({"type": "function", "function": {"name": "ping"}})
    open_id = vocab.tokenizer.token_to_id("<tool_call>")
    close_id = vocab.tokenizer.token_to_id("</tool_call>")
    assert grammar.allowed().nonzero().flatten().tolist() == [open_id]
    with pytest.raises(ValueError, match="tag token"):
        grammar.advance(vocab.texts.index("<"))
    text = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    ids = vocab.tokenizer.encode(text)
    assert ids[0] == open_id and ids[-1] == close_id
    for token_id in ids:
        assert not grammar.complete and grammar.allowed()[token_id]
        grammar.advance(token_id)
    assert grammar.complete and grammar.text == text
    assert grammar.calls() == [("ping", "{}")]
    assert grammar.allowed().nonzero().flatten().tolist() == list(vocab.end_ids)
    with pytest.raises(ValueError, match="only end tokens"):
        grammar.advance(open_id)
    grammar.advance(vocab.end_ids[0])


def test_tag_tokens_work_even_when_listed_as_forbidden(vocab: Vocab) -> None:
    tags = [vocab.tokenizer.token_to_id(t) or 0 for t in ("<tool_call>", "</tool_call>")]
    forbidden = [*vocab.forbidden, *tags]  # a server may pass every added token
    grammar = ToolCallGrammar(
        TOOLS, "required", vocab.texts, vocab.end_ids, forbidden_token_ids=forbidden
    )
    text = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    for token_id in vocab.tokenizer.encode(text):
        grammar.advance(token_id)
    assert grammar.complete and grammar.calls() == [("ping", "{}")]


def test_advance_refuses_a_token_the_mask_excludes(vocab: Vocab) -> None:
    grammar = vocab.grammar()
    grammar.advance(vocab.tokenizer.token_to_id("<tool_call>") or 0)
    with pytest.raises(ValueError, match="does not continue"):
        grammar.advance(vocab.texts.index("x"))
    with pytest.raises(ValueError, match="may not appear"):
        grammar.advance(vocab.end_ids[0])
    with pytest.raises(ValueError, match="has no text"):
        grammar.advance(len(vocab.texts))
    assert grammar.calls() == []  # not complete: nothing to report


def test_a_padded_vocabulary_never_allows_the_padding(vocab: Vocab) -> None:
    padded = len(vocab.texts) + 32  # checkpoints round the embedding up
    grammar = ToolCallGrammar(TOOLS, "required", vocab.texts, vocab.end_ids, vocab_size=padded)
    while not grammar.complete:
        mask = grammar.allowed()
        assert mask.shape == (padded,) and not mask[len(vocab.texts) :].any()
        grammar.advance(int(mask.nonzero()[0]))
    assert grammar.allowed().shape == (padded,)
    with pytest.raises(ValueError, match="below"):
        ToolCallGrammar(TOOLS, "required", vocab.texts, vocab.end_ids, vocab_size=10)


def test_a_vocabulary_without_a_needed_character_is_a_clear_dead_end() -> None:
    texts = ["<tool_call>", "\n", '{"name": "', "a", '", "arguments": ', "<eos>"]
    grammar = ToolCallGrammar([_tool("a")], "required", texts, [5])
    for token_id in (0, 1, 2, 3, 4):
        grammar.advance(token_id)
    with pytest.raises(GrammarDeadEnd, match="no token continues"):
        grammar.allowed()


def generate(
    model: DecoderModel,
    vocab: Vocab,
    prefix: tuple[Any, torch.Tensor],
    seed: int,
    choice: str | Mapping[str, Any] = "required",
) -> tuple[ToolCallGrammar, list[float]]:
    """Sample a whole call from the model's logits under the grammar; time each mask."""
    cache, logits = prefix[0].clone(), prefix[1]
    grammar = vocab.grammar(choice)
    sampler = Sampler(SamplingParams(temperature=1.0), seed=seed)
    times = []
    for _ in range(400):
        start = time.perf_counter()
        mask = grammar.allowed()
        times.append(time.perf_counter() - start)
        assert bool(mask.any())
        token = sampler.sample(logits, mask).token_id
        grammar.advance(token)
        if grammar.complete:
            break
        logits = model.decode([cache], [token])[0]
    assert grammar.complete, grammar.text
    return grammar, times


@pytest.fixture(scope="module")
def prefix(tiny_model: DecoderModel, vocab: Vocab) -> tuple[Any, torch.Tensor]:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = vocab.tokenizer.encode(vocab.tokenizer.render(messages, tools=TOOLS))
    cache = tiny_model.new_cache()
    return cache, tiny_model.prefill(cache, prompt)


def test_model_driven_calls_always_parse_and_validate(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor]
) -> None:
    names, steps, all_times = set(), 0, []
    for seed in range(SEEDS):
        grammar, times = generate(tiny_model, vocab, prefix, seed)
        [(name, arguments)] = grammar.calls()
        value = json.loads(arguments)
        assert conforms(value, SCHEMAS[name]), (name, arguments)
        wrapper = json.loads(grammar.text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert wrapper == {"name": name, "arguments": value}
        assert "\ufffd" not in grammar.text
        names.add(name)
        steps += len(times)
        all_times += times
    assert len(names) >= 3  # the model's choice among the tools is free
    mean_ms = 1000 * sum(all_times) / len(all_times)
    print(f"{steps} grammar steps over {SEEDS} calls: mean {mean_ms:.3f} ms per mask")
    assert mean_ms < 20


def test_a_named_choice_forces_its_tool(
    tiny_model: DecoderModel, vocab: Vocab, prefix: tuple[Any, torch.Tensor]
) -> None:
    choice = {"type": "function", "function": {"name": "book"}}
    for seed in range(5):
        grammar, _ = generate(tiny_model, vocab, prefix, seed, choice)
        [(name, arguments)] = grammar.calls()
        assert name == "book" and conforms(json.loads(arguments), BOOK)


def test_cold_mask_cost_per_step(vocab: Vocab) -> None:
    """Every state new to the cache: the cost of a miss, walked along random paths."""
    generator = torch.Generator().manual_seed(3)
    costs = []
    for round_ in range(5):
        tools = [_tool(f"cold{round_}", BOOK), _tool(f"other{round_}", WEATHER)]
        grammar = ToolCallGrammar(tools, "required", vocab.texts, vocab.end_ids)
        while not grammar.complete:
            start = time.perf_counter()
            mask = grammar._compiled._compute(grammar._state)
            costs.append(time.perf_counter() - start)
            ids = mask.nonzero().flatten()
            grammar.advance(int(ids[torch.randint(len(ids), (1,), generator=generator)]))
    costs.sort()
    median, worst = 1000 * costs[len(costs) // 2], 1000 * costs[-1]
    print(f"cold masks over {len(costs)} steps: median {median:.2f} ms, max {worst:.2f} ms")
    assert median < 20
