"""Session pins: which request members a session fixes, and what each upstream can take.

A session's pins are set when it opens or later (``SessionRegistry.set_pins``), recorded as a
``pins.set`` entry, and applied to every model call of the session by the ``pins`` stage. A
pin always wins: a request that asks for another value is sent with the pin, and the
annotation says so (``pins_overrode``). A pin an upstream cannot take is left out of the
request and the annotation says why (``pins_not_applied``), so nobody believes a call was
pinned that was not:

- ``strict_cache`` is an engine extension (a request member the affidavit engine and its
  vLLM front understand): it is sent only to providers whose config sets
  ``engine_extensions``;
- the Anthropic Messages API has no ``seed``: to an engine (``engine_extensions``) a pinned
  call carries it as an engine extension member, elsewhere it is not applied;
- the OpenAI Responses API has no ``seed`` or ``top_k`` either: on that route they are
  engine extension members as well, and a ``max_tokens`` pin sets ``max_output_tokens``.

``default_pins`` is what ``--pin default`` will mean: one seed drawn once, and the
generation defaults written out, so a replay does not depend on a provider's defaults.

Nothing here does I/O; the stage that uses it lives in ``pipeline``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from egress_proxy.providers import Dialect
from record.digest import canonical_json
from record.schema import PinsSet

#: Request members a pin sets, where the upstream has them.
SAMPLING_PINS = ("seed", "temperature", "top_p", "top_k", "max_tokens")
#: Everything a session may pin: the sampling members and the engine's strict cache mode.
PINNABLE = frozenset({*SAMPLING_PINS, "strict_cache"})
#: Seeds are I-JSON integers (the record's canonical JSON holds no larger ones).
SEED_MAX = 2**53 - 1


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": (lambda v: _integer(v) and 0 <= v <= SEED_MAX, f"an integer in [0, {SEED_MAX}]"),
    "temperature": (lambda v: _number(v) and 0 <= v <= 2, "a number in [0, 2]"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    "max_tokens": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "strict_cache": (lambda v: isinstance(v, bool), "true or false"),
}


def validate_pins(pins: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    """A copy of ``pins`` if every name is pinnable and every value in range; else
    ``ValueError`` naming the first bad pin (checked before anything is recorded)."""
    unknown = sorted(set(pins) - PINNABLE)
    if unknown:
        raise ValueError(f"cannot pin {unknown}: pinnable members are {sorted(PINNABLE)}")
    for name, value in pins.items():
        check, wanted = _CHECKS[name]
        if not check(value):
            raise ValueError(f"pin {name}: {value!r} is not {wanted}")
    return dict(pins)


def pins_entry(pins: Mapping[str, JsonValue]) -> PinsSet:
    """The ``pins.set`` body: the pins as set, and the cache mode they ask for."""
    strict = pins.get("strict_cache") is True
    return PinsSet(pins=dict(pins), cache_mode="strict" if strict else "shared")


def default_pins(max_tokens: int, *, strict_cache: bool = True) -> dict[str, JsonValue]:
    """``--pin default``: a seed drawn once from ``os.urandom`` and the generation defaults
    made explicit (temperature 1.0, top_p 1.0, ``max_tokens`` from the caller's config), so
    a replay never depends on what a provider's defaults happen to be."""
    seed = int.from_bytes(os.urandom(8), "big") & SEED_MAX
    return validate_pins(
        {
            "seed": seed,
            "temperature": 1.0,
            "top_p": 1.0,
            "max_tokens": max_tokens,
            "strict_cache": strict_cache,
        }
    )


@dataclass(frozen=True)
class PinOutcome:
    """What the ``pins`` stage did to one request; the annotation reports all of it."""

    request: dict[str, Any]
    session: dict[str, JsonValue] | None = None  # the session's pins in force; None: unpinned
    applied: dict[str, JsonValue] | None = None  # set on the request (``ModelRequest.pins``)
    not_applied: dict[str, str] = field(default_factory=dict)  # pin -> why not
    overrode: dict[str, dict[str, JsonValue]] = field(default_factory=dict)


def apply_pins(
    dialect: Dialect,
    request: dict[str, Any],
    pins: Mapping[str, JsonValue] | None,
    *,
    provider: str = "",
    engine_extensions: bool = False,
) -> PinOutcome:
    """Set the session's pins on ``request`` (a new dict; the argument is left alone).

    OpenAI: a ``max_tokens`` pin sets ``max_completion_tokens`` instead when the request
    uses only that member, so the request never carries both.
    """
    if not pins:
        return PinOutcome(request)
    sent = dict(request)
    applied: dict[str, JsonValue] = {}
    not_applied: dict[str, str] = {}
    overrode: dict[str, dict[str, JsonValue]] = {}
    for name, pinned in pins.items():
        reason = _not_taken(dialect, name, provider, engine_extensions)
        if reason is not None:
            not_applied[name] = reason
            continue
        member = dialect.member(name)
        if (
            dialect.name == "openai"
            and name == "max_tokens"
            and "max_tokens" not in request
            and "max_completion_tokens" in request
        ):
            member = "max_completion_tokens"
        if member in request and not _same(request[member], pinned):
            overrode[name] = {"requested": request[member], "pinned": pinned}
        sent[member] = pinned
        applied[name] = pinned
    return PinOutcome(sent, dict(pins), applied, not_applied, overrode)


def _not_taken(dialect: Dialect, name: str, provider: str, engine_extensions: bool) -> str | None:
    """Why ``name`` cannot be set on this upstream's requests, or None if it can."""
    if name in dialect.extensions:
        if not engine_extensions:
            return (
                f"{name} is an engine extension; provider {provider!r} "
                "does not set engine_extensions"
            )
        return None
    if name not in dialect.pinnable:
        return f"the {_API[dialect.name]} API has no {name}"
    return None


_API = {
    "openai": "OpenAI Chat Completions",
    "anthropic": "Anthropic Messages",
    "responses": "OpenAI Responses",
}


def _same(requested: Any, pinned: JsonValue) -> bool:
    """Equal as JSON values (RFC 8785): ``1`` and ``1.0`` are one number, ``true`` is not 1."""
    try:
        return canonical_json(requested) == canonical_json(pinned)
    except ValueError:
        return False
