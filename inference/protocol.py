"""The wire shapes of the engine's OpenAI-compatible API, as pydantic v2 models.

Requests are validated here and nowhere else: a field of the wrong type or out of range
becomes an OpenAI-style error object (:class:`ApiError`) naming the field. Unknown fields
are accepted and ignored (OpenAI clients send fields this engine does not implement, such
as ``presence_penalty`` or ``parallel_tool_calls``); :func:`ignored_fields` lists them so
the server can log what it ignored. Responses are built from the models below so their
shapes match ``chat.completion`` / ``chat.completion.chunk`` exactly, plus the engine's
``reproducibility`` block.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tokenizers import Tokenizer

from inference.sampling import SampledToken
from record.limits import JsonRefused, OverLimit, check_counts, load_json

__all__ = [
    "ApiError",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatRequest",
    "Choice",
    "ChoiceLogprobs",
    "ChunkChoice",
    "FinishReason",
    "FunctionCall",
    "Message",
    "ModelCard",
    "ModelList",
    "StreamOptions",
    "TokenLogprob",
    "TokenTable",
    "ToolCall",
    "TopLogprob",
    "Usage",
    "error_body",
    "ignored_fields",
    "json_bytes",
    "load_request",
    "parse_clock",
    "parse_request",
    "plain_messages",
    "response_schema",
    "tool_mode",
]

#: Why a reply ended: an end token or stop string, ``max_tokens``, or a tool call.
FinishReason = Literal["stop", "length", "tool_calls"]

#: Largest and smallest seed accepted: a signed 64-bit integer, as OpenAI documents it.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class ApiError(Exception):
    """A request the engine refuses: HTTP ``status`` and the OpenAI error fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str = "invalid_value",
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}``."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str, param: str | None, code: str | None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` means anything here."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """A ``/v1/chat/completions`` request; fields beyond OpenAI's are the engine's own.

    Engine fields: ``top_k`` (0 = off), ``clock`` (RFC 3339 UTC: ``created`` and the
    template's ``strftime_now``), ``cache_salt`` (scope of prefix-cache entries),
    ``strict_cache`` (a single-use salt drawn by the engine: no shared cache state).
    """

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    user: str | None = None
    clock: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    strict_cache: bool = False

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return value

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for message in value:
            if not isinstance(message.get("role"), str):
                raise ValueError("every message needs a string role")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (empty when absent)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def requested_max_tokens(self) -> int | None:
        """``max_tokens``, or the newer ``max_completion_tokens`` when only it is given."""
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


def load_request(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object within ``record.limits`` (the proxy's limits, so a
    request the proxy accepted is one the engine reads), or :class:`ApiError` saying what is
    wrong with it. The template, the schema check and the grammar walk a request
    recursively: the nesting limit keeps them from failing inside."""
    try:
        raw = load_json(body)
        if not isinstance(raw, dict):
            raise ApiError("the request body must be a JSON object", code="invalid_json")
        check_counts(raw)
    except OverLimit as exc:
        raise ApiError(f"the request body is past a limit: {exc}", code="invalid_json") from None
    except JsonRefused as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    return raw


def parse_request(body: bytes) -> tuple[ChatRequest, dict[str, Any]]:
    """Validated request and the raw JSON object (the prompt digest hashes the raw one)."""
    raw = load_request(body)
    try:
        request = ChatRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(f"{param}: {first['msg']}", param=param) from None
    if request.top_logprobs and not request.logprobs:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return request, raw


def ignored_fields(request: ChatRequest) -> list[str]:
    """Names of the request's fields this engine does not implement (it ignores them)."""
    extra = sorted(request.model_extra or {})
    if request.stream_options is not None:
        extra += [f"stream_options.{k}" for k in sorted(request.stream_options.model_extra or {})]
    return extra


def parse_clock(text: str) -> datetime:
    """An RFC 3339 instant in UTC (``Z`` or ``+00:00``); :class:`ApiError` otherwise."""
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(f"clock {text!r} is not an RFC 3339 timestamp", param="clock") from None
    if "T" not in text.upper() or instant.utcoffset() != timedelta(0):
        raise ApiError(f"clock {text!r} must be an RFC 3339 UTC timestamp", param="clock")
    return instant.astimezone(UTC)


def response_schema(response_format: dict[str, Any] | None) -> Any:
    """The JSON Schema a ``response_format`` constrains the reply to, or ``None`` for text.

    ``json_object``: any object; ``json_schema``: its ``schema`` (absent: any JSON value).
    The schema itself is checked when its grammar is built.
    """
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise ApiError(
            f"response_format.type must be 'text', 'json_object' or 'json_schema', not {kind!r}",
            param="response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(
            "response_format.json_schema must be an object with a name and a schema",
            param="response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(
            "response_format.json_schema.name must be a non-empty string",
            param="response_format.json_schema.name",
        )
    return spec.get("schema", True)


def tool_mode(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[str, Any]:
    """``(mode, choice)`` with mode ``none``, ``auto``, ``required`` or ``named``; 400 else.

    Without ``tool_choice`` the mode is ``auto`` when tools are given, ``none`` otherwise.
    """
    names = {t["function"]["name"] for t in tools or []}
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto"):
        return choice, None
    if choice == "required":
        if not tools:
            raise ApiError("tool_choice 'required' needs tools", param="tool_choice")
        return "required", "required"
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ApiError(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if name not in names:
            raise ApiError(f"tool_choice names {name!r}, which is not a tool", param="tool_choice")
        return "named", {"type": "function", "function": {"name": name}}
    raise ApiError(f"unknown tool_choice {choice!r}", param="tool_choice")


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates take them.

    - Content-part lists are joined into text (templates expect strings).
    - The ``developer`` role (OpenAI's name for system instructions to newer models) is
      ``system``: no open model's template knows it.
    - The system messages a conversation opens with become one, their texts joined with a
      blank line: an agent framework's instructions and a client's own system prompt arrive
      as several, and most templates take one system message, first. System messages later
      in the conversation are left to the template.
    """
    out: list[dict[str, Any]] = []
    for message in _text_messages(messages):
        if message.get("role") == "developer":
            message = {**message, "role": "system"}
        opening = bool(out) and all(m.get("role") == "system" for m in out)
        if message.get("role") == "system" and opening:
            first = out[0]
            joined = "\n\n".join(t for t in (first.get("content"), message.get("content")) if t)
            out[0] = {**first, "content": joined}
            continue
        out.append(message)
    return out


def _text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content-part lists are joined into text."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ApiError("only text content parts are supported", param="messages")
                parts.append(str(part.get("text", "")))
            message = {**message, "content": "".join(parts)}
        elif content is not None and not isinstance(content, str):
            raise ApiError("message content must be a string or text parts", param="messages")
        out.append(message)
    return out


class ModelCard(BaseModel):
    """One entry of ``/v1/models``."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "affidavit"


class ModelList(BaseModel):
    """``/v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class TopLogprob(BaseModel):
    """One alternative token and its log-probability."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    """A sampled token, its log-probability and the most likely alternatives."""

    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """``choices[].logprobs``."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class FunctionCall(BaseModel):
    """A tool call's function: its name and JSON-encoded arguments."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """``message.tool_calls[]``; ``id`` is derived (prompt digest, seed, ordinal)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """The assistant's reply."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    """``choices[]`` of a non-streaming reply (always one: ``n`` is 1)."""

    index: int = 0
    message: Message
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class PromptTokensDetails(BaseModel):
    """``usage.prompt_tokens_details``: how much of the prompt came from the prefix cache."""

    cached_tokens: int


class Usage(BaseModel):
    """Token counts; ``completion_tokens`` counts every sampled token, an end token too."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(BaseModel):
    """A ``chat.completion`` object with the engine's ``reproducibility`` block."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str
    reproducibility: dict[str, Any]


class ChunkChoice(BaseModel):
    """``choices[]`` of a chunk; ``delta`` holds only the members that changed."""

    index: int = 0
    delta: dict[str, Any]
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """A ``chat.completion.chunk``; the last one carries ``reproducibility`` and no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    reproducibility: dict[str, Any] | None = None

    def sse(self) -> bytes:
        """One SSE event (``data: {json}`` and a blank line); unset extras left out."""
        data = self.model_dump(mode="json")
        for key in ("usage", "reproducibility"):
            if data[key] is None:
                del data[key]
        return b"data: " + json_bytes(data) + b"\n\n"


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON, member order as built: the same value gives the same bytes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


#: OpenAI's stand-in for a log-probability that is not finite (a token masked out).
MASKED_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenTable:
    """Every token id's text and raw bytes: what logprobs report and grammars match.

    Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) spell bytes as printable characters;
    mapped back, a token that holds half a UTF-8 character still reports its exact bytes,
    where its decoded text is only U+FFFD. Other vocabularies report the text's bytes.
    """

    texts: tuple[str, ...]
    raw: tuple[bytes, ...]
    special: frozenset[int]

    @classmethod
    def load(cls, model_dir: str | Path, vocab_size: int) -> TokenTable:
        """Read ``tokenizer.json``; ids past its vocabulary (padding rows) are empty."""
        return cls.from_tokenizer(
            Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")), vocab_size
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int) -> TokenTable:
        """The table of a loaded tokenizer (a GGUF checkpoint's is built in memory)."""
        known = min(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
        texts = list(tokenizer.decode_batch([[i] for i in range(known)], skip_special_tokens=False))
        texts += [""] * (vocab_size - known)
        decoder = json.loads(tokenizer.to_str()).get("decoder")
        added = set(tokenizer.get_added_tokens_decoder())
        inverse = {c: b for b, c in _bytes_to_unicode().items()} if _byte_level(decoder) else {}
        raw = []
        for i, text in enumerate(texts):
            piece = tokenizer.id_to_token(i) if i < known and i not in added else None
            if inverse and piece is not None and all(c in inverse for c in piece):
                raw.append(bytes(inverse[c] for c in piece))
            else:
                raw.append(text.encode("utf-8"))
        special = frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
        return cls(tuple(texts), tuple(raw), special)

    def logprob(self, token: SampledToken) -> TokenLogprob:
        """The ``logprobs.content[]`` entry of a sampled token."""
        top = [self._top(i, lp) for i, lp in token.top]
        chosen = self._top(token.token_id, token.logprob)
        return TokenLogprob(
            token=chosen.token, logprob=chosen.logprob, bytes=chosen.bytes, top_logprobs=top
        )

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        value = logprob if math.isfinite(logprob) else MASKED_LOGPROB
        return TopLogprob(token=self.texts[token_id], logprob=value, bytes=list(self.raw[token_id]))


def _byte_level(decoder: Any) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_byte_level(d) for d in decoder.get("decoders") or [])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map, which byte-level BPE vocabularies use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}
