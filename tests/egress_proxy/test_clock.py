"""The clock, against a real proxy and upstream on loopback, through the official SDKs.

- ``Clock``: ``fixed`` hands back exactly what it was given (a recorded clock, fractional
  seconds and all); ``system`` writes UTC to the second; anything else is refused.
- One format, one line: OpenAI gets a new first ``system`` message, Anthropic a new first
  ``system`` text block (a string ``system`` becomes the block after it); a prompt with no
  place for it is left alone.
- Every session, pinned or not: the clock is sampled once per call, the upstream receives it
  in the prompt (and, for an ``engine_extensions`` provider, as the ``clock`` member), the
  record keeps it in ``ModelRequest.clock``, the prompt digest covers the prompt *with* it
  (what was sent), and the annotation reports it.
- A session's own clock (what a replay plan pins) wins over the proxy's.
- ``inject_clock = false`` (the other tests' rig): nothing is injected, nothing recorded.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import anthropic
import openai
import pytest

from egress_proxy.clock import Clock, clock_line, inject_clock
from egress_proxy.server import ProxyServer
from record.digest import Domain, digest, prompt_digest
from record.log import Log
from record.schema import ModelRequest
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, Script, proxy_config

CLOCKS = [f"2026-11-30T14:20:{s:02d}Z" for s in range(60)]
CHAT_REPLY = b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[]}'
MESSAGE_REPLY = b'{"id":"m","type":"message","role":"assistant","content":[],"model":"m"}'


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A proxy that injects the clock, read from ``CLOCKS`` in turn (one per call)."""
    store_path = tmp_path_factory.mktemp("clock") / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    ticks = itertools.cycle(CLOCKS)
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, inject_clock=True, engine_extensions=True)
        with ProxyServer(config, log, env=ENV, clock=Clock(lambda: next(ticks))) as proxy:
            yield Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
    log.close()


def recorded(rig: Rig, stream: str, seq: int) -> ModelRequest:
    _, body = rig.bodies(stream)[seq]
    assert isinstance(body, ModelRequest)
    return body


def test_a_fixed_clock_hands_back_what_it_was_given() -> None:
    assert Clock.fixed("2026-11-30T14:20:30Z").sample() == "2026-11-30T14:20:30Z"
    assert Clock.fixed("2026-11-30T14:20:30.120Z").sample() == "2026-11-30T14:20:30.120Z"
    berlin = timezone(timedelta(hours=1))
    moment = datetime(2026, 11, 30, 15, 20, 30, 999, tzinfo=berlin)
    assert Clock.fixed(moment).sample() == "2026-11-30T14:20:30Z"
    for bad in ("2026-11-30 14:20:30Z", "2026-11-30T14:20:30+00:00", "2026-13-01T00:00:00Z"):
        with pytest.raises(ValueError):
            Clock.fixed(bad)
    with pytest.raises(ValueError, match="naive"):
        Clock.fixed(datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        Clock(lambda: "yesterday").sample()
    now = Clock.system().sample()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now)
    drift = datetime.now(UTC) - datetime.fromisoformat(now)
    assert timedelta(0) <= drift < timedelta(seconds=5)


def test_the_clock_has_one_place_in_each_prompt() -> None:
    line = "Current date and time: 2026-11-30T14:20:30Z (UTC)"
    assert clock_line("2026-11-30T14:20:30Z") == line
    clock = {"type": "text", "text": line}
    system = {"role": "system", "content": line}
    own = {"role": "system", "content": "be brief"}
    user = {"role": "user", "content": "hi"}
    now = "2026-11-30T14:20:30Z"
    # fold (the rule new requests use): into the client's first system or developer message
    folded = {"role": "system", "content": f"{line}\n\nbe brief"}
    assert inject_clock("openai", {"messages": [own, user]}, now) == {"messages": [folded, user]}
    developer = {"role": "developer", "content": [{"type": "text", "text": "be brief"}]}
    parts = [{"type": "text", "text": f"{line}\n\n"}, {"type": "text", "text": "be brief"}]
    assert inject_clock("openai", {"messages": [user, developer, own]}, now) == {
        "messages": [user, {"role": "developer", "content": parts}, own]
    }  # the first one only: nothing else moves
    empty = {"role": "system", "content": None}
    assert inject_clock("openai", {"messages": [empty, user]}, now) == {"messages": [system, user]}
    odd = {"role": "system", "content": 5}
    assert inject_clock("openai", {"messages": [odd, user]}, now) is None
    assert inject_clock("openai", {"messages": [user]}, now) == {"messages": [system, user]}
    # prepend (records written before the rule was recorded): always a message of its own
    assert inject_clock("openai", {"messages": [own, user]}, now, rule="prepend") == {
        "messages": [system, own, user]
    }
    assert inject_clock("openai", {"messages": []}, now, engine_field=True) == {
        "messages": [system],
        "clock": now,
    }
    assert inject_clock("openai", {"messages": "hi"}, now) is None
    # Anthropic, fold: into system, as into a system message; the engine's member too
    assert inject_clock("anthropic", {"messages": []}, now) == {"messages": [], "system": line}
    assert inject_clock("anthropic", {"system": ""}, now) == {"system": line}
    assert inject_clock("anthropic", {"system": []}, now) == {"system": line}
    assert inject_clock("anthropic", {"system": "be brief"}, now, engine_field=True) == {
        "system": f"{line}\n\nbe brief",
        "clock": now,
    }
    block = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    assert inject_clock("anthropic", {"system": [block]}, now) == {
        "system": [{"type": "text", "text": f"{line}\n\n"}, block]
    }  # the client's blocks, cache_control and all, untouched
    assert inject_clock("anthropic", {"system": 5}, now) is None

    # Anthropic, prepend (records written before fold): a block of its own, first
    def prepend(request: dict[str, Any]) -> dict[str, Any] | None:
        return inject_clock("anthropic", request, now, rule="prepend")

    assert prepend({"messages": []}) == {"messages": [], "system": [clock]}
    assert prepend({"system": ""}) == {"system": [clock]}
    assert prepend({"system": "be brief"}) == {
        "system": [clock, {"type": "text", "text": "be brief"}]
    }
    assert prepend({"system": [block]}) == {"system": [clock, block]}
    assert prepend({"system": 5}) is None


def test_the_responses_api_gets_the_clock_in_its_instructions() -> None:
    now = "2026-11-30T14:20:30Z"
    line = f"Current date and time: {now} (UTC)"
    asked = {"model": "m", "input": "hi"}
    assert inject_clock("responses", asked, now) == {**asked, "instructions": line}
    assert inject_clock("responses", {**asked, "instructions": None}, now) == {
        **asked, "instructions": line
    }  # fmt: skip
    assert inject_clock("responses", {**asked, "instructions": ""}, now) == {
        **asked, "instructions": line
    }  # fmt: skip
    folded = {**asked, "instructions": f"{line}\n\nbe brief", "clock": now}
    own = {**asked, "instructions": "be brief"}
    assert inject_clock("responses", own, now, engine_field=True) == folded
    # instructions are one string: either rule folds into it
    assert inject_clock("responses", own, now, rule="prepend") == {
        **asked, "instructions": f"{line}\n\nbe brief"
    }  # fmt: skip
    assert inject_clock("responses", {**asked, "instructions": ["x"]}, now) is None
    assert own == {"model": "m", "input": "hi", "instructions": "be brief"}  # left alone


def test_every_call_gets_its_own_clock_sent_recorded_and_annotated(clocked: Rig) -> None:
    rig = clocked
    rig.upstream.script = Script(chunks=[CHAT_REPLY])
    rig.upstream.received.clear()
    session = rig.open_session()  # unpinned: the clock is injected all the same
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    notes = []
    for _ in range(2):
        raw = gpt.chat.completions.with_raw_response.create(model="m", messages=messages)
        notes.append(raw.parse().model_extra["affidavit"])  # type: ignore[index]
    first, second = notes
    assert first["clock"] != second["clock"]  # sampled per call, not per session
    for note, received in zip(notes, rig.upstream.received, strict=True):
        sent = json.loads(received.body)
        assert sent["messages"] == [
            {
                "role": "system",
                "content": f"Current date and time: {note['clock']} (UTC)\n\nbe brief",
            },
            messages[1],
        ]  # folded into the client's own system message: never a second one
        assert sent["clock"] == note["clock"]  # engine_extensions: the member too
        request = recorded(rig, session.session_id, note["request_seq"])
        assert request.clock == note["clock"] and request.clock_rule == "fold"
        assert request.request_bytes == received.body
        assert request.content_key == digest(Domain.REQUEST, received.body)
        assert request.prompt_digest == prompt_digest(sent) == note["prompt_digest"]
        assert request.prompt_digest != prompt_digest(json.loads(request.input_bytes))
        assert request.params["clock"] == note["clock"]


def test_anthropic_gets_the_clock_folded_into_system(clocked: Rig) -> None:
    rig = clocked
    rig.upstream.script = Script(chunks=[MESSAGE_REPLY])
    session = rig.open_session(pins={"temperature": 0})
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    raw = claude.messages.with_raw_response.create(
        model="m", max_tokens=5, system="be brief", messages=[{"role": "user", "content": "hi"}]
    )
    note = json.loads(raw.http_response.content)["affidavit"]
    sent = json.loads(rig.upstream.received[-1].body)
    assert sent["system"] == f"Current date and time: {note['clock']} (UTC)\n\nbe brief"
    assert "clock" not in sent  # this provider is no engine (no engine_extensions)
    assert sent["temperature"] == 0
    request = recorded(rig, session.session_id, note["request_seq"])
    assert (request.clock, request.prompt_digest) == (note["clock"], prompt_digest(sent))


def test_a_sessions_own_clock_is_handed_back_unchanged(clocked: Rig) -> None:
    rig = clocked
    rig.upstream.script = Script(chunks=[CHAT_REPLY])
    session = rig.open_session()
    replayed = "2025-01-02T03:04:05.678Z"  # as a replay plan would find it in the record
    held = rig.proxy.registry.get(session.session_id)
    assert held is not None
    held.clock = Clock.fixed(replayed)
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    for _ in range(2):
        raw = gpt.chat.completions.with_raw_response.create(model="m", messages=[])
        note = raw.parse().model_extra["affidavit"]  # type: ignore[index]
        assert note["clock"] == replayed
        assert recorded(rig, session.session_id, note["request_seq"]).clock == replayed
        assert json.loads(rig.upstream.received[-1].body)["clock"] == replayed


def test_a_provider_with_the_clock_off_sends_the_clients_bytes(fresh: Rig) -> None:
    rig = fresh
    rig.upstream.script = Script(chunks=[CHAT_REPLY])
    session = rig.open_session()
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = gpt.chat.completions.with_raw_response.create(model="m", messages=[])
    note = raw.parse().model_extra["affidavit"]  # type: ignore[index]
    assert note["clock"] is None
    request = recorded(rig, session.session_id, note["request_seq"])
    assert request.clock is None
    assert rig.upstream.received[-1].body == request.input_bytes == request.request_bytes
