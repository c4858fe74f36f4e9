"""How the harness builds what it sends the model: the system prompt, the history, each step.

This is the code a reconstruction re-drives: change a byte here and every recorded request it
touches stops matching, which ``affidavit replay --reconstruct`` reports at the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.tools import ToolOutput

#: The harness sends no system message of its own: the proxy puts the injected clock in one
#: first, and chat templates (Qwen3's, for one) allow a single system message, first.


def opening_messages(history: Sequence[tuple[str, str]], user_input: str) -> list[dict[str, Any]]:
    """Every earlier turn (input and answer) and this turn's input."""
    messages: list[dict[str, Any]] = []
    for asked, answered in history:
        messages.append({"role": "user", "content": asked})
        messages.append({"role": "assistant", "content": answered})
    messages.append({"role": "user", "content": user_input})
    return messages


def assistant_message(content: str, calls: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    """The model's reply as it goes back into the conversation: text and the calls it asked."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ]
    return message


def tool_message(call_id: str, output: ToolOutput) -> dict[str, Any]:
    """A tool's answer as the model reads it."""
    return {"role": "tool", "tool_call_id": call_id, "content": output.text}
