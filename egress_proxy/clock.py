"""The clock: sampled once per model call by the proxy, put into the prompt in one format.

A model that is told the time gives answers that depend on it, so the time is an input like
any other: the proxy reads it (never the engine, never the harness), writes it into the
prompt, records it as ``ModelRequest.clock`` and reports it in the annotation. A replay
hands the recorded value back unchanged (``Clock.fixed``), so the prompt is the same bytes.

The one format, an RFC 3339 UTC instant to the second, in one line of text::

    Current date and time: 2026-11-30T14:20:30Z (UTC)

Where it goes is a *rule*, recorded with each request as ``ModelRequest.clock_rule``, so a
record is rebuilt under the rule it was written under (:data:`CLOCK_RULE` for new ones):

- ``fold`` (since 2026-12): OpenAI: the line is folded into the client's first ``system``
  or ``developer`` message, wherever it stands: a string content becomes
  ``<line> + "\n\n" + content`` (just the line when empty), a list of parts gets
  ``{"type": "text", "text": <line> + "\n\n"}`` first. With no such message the line is a
  new first message ``{"role": "system", "content": <line>}``. So the clock never adds a
  second system message, which many chat templates refuse.
- ``prepend`` (records without ``clock_rule``): OpenAI: always a new first system message;
  a client's own system message stays a message of its own after it.
- Either rule, OpenAI Responses: the line is folded into ``instructions``, as into a system
  message: a string becomes ``<line> + "\n\n" + instructions``, an absent, null or empty
  one becomes the line. (Instructions of another type leave the request without a clock.)
- ``fold``, Anthropic: the line is folded into ``system`` as into a system message: a string
  becomes ``<line> + "\n\n" + system``, a list of blocks gets
  ``{"type": "text", "text": <line> + "\n\n"}`` first (the client's blocks, and their
  ``cache_control``, untouched), an absent, empty or ``[]`` one becomes the line.
- ``prepend``, Anthropic: a new first text block ``{"type": "text", "text": <line>}`` of
  ``system``; a string ``system`` becomes the text block after it, an absent or empty one
  becomes ``[<the clock block>]``.
- Providers with ``engine_extensions`` also get the instant itself as the request member
  ``clock`` (the engine derives a pinned reply's ``created`` from it); a ``clock`` the client
  sent is replaced: the proxy alone reads the time.

A request whose prompt has no place for it (``messages`` or ``system`` of another type, a
system message whose content is neither text nor parts) is left alone and records no
clock: the upstream refuses it anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

ClockRule = Literal["fold", "prepend"]
#: The rule new requests are written under (records without one were ``prepend``).
CLOCK_RULE: ClockRule = "fold"
_SYSTEM_ROLES = ("system", "developer")

#: The injected line; ``{clock}`` is the instant.
CLOCK_LINE = "Current date and time: {clock} (UTC)"
_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")


def format_instant(moment: datetime) -> str:
    """An aware ``datetime`` as the proxy writes it: UTC, whole seconds, ``Z``."""
    if moment.tzinfo is None:
        raise ValueError("the clock needs an aware datetime, not a naive one")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_instant(text: str) -> str:
    """``text`` unchanged if it is an RFC 3339 UTC instant ending in ``Z``; else ``ValueError``."""
    if not _INSTANT.fullmatch(text):
        raise ValueError(f"not an RFC 3339 UTC instant ending in Z: {text!r}")
    datetime.fromisoformat(text)  # a real date: no month 13
    return text


class Clock:
    """Where the proxy reads the time: one ``sample()`` per model call.

    Build it with ``Clock.system()`` (the default), ``Clock.fixed(value)`` (tests, and a
    replay plan that hands a recorded clock back), or ``Clock(read)`` for anything else,
    e.g. a replay that walks the recorded clocks in order.
    """

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read

    @classmethod
    def system(cls) -> Clock:
        return cls(lambda: format_instant(datetime.now(UTC)))

    @classmethod
    def fixed(cls, value: str | datetime) -> Clock:
        """Always ``value``; a string is returned exactly as given (a recorded clock)."""
        text = check_instant(value) if isinstance(value, str) else format_instant(value)
        return cls(lambda: text)

    def sample(self) -> str:
        return check_instant(self._read())


def clock_line(clock: str) -> str:
    return CLOCK_LINE.format(clock=clock)


def inject_clock(
    dialect: Literal["openai", "anthropic", "responses"],
    request: dict[str, Any],
    clock: str,
    *,
    engine_field: bool = False,
    rule: ClockRule = CLOCK_RULE,
) -> dict[str, Any] | None:
    """``request`` with the clock put into its prompt by ``rule`` (a new dict), or None when
    the prompt has no place for it. ``engine_field`` also sets the ``clock`` member."""
    line = clock_line(clock)
    result = dict(request)
    if dialect == "openai":
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        folded = _fold(messages, line) if rule == "fold" else None
        if folded is None and rule == "fold" and _system_index(messages) is not None:
            return None  # a system message with content of no known shape
        result["messages"] = folded or [{"role": "system", "content": line}, *messages]
        if engine_field:
            result["clock"] = clock
        return result
    if dialect == "responses":
        instructions = request.get("instructions")
        if instructions is None or instructions == "":
            result["instructions"] = line
        elif isinstance(instructions, str):
            result["instructions"] = f"{line}\n\n{instructions}"
        else:
            return None
        if engine_field:
            result["clock"] = clock
        return result
    system = _system(request.get("system"), line, rule)
    if system is None:
        return None
    result["system"] = system
    if engine_field:
        result["clock"] = clock
    return result


def _system(system: Any, line: str, rule: ClockRule) -> str | list[Any] | None:
    """Anthropic's ``system`` with the line in it by ``rule``; None when it has no known shape."""
    if rule == "fold":
        if system is None or system == "" or system == []:
            return line
        if isinstance(system, str):
            return f"{line}\n\n{system}"
        if isinstance(system, list):
            return [{"type": "text", "text": f"{line}\n\n"}, *system]
        return None
    block = {"type": "text", "text": line}
    if system is None or system == "":
        return [block]
    if isinstance(system, str):
        return [block, {"type": "text", "text": system}]
    if isinstance(system, list):
        return [block, *system]
    return None


def _system_index(messages: list[Any]) -> int | None:
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES:
            return index
    return None


def _fold(messages: list[Any], line: str) -> list[Any] | None:
    """``messages`` with ``line`` folded into the first system or developer message; None when
    there is none, or its content has no shape the line can join."""
    index = _system_index(messages)
    if index is None:
        return None
    message = dict(messages[index])
    content = message.get("content")
    if content is None or content == "":
        message["content"] = line
    elif isinstance(content, str):
        message["content"] = f"{line}\n\n{content}"
    elif isinstance(content, list):
        message["content"] = [{"type": "text", "text": f"{line}\n\n"}, *content]
    else:
        return None
    return [*messages[:index], message, *messages[index + 1 :]]
