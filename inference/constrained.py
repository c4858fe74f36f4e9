"""Constrained decoding on llguidance: which tokens may come next so the output parses.

Two grammars, both compiled by llguidance (the grammar engine vLLM and llama.cpp use) from
Lark with embedded JSON Schemas (``%json``):

- :class:`ToolCallGrammar`, for ``tool_choice`` ``"required"`` or a named function: the
  reply is exactly one

      <tool_call>
      {"name": "<tool>", "arguments": <JSON valid against the tool's parameters>}
      </tool_call>

  which is the layout of the chat template (``inference/data/chat_template.jinja``, whose
  ``tojson`` writes the same separators), so a call re-rendered into the next prompt reads
  as the model wrote it. Where the vocabulary has a single token for ``<tool_call>`` or
  ``</tool_call>`` the tag is that token (as the tokenizer encodes the template), never
  spelled out;
- :class:`JsonGrammar`, for ``response_format`` ``json_object``/``json_schema``: the reply
  is one JSON value (an object for ``json_object``); with tools under ``auto`` it may
  instead be one tool call.

Schemas are prepared by :mod:`inference.schema` (checked, narrowed, JSON options set).

**Determinism.** A mask is a function of the grammar and the tokens consumed so far:
llguidance has no clocks or thread-dependent state in it, and its per-step work limits are
counted in "fuel", not time, so a limit hit is the same on every run. Special tokens never
appear inside the text (llguidance keeps them out of lexemes), nor do ids past the
tokenizer's vocabulary (checkpoints pad the embedding).

Cost: the vocabulary is converted once per engine (:class:`Vocabulary`, about 0.2 s for a
49k-token vocabulary); a grammar compiles in milliseconds and is kept for reuse (a fresh
matcher per reply); a mask takes about 0.1 ms.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from llguidance import LLMatcher, LLTokenizer
from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

from inference.schema import check_schema, grammar_schema
from inference.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    chosen_names,
    parameters_schema,
    parse_call,
    parse_tool_calls,
    validate_tools,
)

__all__ = [
    "GrammarDeadEnd",
    "GrammarError",
    "JsonGrammar",
    "ToolCallGrammar",
    "Vocabulary",
    "parse_tool_calls",
    "validate_tools",
]

_COMPILED_KEEP = 32  # compiled grammars kept for reuse by later requests
_BITS = torch.arange(32, dtype=torch.int32)


class GrammarDeadEnd(RuntimeError):
    """No token of the vocabulary continues the output (the vocabulary lacks a character)."""


class GrammarError(ValueError):
    """A valid schema the grammar engine still cannot compile (too large, say)."""


@dataclass(frozen=True)
class Vocabulary:
    """What the grammars need of a model's tokenizer, converted once.

    ``raw`` holds each token's exact bytes (a byte-level token may be half a character), so
    the text of a grammar's output is decoded from bytes, never from lossy token texts.
    """

    tokenizer: LLTokenizer
    raw: tuple[bytes, ...]
    end_ids: tuple[int, ...]
    tags: Mapping[str, int]  # tag text -> its single token id, where the vocabulary has one

    @classmethod
    def build(
        cls,
        tokenizer_json: str,
        raw: Sequence[bytes],
        end_ids: Sequence[int],
        *,
        vocab_size: int,
        tag_ids: Mapping[str, int | None] | None = None,
    ) -> Vocabulary:
        ends = sorted(set(end_ids))
        if not ends or any(not 0 <= i < vocab_size for i in ends):
            raise ValueError(f"end token ids must be inside the vocabulary: {ends}")
        tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=ends)
        tags = {tag: i for tag, i in (tag_ids or {}).items() if i is not None}
        return cls(tokenizer, tuple(raw), tuple(ends), tags)

    @property
    def size(self) -> int:
        return int(self.tokenizer.vocab_size)


class _Grammars:
    """Compiled grammars by their Lark text, shared by requests over one vocabulary."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiled: dict[tuple[int, str], LLMatcher] = {}

    def matcher(self, vocabulary: Vocabulary, lark: str) -> LLMatcher:
        key = (id(vocabulary.tokenizer), lark)
        with self._lock:
            found = self._compiled.get(key)
        if found is None:
            found = LLMatcher(vocabulary.tokenizer, lark, log_level=0)
            if found.is_error():
                raise GrammarError(_first_line(found.get_error()))
            with self._lock:
                self._compiled[key] = found
                while len(self._compiled) > _COMPILED_KEEP:
                    del self._compiled[next(iter(self._compiled))]
        return found.deep_copy()


_GRAMMARS = _Grammars()


class _Constrained:
    """One reply's matcher: the :class:`~inference.scheduler.Constraint` protocol."""

    def __init__(self, vocabulary: Vocabulary, lark: str) -> None:
        self._vocabulary = vocabulary
        self._matcher = _GRAMMARS.matcher(vocabulary, lark)
        self._bitmask = allocate_token_bitmask(1, vocabulary.size)
        self._tokens: list[int] = []

    @property
    def complete(self) -> bool:
        """The output so far is whole: only an end token may follow."""
        return bool(self._matcher.is_accepting())

    @property
    def text(self) -> str:
        """The text emitted so far, decoded from the tokens' bytes."""
        raw = self._vocabulary.raw
        data = b"".join(raw[i] for i in self._tokens if i not in self._vocabulary.end_ids)
        return data.decode("utf-8", errors="replace")

    def allowed(self) -> torch.Tensor:
        """Bool ``[vocab]``: the tokens that keep the output a valid prefix (a fresh tensor)."""
        fill_next_token_bitmask(self._matcher, self._bitmask)
        if self._matcher.is_error():
            raise GrammarDeadEnd(_first_line(self._matcher.get_error()))
        words = self._bitmask[0]
        mask = ((words.unsqueeze(1) >> _BITS) & 1).flatten()[: self._vocabulary.size].bool()
        if not bool(mask.any()):
            raise GrammarDeadEnd(f"no token continues the output after {self.text!r}")
        return mask

    def advance(self, token_id: int) -> None:
        """Take the sampled token; ``ValueError`` if the grammar does not allow it."""
        if not 0 <= token_id < self._vocabulary.size:
            raise ValueError(f"token {token_id} is outside the vocabulary")
        if self._matcher.is_stopped() and token_id in self._vocabulary.end_ids:
            return
        if not self._matcher.consume_token(token_id):
            error = _first_line(self._matcher.get_error())
            raise ValueError(f"token {token_id} does not continue {self.text!r}: {error}")
        self._tokens.append(token_id)


class ToolCallGrammar(_Constrained):
    """Constrains decoding to one ``<tool_call>`` block whose arguments are valid against
    the chosen tool's parameters (as :mod:`inference.schema` prepares them).

    ``ValueError`` (a :class:`GrammarError` when only the grammar engine objects) names
    what is wrong with the tools or the choice.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        tools: Sequence[Mapping[str, Any]],
        choice: str | Mapping[str, Any],
    ) -> None:
        checked = validate_tools(list(tools))
        names = chosen_names(checked, choice)
        rules = _call_rules(vocabulary, checked, names)
        try:
            super().__init__(vocabulary, "start: call\n" + rules)
        except GrammarError:
            _name_the_tool(vocabulary, checked, names)
            raise

    def calls(self) -> list[tuple[str, str]]:
        """``[(name, arguments_json_text)]`` once complete (``[]`` before: cut short)."""
        if not self.complete:
            return []
        text = self.text  # the grammar fixed the tags; a string may hold a tag's text
        call = parse_call(text[len(OPEN_TAG) : len(text) - len(CLOSE_TAG)])
        return [call] if call is not None else []


class JsonGrammar(_Constrained):
    """Constrains decoding to one JSON value valid against ``schema`` (``json_object``:
    ``{"type": "object"}``). With ``tools`` (``tool_choice`` ``auto``) the reply may be
    one tool call instead, parsed from the text as any ``auto`` reply is."""

    def __init__(
        self,
        vocabulary: Vocabulary,
        schema: Mapping[str, Any] | bool,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        check_schema(schema, "response_format schema")
        start = "start: value"
        rules = f"value: %json {_json(grammar_schema(schema))}\n"
        if tools:
            checked = validate_tools(list(tools))
            names = [tool["function"]["name"] for tool in checked]
            start = "start: value | call"
            rules += _call_rules(vocabulary, checked, names)
        super().__init__(vocabulary, f"{start}\n{rules}")


def _name_the_tool(vocabulary: Vocabulary, tools: list[dict[str, Any]], names: list[str]) -> None:
    """Raise a :class:`GrammarError` naming the first tool whose parameters do not compile."""
    for tool in tools:
        name = tool["function"]["name"]
        if name not in names:
            continue
        schema = grammar_schema(parameters_schema(tool["function"], "parameters"))
        matcher = LLMatcher(vocabulary.tokenizer, f"start: %json {_json(schema)}", log_level=0)
        if matcher.is_error():
            raise GrammarError(f"tool '{name}' parameters: {_first_line(matcher.get_error())}")


def _call_rules(vocabulary: Vocabulary, tools: list[dict[str, Any]], names: list[str]) -> str:
    """Lark rules for ``call``: the tag, one of the named tools with its arguments, the tag."""
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools}
    alternatives, rules = [], []
    for i, name in enumerate(names):
        head = f'\n{{"name": {json.dumps(name)}, "arguments": '
        alternatives.append(f"{_lit(head)} args{i} {_lit('}' + chr(10))}")
        schema = grammar_schema(parameters_schema(by_name[name], f"tool '{name}' parameters"))
        rules.append(f"args{i}: %json {_json(schema)}")
    body = "body: " + " | ".join(alternatives)
    call = f"call: {_tag(vocabulary, OPEN_TAG)} body {_tag(vocabulary, CLOSE_TAG)}"
    return "\n".join([call, body, *rules]) + "\n"


def _tag(vocabulary: Vocabulary, tag: str) -> str:
    token_id = vocabulary.tags.get(tag)
    return f"<[{token_id}]>" if token_id is not None else _lit(tag)


def _lit(text: str) -> str:
    """A Lark string literal (JSON string escapes are Lark's)."""
    return json.dumps(text)


def _json(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=True, separators=(",", ":"))


def _first_line(message: str) -> str:
    """llguidance's message without its grammar excerpt and position prefix."""
    first = message.strip().splitlines()[0] if message.strip() else "grammar error"
    return _POSITION.sub("", first).removeprefix("failed to compile JSON schema: ")


_POSITION = re.compile(r"^at \d+\(\d+\): ")
