"""The clock: sampled once per model call by the proxy, put into the prompt in one format.

A model that is told the time gives answers that depend on it, so the time is an input like
any other: the proxy reads it (never the engine, never the harness), writes it into the
prompt, records it as ``ModelRequest.clock`` and reports it in the annotation. A replay
hands the recorded value back unchanged (``Clock.fixed``), so the prompt is the same bytes.

The one format, an RFC 3339 UTC instant to the second, in one line of text::

    Current date and time: 2026-11-30T14:20:30Z (UTC)

- OpenAI: a new first message ``{"role": "system", "content": <line>}``; the client's
  messages follow unchanged (a first system message of its own stays a message of its own).
- Anthropic: a new first text block of ``system``; a string ``system`` becomes the text
  block after it, an absent or empty one becomes ``[<the clock block>]``.
- Providers with ``engine_extensions`` also get the instant itself as the request member
  ``clock`` (the engine derives a pinned reply's ``created`` from it); a ``clock`` the client
  sent is replaced: the proxy alone reads the time.

A request whose prompt has no place for it (``messages`` or ``system`` of another type) is
left alone and records no clock: the upstream refuses it anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

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
    dialect: Literal["openai", "anthropic"],
    request: dict[str, Any],
    clock: str,
    *,
    engine_field: bool = False,
) -> dict[str, Any] | None:
    """``request`` with the clock put into its prompt (a new dict), or None when the prompt
    has no place for it. ``engine_field`` also sets the ``clock`` member (engine extension)."""
    line = clock_line(clock)
    result = dict(request)
    if dialect == "openai":
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        result["messages"] = [{"role": "system", "content": line}, *messages]
        if engine_field:
            result["clock"] = clock
        return result
    system = request.get("system")
    block = {"type": "text", "text": line}
    if system is None:
        result["system"] = [block]
    elif isinstance(system, str):
        result["system"] = [block, {"type": "text", "text": system}] if system else [block]
    elif isinstance(system, list):
        result["system"] = [block, *system]
    else:
        return None
    return result
