"""Tool calls under a grammar: which tokens may come next so the call is valid JSON.

With ``tool_choice`` ``"required"`` or a named function, the reply must be exactly one

    <tool_call>
    {"name": "<tool>", "arguments": <JSON matching the tool's parameters>}
    </tool_call>

which is the layout of the chat template (``inference/data/chat_template.jinja``, whose
``tojson`` writes the same separators), so a call re-rendered into the next prompt reads as
the model wrote it. The parameters compile to the character automaton of
:mod:`inference.json_acceptor` (the schema subset and its policies are in
:mod:`inference.tool_calls`); :class:`ToolCallGrammar` turns it into a token mask: a token
is allowed when its decoded text, fed character by character from the current state, is
still a valid prefix. :class:`JsonAcceptor` is the same automaton one character at a time.

Which tokens take part, and why:

- a token whose text contains U+FFFD (part of a UTF-8 character in a byte-level BPE) never
  does, nor one whose text is empty (it would never make progress), nor the end tokens, nor
  ``forbidden_token_ids`` (pass the tokenizer's special tokens), nor one whose text holds a
  tool-call tag. Non-ASCII characters stay reachable: whole-character tokens, or the
  ``\\uXXXX`` escape;
- where the vocabulary has a single token for ``<tool_call>`` or ``</tool_call>`` the tag
  must be that token (as the tokenizer encodes the template), never spelled out, even if
  it is among ``forbidden_token_ids``;
- the grammar trusts that tokens' texts concatenate to the reply's text: true of
  byte-level BPE (GPT-2, Qwen, Llama 3), not of SentencePiece vocabularies, whose lone
  tokens decode without their leading space.

Cost per step. Masks are memoised per automaton state (states are hashable tuples) in a
cache shared by grammars over the same tools and vocabulary. A miss walks a virtual trie
(the token texts sorted; a prefix is a range found by bisection, so no per-node objects)
from the current state, pruning a range at its first rejected character. Outside strings
most first characters are rejected at once. Inside a string a token's leading run of plain
characters only moves the length, so all-plain tokens are one vector comparison and the
others are walked from their first quote, backslash or control character. Measured on 2
cores: a miss takes about 0.1 ms (at most 0.3 ms) over the tiny model's 768 tokens, and a
whole step, mask cache included, 0.03 ms on average. The cost follows the tokens that
survive their first characters, not the vocabulary: on a synthetic 150k vocabulary (a
quarter of its tokens holding a quote) the index took 1.2 s to build, once per tokenizer,
and a miss took 0.3 ms at the median, 2 ms on average inside strings, 8 ms at worst. The
limit is memory for the memoised masks: one bool per token per state, capped at 64 MiB
per compiled grammar (about 450 states at 150k), oldest first out.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from inference.json_acceptor import (
    DEFAULT_SEPARATORS,
    Lit,
    LitFrame,
    Node,
    Seq,
    State,
    StrFrame,
    Switch,
    Syntax,
    can_finish,
    step,
)
from inference.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    chosen_names,
    compile_schema,
    parameters_node,
    parse_tool_calls,
    validate_tools,
)

__all__ = [
    "GrammarDeadEnd",
    "JsonAcceptor",
    "ToolCallGrammar",
    "parse_tool_calls",
    "validate_tools",
]

_MASK_BUDGET_BYTES = 64 << 20  # of memoised masks per compiled grammar
_COMPILED_KEEP = 8  # compiled grammars kept for reuse by later requests


class GrammarDeadEnd(RuntimeError):
    """No token of the vocabulary continues the call (the vocabulary lacks a character)."""


class _SortedTokens:
    """Token texts in sorted order: a trie without nodes (a prefix is a range)."""

    def __init__(self, pairs: list[tuple[str, int]]) -> None:
        pairs.sort()
        self.texts = [text for text, _ in pairs]
        self.ids = [token_id for _, token_id in pairs]

    def walk(self, state: State) -> list[int]:
        """Ids of the tokens whose whole text can follow ``state``."""
        texts, ids, found = self.texts, self.ids, []
        todo = [(0, len(texts), 0, state)]
        while todo:
            lo, hi, depth, at = todo.pop()
            while lo < hi and len(texts[lo]) == depth:  # the prefix itself is a token
                found.append(ids[lo])
                lo += 1
            while lo < hi:
                text = texts[lo]
                ch = text[depth]
                end = hi
                if ord(ch) < 0x10FFFF:
                    end = bisect.bisect_left(texts, text[:depth] + chr(ord(ch) + 1), lo, hi)
                after = step(at, ch)
                if after is not None:
                    todo.append((lo, end, depth + 1, after))
                lo = end
        return found


class _TokenIndex:
    """What the mask needs of a vocabulary, built once per (vocabulary, exclusions).

    Inside a string, a token's leading run of plain string characters only moves the
    string's length, so tokens are grouped by that run: ``plain_len`` (the token is all
    plain) is one vector comparison, and ``in_string[run]`` holds the rest of each other
    token from its first quote, backslash or control character on, walked from the state
    after ``run`` plain characters.
    """

    def __init__(self, token_texts: Sequence[str], excluded: frozenset[int], vocab: int) -> None:
        self.vocab = vocab
        usable: list[tuple[str, int]] = []
        rests: dict[int, list[tuple[str, int]]] = {}
        plain = torch.full((self.vocab,), -1, dtype=torch.int64)
        for token_id, text in enumerate(token_texts):
            if token_id in excluded or not text or "\ufffd" in text:
                continue
            if OPEN_TAG in text or CLOSE_TAG in text:
                continue
            usable.append((text, token_id))
            run = next((i for i, ch in enumerate(text) if ch < " " or ch in '"\\'), -1)
            if run < 0:
                plain[token_id] = len(text)
            else:
                rests.setdefault(run, []).append((text[run:], token_id))
        self.usable = frozenset(token_id for _, token_id in usable)
        self.plain_len = plain
        self.all = _SortedTokens(usable)
        self.in_string = {run: _SortedTokens(pairs) for run, pairs in sorted(rests.items())}


class _Compiled:
    """The grammar's nodes, the vocabulary index, and the memoised masks per state."""

    def __init__(self, root: Node, index: _TokenIndex, atomic: dict[str, int]) -> None:
        self.root = root
        self.index = index
        self.atomic = atomic  # tag text -> its single token id
        self.masks: dict[State, torch.Tensor] = {}
        self.limit = max(64, _MASK_BUDGET_BYTES // max(1, index.vocab))
        self.lock = threading.Lock()

    def mask(self, state: State) -> torch.Tensor:
        with self.lock:
            cached = self.masks.get(state)
        if cached is not None:
            return cached
        mask = self._compute(state)
        with self.lock:
            if len(self.masks) >= self.limit:
                del self.masks[next(iter(self.masks))]
            self.masks[state] = mask
        return mask

    def _compute(self, state: State) -> torch.Tensor:
        index = self.index
        mask = torch.zeros(index.vocab, dtype=torch.bool)
        top = state[-1]
        if isinstance(top, LitFrame) and top.node.atomic:
            mask[self.atomic[top.node.text]] = True
            return mask
        if isinstance(top, StrFrame) and top.esc == 0:
            longest = top.node.max_len
            room = index.vocab if longest is None else longest - top.chars
            mask |= (index.plain_len >= 0) & (index.plain_len <= room)
            found = []
            for run, rests in index.in_string.items():
                if run <= room:
                    found += rests.walk((*state[:-1], top.after_plain(run)))
        else:
            found = index.all.walk(state)
        if found:
            mask[torch.tensor(found, dtype=torch.int64)] = True
        return mask


_COMPILED: dict[tuple[Any, ...], _Compiled] = {}
_INDEXES: dict[tuple[Any, ...], _TokenIndex] = {}
_CACHE_LOCK = threading.Lock()


def _compile(
    tools: list[dict[str, Any]],
    names: list[str],
    token_texts: Sequence[str],
    excluded: frozenset[int],
    separators: tuple[str, str],
    vocab: int,
) -> _Compiled:
    texts = tuple(token_texts)
    index_key = (texts, excluded, vocab)
    key = (json.dumps(tools, sort_keys=True), tuple(names), separators, index_key)
    with _CACHE_LOCK:
        found = _COMPILED.get(key)
        if found is not None:
            return found
        index = _INDEXES.get(index_key)
    if index is None:
        index = _TokenIndex(texts, excluded, vocab)
    syntax = Syntax(separators)
    atomic = {tag: texts.index(tag) for tag in (OPEN_TAG, CLOSE_TAG) if tag in texts}
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools}
    texts_after_name, tails = [], []
    for name in names:
        arguments = parameters_node(by_name[name], syntax, f"tool '{name}' parameters")
        tails.append(Seq((arguments, Lit("}\n"), Lit(CLOSE_TAG, atomic=CLOSE_TAG in atomic))))
        texts_after_name.append(f'{json.dumps(name)}{syntax.item.text}"arguments"{syntax.key.text}')
    head = Lit(f'\n{{"name"{syntax.key.text}')
    switch = Switch(tuple(texts_after_name), tuple(tails))
    root = Seq((Lit(OPEN_TAG, atomic=OPEN_TAG in atomic), head, switch))
    compiled = _Compiled(root, index, atomic)
    with _CACHE_LOCK:
        _INDEXES[index_key] = index
        while len(_INDEXES) > 2:
            del _INDEXES[next(iter(_INDEXES))]
        _COMPILED[key] = compiled
        while len(_COMPILED) > _COMPILED_KEEP:
            del _COMPILED[next(iter(_COMPILED))]
    return compiled


class ToolCallGrammar:
    """Constrains decoding so a required tool call's text is
    ``<tool_call>\\n{"name": "<tool>", "arguments": <JSON>}\\n</tool_call>`` whose arguments
    parse and match the tool's JSON schema (the subset of :mod:`inference.tool_calls`).

    One call per reply: once the closing tag is complete only ``end_token_ids`` are allowed
    (none, if that list is empty). ``vocab_size`` is the width of the model's logits when
    it exceeds ``len(token_texts)`` (checkpoints pad the embedding; the padding is never
    allowed). ``separators`` are the JSON separators inside the call; the default matches
    ``json.dumps`` and the chat template's ``tojson``.
    """

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]],
        choice: str | Mapping[str, Any],
        token_texts: Sequence[str],
        end_token_ids: Sequence[int],
        *,
        forbidden_token_ids: Sequence[int] = (),
        vocab_size: int | None = None,
        separators: tuple[str, str] = DEFAULT_SEPARATORS,
    ) -> None:
        checked = validate_tools(list(tools))
        names = chosen_names(checked, choice)
        vocab = len(token_texts) if vocab_size is None else vocab_size
        if vocab < len(token_texts):
            raise ValueError(f"vocab_size {vocab} is below the {len(token_texts)} token texts")
        self._end_ids = tuple(sorted(set(end_token_ids)))
        if any(not 0 <= i < vocab for i in self._end_ids):
            raise ValueError(f"an end token id is outside the vocabulary: {self._end_ids}")
        excluded = frozenset(self._end_ids) | frozenset(forbidden_token_ids)
        self._compiled = _compile(checked, names, token_texts, excluded, separators, vocab)
        self._token_texts = token_texts
        self._state: State = self._compiled.root.start()
        self._pieces: list[str] = []
        self._separators = separators

    @property
    def complete(self) -> bool:
        """The closing ``</tool_call>`` has been emitted."""
        return not self._state

    @property
    def text(self) -> str:
        """The text emitted so far."""
        return "".join(self._pieces)

    def allowed(self) -> torch.Tensor:
        """Bool ``[vocab]``: the tokens that keep the text a valid prefix (a fresh tensor)."""
        if self.complete:
            mask = torch.zeros(self._compiled.index.vocab, dtype=torch.bool)
            if self._end_ids:
                mask[torch.tensor(self._end_ids, dtype=torch.int64)] = True
            return mask
        mask = self._compiled.mask(self._state)
        if not bool(mask.any()):
            raise GrammarDeadEnd(f"no token continues the tool call after {self.text!r}")
        return mask.clone()

    def advance(self, token_id: int) -> None:
        """Take the sampled token; ``ValueError`` if the grammar does not allow it."""
        if self.complete:
            if token_id not in self._end_ids:
                raise ValueError(f"token {token_id} after a complete tool call (only end tokens)")
            return
        if not 0 <= token_id < len(self._token_texts):
            raise ValueError(
                f"token {token_id} has no text (vocabulary of {len(self._token_texts)})"
            )
        text = self._token_texts[token_id]
        top = self._state[-1]
        if isinstance(top, LitFrame) and top.node.atomic:
            if token_id != self._compiled.atomic[top.node.text]:
                raise ValueError(f"token {token_id} is not the {top.node.text} tag token")
            self._state = self._state[:-1]
            self._pieces.append(text)
            return
        if token_id not in self._compiled.index.usable:
            raise ValueError(f"token {token_id} ({text!r}) may not appear in a tool call")
        state: State | None = self._state
        for ch in text:
            state = step(state, ch) if state is not None else None
        if state is None:
            raise ValueError(f"token {token_id} ({text!r}) does not continue {self.text!r}")
        self._state = state
        self._pieces.append(text)

    def calls(self) -> list[tuple[str, str]]:
        """``[(name, arguments_json_text)]`` once complete (``[]`` before: cut short)."""
        if not self.complete:
            return []
        text = self.text
        item, key = self._separators
        head = f'{OPEN_TAG}\n{{"name"{key}'
        body = text[len(head) : -len("}\n" + CLOSE_TAG)]
        marker = f'{item}"arguments"{key}'
        name_text, _, arguments = body.partition(marker)
        return [(json.loads(name_text), arguments)]


class JsonAcceptor:
    """One JSON schema's automaton and a current state: ``feed(ch) -> bool``, ``copy()``."""

    def __init__(self, node: Node, state: State | None = None) -> None:
        self.node = node
        self.state: State = node.start() if state is None else state

    @classmethod
    def from_schema(
        cls, schema: Any, *, separators: tuple[str, str] = DEFAULT_SEPARATORS
    ) -> JsonAcceptor:
        """``ValueError`` naming the problem if the schema is outside the subset."""
        return cls(compile_schema(schema, Syntax(separators)))

    def feed(self, ch: str) -> bool:
        """Take one character if it keeps the text a valid prefix; else change nothing."""
        new = step(self.state, ch)
        if new is None:
            return False
        self.state = new
        return True

    def feed_text(self, text: str) -> bool:
        """Take all of ``text`` or none of it."""
        state: State | None = self.state
        for ch in text:
            state = step(state, ch) if state is not None else None
        if state is None:
            return False
        self.state = state
        return True

    def copy(self) -> JsonAcceptor:
        return JsonAcceptor(self.node, self.state)

    @property
    def complete(self) -> bool:
        """The text so far is a whole value matching the schema."""
        return can_finish(self.state)
