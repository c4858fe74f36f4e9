"""The harness on the Responses API: the real engine behind ``running_appliance``, a pinned
session labelled ``responses``, so the agent speaks ``POST /v1/responses`` through the
official ``openai`` SDK: a forced ``web_search`` call whose arguments parse, its result fed
back as a ``function_call_output`` item, a second step in words. The record holds both
requests on the Responses route with their clock in ``instructions`` and the rule recorded;
reconstruct rebuilds the turn byte for byte, re-execute judges every step identical, and
the SDK's own stream helper reads a pinned reply (annotation event included) through the
proxy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

import openai

from harness.reconstruct import reconstruct_turn
from harness.reexecute import reexecute_turn
from harness.session import LABEL_API, open_session, read_bodies
from record.digest import Domain, digest, prompt_bytes
from record.schema import ModelResponse
from tests.harness.rig import (
    CLOCK,
    PINS,
    Recorded,
    model_exchanges,
    recorded_turn,
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with recorded_turn(tmp_path_factory.mktemp("responses"), "responses") as turn:
        yield turn


def test_a_pinned_turn_speaks_the_responses_api_through_the_proxy(recorded: Recorded) -> None:
    result = recorded.result
    assert result.outcome == "ANSWERED", result.detail
    (call,) = result.steps[0].completion.tool_calls
    call_id, name, arguments = call
    assert name == "web_search" and isinstance(json.loads(arguments), dict)
    assert call_id.startswith("call_")
    assert recorded.rig.web.fetches == 1
    (first, first_reply), (second, second_reply) = model_exchanges(
        recorded.store, recorded.session, recorded.key
    )
    for request, reply in ((first, first_reply), (second, second_reply)):
        assert request.provider.endpoint.endswith("/v1/responses")
        sent = json.loads(request.request_bytes)
        # the clock went into instructions (the harness sends none), and the rule with it
        assert sent["instructions"] == f"Current date and time: {CLOCK} (UTC)"
        assert request.clock == CLOCK and request.clock_rule == "fold"
        # pins: seed as the engine's member, max_tokens as max_output_tokens
        assert sent["seed"] == PINS["seed"] and sent["max_output_tokens"] == PINS["max_tokens"]
        assert "max_tokens" not in sent and sent["strict_cache"] is True
        assert request.prompt_digest == digest(Domain.PROMPT, prompt_bytes(sent))
        assert b'"instructions"' in request.prompt_bytes and b'"input"' in request.prompt_bytes
        assert "input" not in request.params and "seed" in request.params
        assert reply.outcome == "COMMITTED" and reply.reproducibility is not None
        # the engine's block names the prompt the proxy recorded
        assert reply.reproducibility["prompt_digest"] == request.prompt_digest
    items = json.loads(second.request_bytes)["input"]
    kinds = [item.get("type", "message") for item in items]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert items[1]["call_id"] == items[2]["call_id"] == call_id


def test_the_responses_turn_reconstructs_exactly(recorded: Recorded) -> None:
    fetches = recorded.rig.web.fetches
    report = reconstruct_turn(recorded.store, recorded.session, 0, recorded.key)
    assert report.ok, report.json()
    assert len(report.steps) == 2 and report.answer_identical
    assert recorded.rig.web.fetches == fetches


def test_the_responses_turn_reexecutes_with_identical_verdicts(recorded: Recorded) -> None:
    fetches = recorded.rig.web.fetches
    report = reexecute_turn(recorded.rig.home, recorded.session, 0, key=recorded.key)
    assert report.identical, report.json()
    assert len(report.verdicts) == 2 and report.live_calls == 0
    assert all(v.prompt and v.clock and v.request and v.reply for v in report.verdicts)
    assert recorded.rig.web.fetches == fetches  # the search was served from the record


def test_the_sdk_stream_helper_reads_a_pinned_reply_through_the_proxy(recorded: Recorded) -> None:
    rig = recorded.rig
    state = open_session(rig.home, {**PINS, "max_tokens": 12}, labels={LABEL_API: "responses"})
    client = openai.OpenAI(base_url=state.base_url + "/v1", api_key=state.token, max_retries=0)
    seen: list[str] = []
    notes: list[dict[str, Any]] = []
    texts: list[str] = []
    for _ in range(2):
        with client.responses.stream(model=rig.up.appliance.model, input="Say hello.") as stream:
            for event in stream:
                seen.append(event.type)
                if str(event.type) == "affidavit":  # the proxy's event: unknown to the SDK
                    notes.append((event.model_extra or {})["affidavit"])
                if event.type == "response.output_text.done":
                    texts.append(event.text)
    client.close()
    assert seen.count("affidavit") == 2 and seen.count("response.created") == 2
    # the annotation comes just before the terminal event it announces
    ends = [
        i for i, kind in enumerate(seen) if kind in ("response.completed", "response.incomplete")
    ]
    assert [seen[i - 1] for i in ends] == ["affidavit", "affidavit"]
    assert all(n["outcome"] == "COMMITTED" and n["clock"] == CLOCK for n in notes)
    assert notes[0]["pins_applied"]["max_tokens"] == 12
    assert notes[0]["response_digest"] == notes[1]["response_digest"]  # pinned: same bytes
    assert texts[0] == texts[1] and texts[0]


def test_a_non_streamed_reply_through_the_proxy_carries_the_annotation(
    recorded: Recorded,
) -> None:
    rig = recorded.rig
    state = open_session(rig.home, {**PINS, "max_tokens": 8}, labels={LABEL_API: "responses"})
    client = openai.OpenAI(base_url=state.base_url + "/v1", api_key=state.token, max_retries=0)
    reply = client.responses.create(model=rig.up.appliance.model, input="Say hello.")
    client.close()
    extra = reply.model_extra or {}
    note = extra["affidavit"]
    assert note["outcome"] == "COMMITTED" and note["clock"] == CLOCK
    assert reply.id.startswith("resp_") and reply.usage is not None
    assert reply.usage.output_tokens <= 8
    assert extra["reproducibility"]["prompt_digest"] == note["prompt_digest"]
    bodies = dict(read_bodies(recorded.store, state.session_id, recorded.key))
    response = bodies[note["seq"]]
    assert isinstance(response, ModelResponse) and response.reproducibility is not None
    assert response.reproducibility["max_tokens"] == 8
