"""The model APIs the harness speaks, each through its provider's official SDK.

``OpenAIChat`` uses ``openai`` (Chat Completions), ``OpenAIResponses`` uses ``openai``
(Responses: session label ``responses``), ``AnthropicMessages`` uses ``anthropic``
(Messages). Each turns the harness's conversation and tool catalogue into its API's request,
streams the reply, and hands back one ``Completion``: the text, the tool calls, why it
stopped, and the proxy's annotation (OpenAI: a chunk with ``choices: []``; Anthropic: an
``affidavit`` event). Each also says how a reply and its tool results go back into the
conversation, since the two APIs shape them differently (OpenAI: one ``tool`` message per
result; Anthropic: one ``user`` message holding every ``tool_result`` block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from harness import prompt
from harness.tools import ToolOutput, ToolSpec
from record.limits import JsonRefused, load_json

__all__ = [
    "API_NAMES",
    "AnthropicMessages",
    "ApiError",
    "Completion",
    "ModelApi",
    "OpenAIChat",
    "OpenAIResponses",
]

Api = Literal["openai", "anthropic", "responses"]
API_NAMES: tuple[Api, ...] = ("openai", "anthropic", "responses")
#: Anthropic requires ``max_tokens``; a session's ``max_tokens`` pin replaces it.
ANTHROPIC_MAX_TOKENS = 1024


@dataclass
class Completion:
    """One streamed reply as the SDK delivered it, with the proxy's annotation."""

    content: str
    tool_calls: list[tuple[str, str, str]]  # (id, function name, arguments JSON)
    finish_reason: str | None  # "stop", "tool_calls" or "length", whatever the API
    annotation: dict[str, Any] | None


class ApiError(Exception):
    """The SDK raised: the step got no reply it could use."""


class ModelApi(Protocol):
    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        catalogue: Sequence[ToolSpec],
        tool_choice: str | dict[str, Any],
        headers: Mapping[str, str],
    ) -> Completion: ...

    def reply_messages(
        self, done: Completion, results: Sequence[tuple[str, ToolOutput]]
    ) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass
class OpenAIChat:
    client: Any  # openai.OpenAI

    def close(self) -> None:
        self.client.close()

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        catalogue: Sequence[ToolSpec],
        tool_choice: str | dict[str, Any],
        headers: Mapping[str, str],
    ) -> Completion:
        import openai

        extra: dict[str, Any] = {}
        if catalogue:
            extra["tools"] = [spec.function() for spec in catalogue]
            extra["tool_choice"] = tool_choice
        try:
            chunks = self.client.chat.completions.create(
                model=model, messages=messages, stream=True, extra_headers=dict(headers), **extra
            )
            return _collect_openai(chunks)
        except openai.APIError as exc:
            raise ApiError(f"{type(exc).__name__}: {exc}") from exc

    def reply_messages(
        self, done: Completion, results: Sequence[tuple[str, ToolOutput]]
    ) -> list[dict[str, Any]]:
        messages = [prompt.assistant_message(done.content, done.tool_calls)]
        return messages + [prompt.tool_message(call_id, output) for call_id, output in results]


def _collect_openai(chunks: Any) -> Completion:
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    finish: str | None = None
    annotation: dict[str, Any] | None = None
    for chunk in chunks:
        extra: Mapping[str, Any] = chunk.model_extra or {}
        if isinstance(extra.get("affidavit"), dict):
            annotation = extra["affidavit"]
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            if choice.delta.content:
                content.append(choice.delta.content)
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, ["", "", ""])
                call[0] += delta.id or ""
                if delta.function is not None:
                    call[1] += delta.function.name or ""
                    call[2] += delta.function.arguments or ""
    return Completion(
        "".join(content),
        [(c[0], c[1], c[2]) for _, c in sorted(calls.items())],
        finish,
        annotation,
    )


_STOP = {"tool_use": "tool_calls", "max_tokens": "length", "end_turn": "stop"}


def _anthropic_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(choice, dict):
        return {"type": "tool", "name": str(choice.get("function", {}).get("name", ""))}
    return {"type": {"required": "any"}.get(choice, choice)}  # auto, any, none


@dataclass
class AnthropicMessages:
    client: Any  # anthropic.Anthropic

    def close(self) -> None:
        self.client.close()

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        catalogue: Sequence[ToolSpec],
        tool_choice: str | dict[str, Any],
        headers: Mapping[str, str],
    ) -> Completion:
        import anthropic

        extra: dict[str, Any] = {}
        if catalogue:
            extra["tools"] = [
                {"name": s.name, "description": s.description, "input_schema": s.parameters}
                for s in catalogue
            ]
            extra["tool_choice"] = _anthropic_choice(tool_choice)
        try:
            events = self.client.messages.create(
                model=model,
                max_tokens=ANTHROPIC_MAX_TOKENS,
                messages=messages,
                stream=True,
                extra_headers=dict(headers),
                **extra,
            )
            return _collect_anthropic(events)
        except anthropic.APIError as exc:
            raise ApiError(f"{type(exc).__name__}: {exc}") from exc

    def reply_messages(
        self, done: Completion, results: Sequence[tuple[str, ToolOutput]]
    ) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if done.content:
            blocks.append({"type": "text", "text": done.content})
        for call_id, name, arguments in done.tool_calls:
            try:
                given = load_json(arguments or "{}")
            except JsonRefused:
                given = {}
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": given})
        messages: list[dict[str, Any]] = [{"role": "assistant", "content": blocks}]
        if results:
            answers = [
                {"type": "tool_result", "tool_use_id": call_id, "content": output.text}
                for call_id, output in results
            ]
            messages.append({"role": "user", "content": answers})
        return messages


def _collect_anthropic(events: Any) -> Completion:
    text: list[str] = []
    blocks: dict[int, list[str]] = {}  # index -> [id, name, partial json]
    finish: str | None = None
    annotation: dict[str, Any] | None = None
    for event in events:
        kind = getattr(event, "type", None)
        if kind == "content_block_start" and event.content_block.type == "tool_use":
            blocks[event.index] = [event.content_block.id, event.content_block.name, ""]
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                text.append(delta.text)
            elif delta.type == "input_json_delta" and event.index in blocks:
                blocks[event.index][2] += delta.partial_json
        elif kind == "message_delta" and event.delta.stop_reason:
            finish = _STOP.get(event.delta.stop_reason, event.delta.stop_reason)
        elif kind == "affidavit":  # the proxy's event; the SDK hands it over untyped
            extra = getattr(event, "model_extra", None) or {}
            note = extra.get("affidavit") if isinstance(extra, dict) else None
            if isinstance(note, dict):
                annotation = note
    calls = [(b[0], b[1], b[2] or "{}") for _, b in sorted(blocks.items())]
    return Completion("".join(text), calls, finish, annotation)


@dataclass
class OpenAIResponses:
    """The Responses API: the conversation as input items (``function_call`` and
    ``function_call_output`` items for tool calls and results), tools in the flat shape."""

    client: Any  # openai.OpenAI

    def close(self) -> None:
        self.client.close()

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        catalogue: Sequence[ToolSpec],
        tool_choice: str | dict[str, Any],
        headers: Mapping[str, str],
    ) -> Completion:
        import openai

        extra: dict[str, Any] = {}
        if catalogue:
            extra["tools"] = [
                {"type": "function", "name": s.name, "description": s.description,
                 "parameters": s.parameters}
                for s in catalogue
            ]  # fmt: skip
            extra["tool_choice"] = _responses_choice(tool_choice)
        try:
            events = self.client.responses.create(
                model=model, input=messages, stream=True, extra_headers=dict(headers), **extra
            )
            return _collect_responses(events)
        except openai.APIError as exc:
            raise ApiError(f"{type(exc).__name__}: {exc}") from exc

    def reply_messages(
        self, done: Completion, results: Sequence[tuple[str, ToolOutput]]
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if done.content:
            items.append({"role": "assistant", "content": done.content})
        items += [
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
            for call_id, name, arguments in done.tool_calls
        ]
        items += [
            {"type": "function_call_output", "call_id": call_id, "output": output.text}
            for call_id, output in results
        ]
        return items


def _responses_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        return {"type": "function", "name": str(choice.get("function", {}).get("name", ""))}
    return choice  # auto, none, required


def _collect_responses(events: Any) -> Completion:
    """Raw events, not the SDK's stream helper: a reply ``max_output_tokens`` cut ends in
    ``response.incomplete``, which the helper's final response refuses."""
    text: list[str] = []
    calls: list[tuple[str, str, str]] = []
    finish: str | None = None
    annotation: dict[str, Any] | None = None
    for event in events:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            text.append(event.delta)
        elif kind == "response.output_item.done" and event.item.type == "function_call":
            item = event.item
            calls.append((item.call_id, item.name, item.arguments or "{}"))
        elif kind == "response.completed":
            finish = "tool_calls" if calls else "stop"
        elif kind == "response.incomplete":
            finish = "length"
        elif kind == "affidavit":  # the proxy's event; the SDK hands it over untyped
            extra = getattr(event, "model_extra", None) or {}
            note = extra.get("affidavit") if isinstance(extra, dict) else None
            if isinstance(note, dict):
                annotation = note
    return Completion("".join(text), calls, finish, annotation)


def model_api(
    api: str, base_url: str, token: str, *, http_client: Any = None, timeout: float = 600
) -> OpenAIChat | OpenAIResponses | AnthropicMessages:
    """The SDK client for ``api`` at a session's ``base_url`` (``http_client``: an
    ``httpx2.Client`` with its own transport, for the record-backed replays)."""
    if api == "anthropic":
        import anthropic

        return AnthropicMessages(
            anthropic.Anthropic(
                base_url=base_url,
                api_key=token,
                max_retries=0,
                timeout=timeout,
                http_client=http_client,
            )
        )
    if api not in ("openai", "responses"):
        raise ValueError(f"unknown model API {api!r} (openai, responses or anthropic)")
    import openai

    client = openai.OpenAI(
        base_url=base_url + "/v1",
        api_key=token,
        max_retries=0,
        timeout=timeout,
        http_client=http_client,
    )
    return OpenAIResponses(client) if api == "responses" else OpenAIChat(client)
