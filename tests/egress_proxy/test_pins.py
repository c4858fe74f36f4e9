"""Pins, against real proxies and upstreams on loopback, through the official SDKs.

- Pins are checked before anything is recorded: an unknown member or a value out of range
  is a ``ValueError`` naming it, and the store is unchanged.
- ``set_pins`` appends ``pins.set`` (the pins as set; ``cache_mode`` strict only when
  ``strict_cache`` is pinned) and the next call is sent with them; unpinning appends an
  empty ``pins.set`` and the next call goes out as the client's bytes again.
- A request that contradicts a pin is sent with the pin; the annotation says so
  (``pins_overrode``), lists what was set (``pins_applied`` = ``ModelRequest.pins``) and
  what could not be, with the reason (``pins_not_applied``): Anthropic has no ``seed``;
  ``strict_cache`` goes only to ``engine_extensions`` providers.
- An ``engine_extensions`` provider gets ``strict_cache`` (only ``api = "openai"`` providers
  may declare it); an OpenAI request that uses only ``max_completion_tokens`` gets the
  ``max_tokens`` pin there.
- ``default_pins`` draws a fresh seed each time and writes the generation defaults out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from egress_proxy.config import parse_config
from egress_proxy.pins import SEED_MAX, apply_pins, default_pins, validate_pins
from egress_proxy.providers import ANTHROPIC, OPENAI, RESPONSES
from egress_proxy.server import ProxyServer
from record.digest import canonical_json
from record.log import Log
from record.schema import ModelRequest, PinsSet
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Rig,
    Script,
    proxy_config,
    split_annotation,
)

CHAT_REPLY = b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[]}'
MESSAGE_REPLY = b'{"id":"m","type":"message","role":"assistant","content":[],"model":"m"}'


@pytest.fixture(scope="module")
def engine_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A proxy whose OpenAI provider declares ``engine_extensions`` (clock still off)."""
    store_path = tmp_path_factory.mktemp("pins") / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, engine_extensions=True)
        with ProxyServer(config, log, env=ENV) as proxy:
            yield Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
    log.close()


def store_lines(path: Path) -> list[bytes]:
    store = SQLiteStore(path, readonly=True)
    try:
        return [e.line for s in store.streams() for e in store.entries(s)]
    finally:
        store.close()


def request_entry(rig: Rig, stream: str, seq: int) -> ModelRequest:
    _, body = rig.bodies(stream)[seq]
    assert isinstance(body, ModelRequest)
    return body


@pytest.mark.parametrize(
    ("pins", "named"),
    [
        ({"seed": 1, "logprobs": True}, "logprobs"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**53}, "seed"),
        ({"seed": True}, "seed"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "0.7"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"strict_cache": 1}, "strict_cache"),
    ],
)
def test_bad_pins_are_refused_before_anything_is_recorded(
    fresh: Rig, pins: dict[str, Any], named: str
) -> None:
    rig = fresh
    session = rig.open_session()
    before = store_lines(rig.store_path)
    with pytest.raises(ValueError, match=named):
        rig.open_session(pins=pins)
    with pytest.raises(ValueError, match=named):
        rig.proxy.registry.set_pins(session.session_id, pins)
    assert store_lines(rig.store_path) == before
    with pytest.raises(KeyError):
        rig.proxy.registry.set_pins("no-such-session", {"seed": 1})


def test_set_pins_is_recorded_then_applied_and_can_be_undone(fresh: Rig) -> None:
    rig = fresh
    rig.upstream.script = Script(chunks=[CHAT_REPLY])
    session = rig.open_session()
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]

    first = gpt.chat.completions.with_raw_response.create(
        model="m", messages=messages, temperature=1.0
    )
    note = first.parse().model_extra["affidavit"]  # type: ignore[index]
    assert (note["pins"], note["pins_applied"]) == (None, None)
    assert (note["pins_not_applied"], note["pins_overrode"]) == ({}, {})
    assert (
        rig.upstream.received[-1].body
        == request_entry(rig, session.session_id, note["request_seq"]).input_bytes
    )  # unpinned: the client's bytes

    pins = {"seed": 5, "temperature": 0.7, "strict_cache": True}
    appended = rig.proxy.registry.set_pins(session.session_id, pins)
    _, entry = rig.bodies(session.session_id)[appended.seq]
    assert isinstance(entry, PinsSet)
    assert (entry.pins, entry.cache_mode) == (pins, "strict")

    second = gpt.chat.completions.with_raw_response.create(
        model="m", messages=messages, temperature=1.0
    )
    note = second.parse().model_extra["affidavit"]  # type: ignore[index]
    assert note["request_seq"] > appended.seq  # the pins.set entry comes first
    sent = json.loads(rig.upstream.received[-1].body)
    assert (sent["seed"], sent["temperature"]) == (5, 0.7)
    assert "strict_cache" not in sent  # a plain OpenAI provider would refuse it
    assert rig.upstream.received[-1].body == canonical_json(sent)
    assert note["pins"] == pins
    assert note["pins_applied"] == {"seed": 5, "temperature": 0.7}
    assert note["pins_overrode"] == {"temperature": {"requested": 1.0, "pinned": 0.7}}
    assert note["pins_not_applied"] == {
        "strict_cache": "strict_cache is an engine extension; provider 'openai' does not set "
        "engine_extensions"
    }
    request = request_entry(rig, session.session_id, note["request_seq"])
    assert request.pins == note["pins_applied"]
    assert request.params["temperature"] == 0.7

    undone = rig.proxy.registry.set_pins(session.session_id, None)
    _, entry = rig.bodies(session.session_id)[undone.seq]
    assert isinstance(entry, PinsSet) and (entry.pins, entry.cache_mode) == ({}, "shared")
    third = gpt.chat.completions.with_raw_response.create(
        model="m", messages=messages, temperature=1.0
    )
    note = third.parse().model_extra["affidavit"]  # type: ignore[index]
    assert note["pins"] is None
    request = request_entry(rig, session.session_id, note["request_seq"])
    assert request.pins is None and request.request_bytes == request.input_bytes


def test_anthropic_says_which_pins_it_cannot_take(fresh: Rig) -> None:
    rig = fresh
    pins = {"seed": 9, "top_k": 4, "max_tokens": 16, "strict_cache": True}
    session = rig.open_session(pins=pins)
    rig.upstream.script = Script(chunks=[MESSAGE_REPLY])
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    raw = claude.messages.with_raw_response.create(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    )
    note = json.loads(raw.http_response.content)["affidavit"]
    sent = json.loads(rig.upstream.received[-1].body)
    assert (sent["top_k"], sent["max_tokens"]) == (4, 16)
    assert "seed" not in sent and "strict_cache" not in sent
    assert note["pins_applied"] == {"top_k": 4, "max_tokens": 16}
    assert note["pins_overrode"] == {"max_tokens": {"requested": 100, "pinned": 16}}
    assert note["pins_not_applied"] == {
        "seed": "seed is an engine extension; provider 'anthropic' does not set engine_extensions",
        "strict_cache": (
            "strict_cache is an engine extension; provider 'anthropic' "
            "does not set engine_extensions"
        ),
    }
    assert request_entry(rig, session.session_id, note["request_seq"]).pins == {
        "top_k": 4,
        "max_tokens": 16,
    }

    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":'
        b'"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":1,'
        b'"output_tokens":1}}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    rig.upstream.script = Script(chunks=[stream], content_type="text/event-stream")
    delivered = httpx.post(
        f"{session.base_url}/v1/messages",
        content=b'{"model":"m","max_tokens":16,"stream":true,"messages":[]}',
        headers={"x-api-key": session.token},
    ).content
    rest, note, _ = split_annotation(delivered)
    assert rest == stream
    assert note["pins_overrode"] == {}  # the request asked for what was pinned
    assert set(note["pins_not_applied"]) == {"seed", "strict_cache"}


def test_an_engine_provider_gets_strict_cache_and_max_tokens_follows_the_request(
    engine_rig: Rig,
) -> None:
    rig = engine_rig
    rig.upstream.script = Script(chunks=[CHAT_REPLY])
    session = rig.open_session(pins={"seed": 3, "max_tokens": 8, "strict_cache": True})
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = gpt.chat.completions.with_raw_response.create(
        model="m", messages=[], max_completion_tokens=50
    )
    note = raw.parse().model_extra["affidavit"]  # type: ignore[index]
    sent = json.loads(rig.upstream.received[-1].body)
    assert sent["strict_cache"] is True
    assert sent["max_completion_tokens"] == 8 and "max_tokens" not in sent
    assert note["pins_applied"] == {"seed": 3, "max_tokens": 8, "strict_cache": True}
    assert note["pins_not_applied"] == {}
    assert note["pins_overrode"] == {"max_tokens": {"requested": 50, "pinned": 8}}
    request = request_entry(rig, session.session_id, note["request_seq"])
    assert request.params["strict_cache"] is True
    assert request.pins == note["pins_applied"]


@pytest.mark.parametrize(
    ("requested", "pinned", "overrode"),
    [(1, 1.0, False), (0.7, 0.7, False), (True, 1, True), (2, 1, True), (None, 1, True)],
)
def test_an_override_is_a_different_json_value(requested: Any, pinned: Any, overrode: bool) -> None:
    outcome = apply_pins(OPENAI, {"top_k": requested}, {"top_k": pinned})
    assert outcome.request == {"top_k": pinned}
    assert bool(outcome.overrode) is overrode


def test_the_responses_api_takes_seed_and_top_k_only_as_engine_members() -> None:
    pins = {"seed": 5, "top_k": 3, "temperature": 0.5, "max_tokens": 16, "strict_cache": True}
    asked = {"model": "m", "input": "hi", "max_output_tokens": 99}
    engine = apply_pins(RESPONSES, asked, pins, provider="e", engine_extensions=True)
    assert engine.request == {
        "model": "m", "input": "hi", "max_output_tokens": 16, "seed": 5, "top_k": 3,
        "temperature": 0.5, "strict_cache": True,
    }  # fmt: skip
    assert engine.applied == pins and engine.not_applied == {}
    assert engine.overrode == {"max_tokens": {"requested": 99, "pinned": 16}}
    plain = apply_pins(RESPONSES, asked, pins, provider="openai")
    assert plain.request == {"model": "m", "input": "hi", "max_output_tokens": 16,
                             "temperature": 0.5}  # fmt: skip
    assert sorted(plain.not_applied) == ["seed", "strict_cache", "top_k"]
    assert plain.not_applied["seed"] == (
        "seed is an engine extension; provider 'openai' does not set engine_extensions"
    )


def test_the_messages_api_takes_seed_and_strict_cache_only_as_engine_members() -> None:
    doc = {
        "providers": {"c": {"api": "anthropic", "base_url": "http://x", "engine_extensions": True}}
    }
    assert parse_config(doc, source="proxy.toml").providers["c"].engine_extensions
    pins = {"seed": 5, "top_k": 3, "max_tokens": 16, "strict_cache": True}
    asked = {"model": "m", "max_tokens": 99, "messages": []}
    engine = apply_pins(ANTHROPIC, asked, pins, provider="c", engine_extensions=True)
    assert engine.request == {
        "model": "m", "max_tokens": 16, "messages": [], "seed": 5, "top_k": 3,
        "strict_cache": True,
    }  # fmt: skip
    assert engine.applied == pins and engine.not_applied == {}
    plain = apply_pins(ANTHROPIC, asked, pins, provider="claude")
    assert plain.request == {"model": "m", "max_tokens": 16, "messages": [], "top_k": 3}
    assert plain.not_applied == {
        "seed": "seed is an engine extension; provider 'claude' does not set engine_extensions",
        "strict_cache": (
            "strict_cache is an engine extension; provider 'claude' does not set engine_extensions"
        ),
    }


def test_default_pins_draw_a_fresh_seed_and_spell_out_the_defaults() -> None:
    first, second = default_pins(256), default_pins(256)
    assert first["seed"] != second["seed"]  # one chance in 2**53 of a false failure
    for pins in (first, second):
        seed = pins.pop("seed")
        assert isinstance(seed, int) and 0 <= seed <= SEED_MAX
        assert pins == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 256, "strict_cache": True}
    assert validate_pins(default_pins(8, strict_cache=False))["strict_cache"] is False
    with pytest.raises(ValueError, match="max_tokens"):
        default_pins(0)
