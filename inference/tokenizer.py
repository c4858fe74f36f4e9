"""Text to token ids and back, and chat messages to the model's prompt text.

:class:`ChatTokenizer` reads a model directory the way ``transformers`` does: the
``tokenizers`` model from ``tokenizer.json``, the chat template from
``chat_template.jinja`` or else ``tokenizer_config.json``, the special tokens from
``tokenizer_config.json`` and extra end-of-sequence ids from ``generation_config.json``.
Templates render in the same kind of Jinja environment as ``apply_chat_template`` (an
immutable sandbox, ``trim_blocks``/``lstrip_blocks``, loop controls, ``tojson``,
``raise_exception``, the ``generation`` block), so the stock templates of Qwen2, Qwen3 and
Llama render here as they do there.

Two differences, both for determinism: ``strftime_now`` exists only when the caller passes
the clock (``now=``), so a template falls back to its fixed date rather than reading the
wall clock; and a tool call whose ``arguments`` is a JSON string (the OpenAI wire form) is
handed to the template as the parsed object, which is what the templates expect.

A template that does not read ``tools`` (:attr:`ChatTokenizer.supports_tools` is false, as
for SmolLM2's) gets the conversation rewritten first by
:func:`inference.tool_prompt.fallback_messages`: tools in the system turn, calls and
results as text in the tiny template's ``<tool_call>`` layout, ``null`` content as ``""``.
Templates that read ``tools`` render the conversation unchanged.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from inference.tool_prompt import UnsupportedContentError, fallback_messages, template_reads_tools

__all__ = ["ChatTemplateError", "ChatTokenizer"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplateError(ValueError):
    """The chat template is missing, broken, or refused the conversation."""


class ChatTokenizer:
    """A ``tokenizers`` tokenizer with the model's chat template and special tokens."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, str | None],
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        eos_ids = set(extra_eos_ids)
        eos = self.special_tokens.get("eos_token")
        if eos is not None and (eos_id := tokenizer.token_to_id(eos)) is not None:
            eos_ids.add(eos_id)
        self._eos_ids = tuple(sorted(eos_ids))
        env = _environment()
        try:  # a model file's template is outside input: a broken one is a typed error
            self._template = env.from_string(chat_template) if chat_template else None
            self._supports_tools = (
                template_reads_tools(env, chat_template) if chat_template else False
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not parse: {exc}") from None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatTokenizer:
        """Load ``tokenizer.json`` and the chat settings of a Hugging Face model directory."""
        root = Path(model_dir)
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config = _json_object(root / "tokenizer_config.json")
        template_file = root / "chat_template.jinja"
        if template_file.is_file():
            template: str | None = template_file.read_text(encoding="utf-8")
        else:
            template = _pick_template(config.get("chat_template"))
        specials = {key: _token_text(config.get(key)) for key in _SPECIAL_KEYS}
        generation = _json_object(root / "generation_config.json")
        eos = generation.get("eos_token_id")
        extra = [eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)]
        return cls(tokenizer, template, specials, extra)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end a reply: the ``eos_token`` and the generation config's, sorted."""
        return self._eos_ids

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads ``tools``; if not, :meth:`render` uses the fallback."""
        return self._supports_tools

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, added tokens included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (what llguidance's grammars are built on)."""
        text: str = self._tokenizer.to_str()
        return text

    def token_to_id(self, token: str) -> int | None:
        """The id of one token's text, or ``None``."""
        found: int | None = self._tokenizer.token_to_id(token)
        return found

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Rendered prompts carry their own special tokens, hence the default."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        text: str = self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        *,
        now: datetime | None = None,
        parse_tool_arguments: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text of a conversation, by the model's chat template.

        ``tools`` are JSON tool schemas (OpenAI ``{"type": "function", "function": …}``);
        ``now`` defines ``strftime_now``; ``parse_tool_arguments=False`` hands tool-call
        arguments to the template exactly as given; ``template_kwargs`` reach the template
        as variables (e.g. ``enable_thinking``). A template without tool support sees the
        conversation rewritten by :func:`inference.tool_prompt.fallback_messages`.
        """
        if self._template is None:
            raise ChatTemplateError("this model directory has no chat template")
        shown = _with_parsed_arguments(messages) if parse_tool_arguments else list(messages)
        if not self._supports_tools:
            try:
                shown = fallback_messages(shown, tools)
            except UnsupportedContentError as exc:
                raise ChatTemplateError(f"chat template failed: {exc}") from exc
        variables: dict[str, Any] = {**self.special_tokens, **template_kwargs}
        variables.update(
            messages=shown,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
        )
        if now is not None:
            variables["strftime_now"] = now.strftime
        try:
            return self._template.render(**variables)
        except (TemplateError, TypeError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``transformers``' ``tojson``: plain ``json.dumps``, no HTML escaping (unlike Jinja's)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _GenerationBlock(Extension):
    """``{% generation %}…{% endgeneration %}``: marks assistant text for training; renders as is."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension API declares it a class attribute)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render", [], [], None, None)
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Macro) -> str:
        rendered: str = caller()
        return rendered


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def _with_parsed_arguments(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Messages whose tool-call ``arguments`` strings holding JSON objects are parsed."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = copy.deepcopy(dict(message))
            for call in message["tool_calls"]:
                function = call.get("function", call) if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(function, dict) and isinstance(arguments, str):
                    try:
                        parsed = json.loads(arguments)
                    except ValueError:
                        continue
                    if isinstance(parsed, dict):
                        function["arguments"] = parsed
        out.append(message)
    return out


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: text, or ``{"content": …}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any) -> str | None:
    """The template string; older configs keep a list of named templates (take ``default``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None
