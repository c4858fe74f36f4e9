"""OpenAI's Responses API (``POST /v1/responses``) read as the engine's chat request.

A Responses request is validated here and translated into the Chat Completions request the
engine already serves (:meth:`inference.server.Engine.prepare`): ``instructions`` becomes
the first system message; ``input`` (a string, or a list of items) becomes the messages:
``message`` items (roles ``user``, ``system``, ``developer``, ``assistant``; content a string
or ``input_text``/``output_text`` parts), ``function_call`` items (an assistant message's
``tool_calls``, consecutive calls joined into one message) and ``function_call_output``
items (``tool`` messages). Flat ``function`` tools get the nested chat shape, a named
``tool_choice`` likewise; ``max_output_tokens`` is ``max_tokens``; ``text.format``
(``json_schema``, ``json_object``) is ``response_format``; the engine's extension members
(``seed``, ``clock``, ``strict_cache``, ``cache_salt``, ``top_k``) pass through unchanged.

A pinned reply is a pure function of its request, so whatever needs state kept on the
server (``previous_response_id``, ``store: true``, ``conversation``, ``background: true``)
is refused with a 400 naming the member. This module never renders, samples or touches
torch: :mod:`inference.responses_reply` shapes the answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference.protocol import SEED_MAX, SEED_MIN, ApiError, load_request

__all__ = ["ResponsesRequest", "chat_request", "parse_responses_request"]

#: Members that would make a reply depend on state kept between requests.
_STATEFUL = ("previous_response_id", "conversation", "store", "background")
_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class ResponsesRequest(BaseModel):
    """The members of a ``/v1/responses`` request this engine reads (others are ignored).

    Engine members, as on the chat route: ``seed``, ``top_k``, ``clock``, ``cache_salt``,
    ``strict_cache``.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: dict[str, Any] | None = None
    stream: bool = False
    user: str | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    top_k: int | None = Field(default=None, ge=0)
    clock: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    strict_cache: bool | None = None


def parse_responses_request(body: bytes) -> tuple[ResponsesRequest, dict[str, Any]]:
    """The validated request and its raw JSON object (the prompt digest hashes the raw one)."""
    raw = load_request(body)
    for member in _STATEFUL:
        value = raw.get(member)
        if value is None or value is False:
            continue
        raise ApiError(
            f"{member} is not supported: this engine keeps no state between requests, so a "
            "reply is a pure function of its request; send the whole conversation as input",
            param=member,
            code="unsupported_parameter",
        )
    try:
        request = ResponsesRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(f"{param}: {first['msg']}", param=param) from None
    return request, raw


def chat_request(request: ResponsesRequest) -> dict[str, Any]:
    """The Chat Completions request that asks the engine the same question."""
    chat: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
    if request.tools:
        chat["tools"] = [_tool(i, tool) for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(request.tool_choice)
    form = _response_format(request.text)
    if form is not None:
        chat["response_format"] = form
    if request.max_output_tokens is not None:
        chat["max_tokens"] = request.max_output_tokens
    for member in ("temperature", "top_p", "seed", "top_k", "clock", "cache_salt", "user"):
        value = getattr(request, member)
        if value is not None:
            chat[member] = value
    if request.strict_cache:
        chat["strict_cache"] = True
    return chat


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for index, item in enumerate(request.input):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(f"{where}.call_id must be a non-empty string", param=where)
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise ApiError(
                f"{where}.type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                param=f"{where}.type",
            )
    if not messages:
        raise ApiError("input must hold at least one item", param="input")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a list is no role (found by fuzzing)
        raise ApiError(f"{where}.role must be one of {sorted(_ROLES)}", param=f"{where}.role")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """A string, or text parts joined: templates take strings."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str) or kind not in _TEXT_PARTS:
                raise ApiError(
                    f"{where}[{i}]: only input_text and output_text parts are supported",
                    param=where,
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError(f"{where}[{i}].text must be a string", param=where)
            texts.append(text)
        return "".join(texts)
    raise ApiError(f"{where} must be a string or a list of text parts", param=where)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for member in ("call_id", "name", "arguments"):
        if not isinstance(item.get(member), str):
            raise ApiError(f"{where}.{member} must be a string", param=f"{where}.{member}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A flat Responses function tool in the chat shape (the engine checks its schema)."""
    if tool.get("type") != "function":
        raise ApiError(
            f"tools[{index}].type {tool.get('type')!r} is not supported (function only)",
            param=f"tools[{index}].type",
            code="invalid_tools",
        )
    function = {k: v for k, v in tool.items() if k != "type" and v is not None}
    if function.get("parameters") is None:
        function.pop("parameters", None)
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # none, auto, required: the chat route judges them
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise ApiError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise ApiError("text.format must be an object", param="text.format")
    kind = form.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: form[k] for k in ("name", "description", "schema", "strict") if k in form}
        return {"type": "json_schema", "json_schema": schema}
    raise ApiError(f"text.format.type {kind!r} is not supported", param="text.format.type")
