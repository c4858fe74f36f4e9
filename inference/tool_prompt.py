"""Tools and tool calls for chat templates that cannot show them (the documented fallback).

Some models' chat templates only concatenate each message's ``content`` (SmolLM2's, for
one): they never read ``tools``, never show an assistant's ``tool_calls``, and fail on
``content: null``. For such a template (one that does not read the ``tools`` variable, see
:func:`template_reads_tools`) :func:`fallback_messages` rewrites the conversation first, so
the model still sees its tools, its own calls and their results, in the layout of the tiny
model's ChatML-with-tools template (``inference/data/chat_template.jinja``), the layout
``inference.tool_calls.parse_tool_calls`` and the constrained decoder read and write. A
ChatML template thus renders the same bytes as the tiny template would. The rewrite is:

1. Content. ``None`` becomes ``""``; a list of text parts (``{"type": "text", "text": …}``)
   becomes their texts joined with ``""``; any other part is refused
   (:class:`UnsupportedContentError`, naming the part's type), as is content of any other
   type.
2. Tools, when given: the block ::

       # Tools

       You may call one or more functions to assist with the user query.

       You are provided with function signatures within <tools></tools> XML tags:
       <tools>
       {tool 1 as JSON}
       {tool 2 as JSON}
       </tools>

       For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
       <tool_call>
       {"name": <function-name>, "arguments": <args-json-object>}
       </tool_call>

   (no newline after the last line; each tool is ``json.dumps(tool, ensure_ascii=False)``,
   one per line). If the conversation starts with a system message, the block is appended
   to its content after ``"\\n\\n"``; otherwise a system message ``"You are a helpful
   assistant.\\n\\n" + block`` is put first.
3. An assistant message with ``tool_calls``: its content (or ``""``) followed, per call,
   by ``"\\n<tool_call>\\n{\\"name\\": \\"NAME\\", \\"arguments\\": ARGS}\\n</tool_call>"``,
   with the leading ``"\\n"`` removed when the content was empty. ``ARGS`` is
   ``json.dumps(arguments, ensure_ascii=False)``; arguments given as a JSON string (the
   OpenAI wire form) are parsed first, and a string that is not JSON goes in as is.
   ``NAME`` goes in as given, unescaped, as the tiny template writes it; a call without a
   name is refused. The ``tool_calls`` key is dropped.
4. Consecutive ``tool`` messages: one ``user`` message whose content is their
   ``"<tool_response>\\n" + content + "\\n</tool_response>"`` blocks joined with ``"\\n"``
   (their other keys, e.g. ``tool_call_id``, are not shown).

Other messages keep their role and other keys.

Under ``tool_choice: "none"`` the engine passes no ``tools`` here (so no block 2): the model
may not call them, and a model this small, shown the block, answers in its markup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import Environment, meta

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "UnsupportedContentError",
    "fallback_messages",
    "template_reads_tools",
    "tools_block",
]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
"""The system turn the tools block gets when the conversation has none (the tiny template's)."""

_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and"
    " arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class UnsupportedContentError(ValueError):
    """A message's content cannot be shown as text (e.g. an image part)."""


def template_reads_tools(env: Environment, source: str) -> bool:
    """Whether a template reads ``tools``; one that does not needs :func:`fallback_messages`.

    ``env`` must be the environment the template renders in, so that its extensions'
    tags (e.g. ``generation``) parse.
    """
    return "tools" in meta.find_undeclared_variables(env.parse(source))


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools section of the system turn, as the tiny template writes it."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _TOOLS_HEAD + lines + _TOOLS_TAIL


def fallback_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` rewritten so a template without tool support shows tools, calls, results.

    A pure function; the rules are in the module docstring.
    """
    out: list[dict[str, Any]] = []
    after_tool = False  # the previous message was a ``tool`` one: its user turn is open
    for message in messages:
        rewritten = dict(message)
        rewritten["content"] = _text(message.get("content"))
        if message.get("role") == "tool":
            block = f"<tool_response>\n{rewritten['content']}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_tool = True
            continue
        after_tool = False
        if message.get("role") == "assistant" and "tool_calls" in rewritten:
            content = rewritten["content"]
            calls = "".join(_call_text(call) for call in rewritten.pop("tool_calls") or [])
            rewritten["content"] = content + calls if content else calls.removeprefix("\n")
        out.append(rewritten)
    if tools:
        block = tools_block(tools)
        if out and out[0].get("role") == "system":
            out[0]["content"] += "\n\n" + block
        else:
            out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT + "\n\n" + block})
    return out


def _text(content: Any) -> str:
    """Content as a template can concatenate it: ``None`` is ``""``, text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind != "text":
                raise UnsupportedContentError(
                    f"content part of type {kind!r} cannot be shown to this model; "
                    "only 'text' parts are supported"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise UnsupportedContentError(
        f"message content must be text or a list of text parts, not {type(content).__name__}"
    )


def _call_text(call: Any) -> str:
    """One call as ``parse_tool_calls`` reads it and the tiny template writes it."""
    function = call.get("function", call) if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(name, str):
        raise UnsupportedContentError("a tool call needs a function name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments_text = json.dumps(json.loads(arguments), ensure_ascii=False)
        except ValueError:
            arguments_text = arguments
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    return f'\n<tool_call>\n{{"name": "{name}", "arguments": {arguments_text}}}\n</tool_call>'
