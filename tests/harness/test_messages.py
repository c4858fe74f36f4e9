"""The harness on Anthropic's Messages API against the default stack: the real engine behind
``running_appliance``, a pinned session labelled ``anthropic``, so the agent speaks
``POST /v1/messages`` through the official ``anthropic`` SDK: a forced ``web_search`` call
(``tool_choice`` ``tool``) whose input parses, its result fed back as a ``tool_result``
block, a second step in words. The record holds both requests on the Messages route with
the seed as the engine's member, the clock folded into ``system`` and the rule recorded;
reconstruct rebuilds the turn byte for byte, re-execute judges every step identical, and
the SDK's ``messages.stream`` helper reads a pinned reply (annotation event included)
through the proxy, the same bytes twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

import anthropic

from harness.reconstruct import reconstruct_turn
from harness.reexecute import reexecute_turn
from harness.session import LABEL_API, open_session, read_bodies
from record.digest import Domain, digest, prompt_bytes, tool_call_id
from record.schema import ModelRequest
from tests.harness.rig import (
    CLOCK,
    PINS,
    Recorded,
    model_exchanges,
    recorded_turn,
)

LINE = f"Current date and time: {CLOCK} (UTC)"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with recorded_turn(tmp_path_factory.mktemp("anthropic"), "anthropic") as turn:
        yield turn


def test_a_pinned_turn_speaks_the_messages_api_through_the_proxy(recorded: Recorded) -> None:
    result = recorded.result
    assert result.outcome == "ANSWERED", result.detail
    (call,) = result.steps[0].completion.tool_calls
    call_id, name, arguments = call
    assert name == "web_search" and isinstance(json.loads(arguments), dict)
    assert recorded.rig.web.fetches == 1
    (first, first_reply), (second, second_reply) = model_exchanges(
        recorded.store, recorded.session, recorded.key
    )
    for request, reply in ((first, first_reply), (second, second_reply)):
        assert request.provider.endpoint.endswith("/v1/messages")
        assert request.provider.name == "messages"
        sent = json.loads(request.request_bytes)
        # the harness sends no system prompt: the clock's line becomes the system (fold)
        assert sent["system"] == LINE and sent["clock"] == CLOCK
        assert request.clock == CLOCK and request.clock_rule == "fold"
        # pins: the seed and strict cache as the engine's members, the rest as Anthropic's
        assert (sent["seed"], sent["strict_cache"]) == (PINS["seed"], True)
        assert (sent["max_tokens"], sent["temperature"]) == (PINS["max_tokens"], 0.7)
        assert request.prompt_digest == digest(Domain.PROMPT, prompt_bytes(sent))
        assert reply.outcome == "COMMITTED" and reply.reproducibility is not None
        # the engine's block names the prompt the proxy recorded, and the seed it was sent
        assert reply.reproducibility["prompt_digest"] == request.prompt_digest
        assert reply.reproducibility["seed"] == PINS["seed"]
    # the engine's tool_use id is the one the proxy derives: the mapping is the identity
    assert call_id == tool_call_id(first.prompt_digest, PINS["seed"], 0)
    mapping = (first_reply.reproducibility or {})["affidavit_tool_call_ids"]
    assert mapping == [{"upstream": call_id, "derived": call_id}]
    assistant, user = json.loads(second.request_bytes)["messages"][-2:]
    assert [b["type"] for b in assistant["content"]][-1] == "tool_use"
    assert assistant["content"][-1]["id"] == call_id
    assert user["content"][0]["type"] == "tool_result"
    assert user["content"][0]["tool_use_id"] == call_id


def test_the_messages_turn_reconstructs_exactly(recorded: Recorded) -> None:
    fetches = recorded.rig.web.fetches
    report = reconstruct_turn(recorded.store, recorded.session, 0, recorded.key)
    assert report.ok, report.json()
    assert len(report.steps) == 2 and report.answer_identical
    assert recorded.rig.web.fetches == fetches


def test_the_messages_turn_reexecutes_with_identical_verdicts(recorded: Recorded) -> None:
    fetches = recorded.rig.web.fetches
    report = reexecute_turn(recorded.rig.home, recorded.session, 0, key=recorded.key)
    assert report.identical, report.json()
    assert len(report.verdicts) == 2 and report.live_calls == 0
    assert all(v.prompt and v.clock and v.request and v.reply for v in report.verdicts)
    assert recorded.rig.web.fetches == fetches  # the search was served from the record


def test_the_sdk_stream_helper_reads_a_pinned_reply_through_the_proxy(recorded: Recorded) -> None:
    rig = recorded.rig
    state = open_session(rig.home, {**PINS, "max_tokens": 12}, labels={LABEL_API: "anthropic"})
    client = anthropic.Anthropic(base_url=state.base_url, api_key=state.token, max_retries=0)
    seen: list[str] = []
    notes: list[dict[str, Any]] = []
    finals: list[Any] = []
    for _ in range(2):
        with client.messages.stream(
            model=rig.up.appliance.model,
            max_tokens=100,
            system="Be brief.",
            messages=[{"role": "user", "content": "Say hello."}],
        ) as stream:
            for event in stream:
                seen.append(event.type)
                if event.type == "affidavit":
                    notes.append((event.model_extra or {})["affidavit"])
            finals.append(stream.get_final_message())
    client.close()
    assert seen.count("affidavit") == 2 and seen.count("message_start") == 2
    # the annotation comes just before the terminal event it announces
    ends = [i for i, kind in enumerate(seen) if kind == "message_stop"]
    assert [seen[i - 1] for i in ends] == ["affidavit", "affidavit"]
    assert all(n["outcome"] == "COMMITTED" and n["clock"] == CLOCK for n in notes)
    assert notes[0]["pins_applied"]["max_tokens"] == 12 and notes[0]["pins_applied"]["seed"]
    assert notes[0]["response_digest"] == notes[1]["response_digest"]  # pinned: same bytes
    one, two = finals
    assert one.id == two.id and one.id.startswith("msg_")
    assert one.stop_reason == "max_tokens" and one.usage.output_tokens == 12
    assert one.content[0].type == "text" and one.content == two.content
    bodies = dict(read_bodies(rig.up.appliance.store, state.session_id, recorded.key))
    request = next(b for b in bodies.values() if isinstance(b, ModelRequest))
    # a client's string system: the clock's line folded in front of it
    assert json.loads(request.request_bytes)["system"] == f"{LINE}\n\nBe brief."


def test_an_independent_reader_opens_the_messages_records(
    recorded: Recorded, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from record.bundle import export_stream
    from tests.record.independent_reader import verify_bundle

    bundle = tmp_path_factory.mktemp("bundle") / "out"
    export_stream(recorded.store, recorded.session, bundle)
    report = verify_bundle(bundle, private_key_pem=recorded.key.to_pem())
    assert report.problems == []
    bodies = report.bodies.values()
    requests = [b for b in bodies if "prompt_bytes" in b and "clock" in b]  # model.request
    assert len(requests) == 2
    assert [r["clock_rule"] for r in requests] == ["fold", "fold"]
    assert all(r["provider"]["endpoint"].endswith("/v1/messages") for r in requests)
