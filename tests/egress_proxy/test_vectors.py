"""Real provider bytes through the proxy to the official SDKs, and back out of the record.

Every capture in ``../shared/vectors/provider-streams`` (12 OpenAI, 10 Anthropic; read in
place, never copied) is served by a real uvicorn upstream on loopback, verbatim, as
``text/event-stream`` in 61-byte pieces, to an unpinned session. For each file:

- the official SDK (``openai`` stream helper; ``anthropic`` beta stream helper, and the
  plain one for files its plain-surface tests use) assembles the final message the
  manifest expects: OpenAI from ``expected_final``; Anthropic from ``stop_reason``,
  ``content_block_types`` and the restated upstream assertions in ``expected``;
- the record's ``model.response`` holds the file byte for byte (opened with the user's key),
  with its digest, and ``fingerprint`` is the capture's ``system_fingerprint``;
- the bytes a raw client gets are the file's bytes plus exactly one annotation event, on an
  event boundary just before the stream's terminating event (``[DONE]`` or
  ``message_stop``), naming the response entry's ``seq`` and the request's content key.

Also: the Anthropic refusal-fallback middleware splices ``stream-a-refusal.sse`` and
``stream-b-fallback.sse`` across two proxied calls into the one message the manifest
describes, with the annotation in between; both hops are recorded verbatim.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.lib.middleware import BetaFallbackState, BetaRefusalFallbackMiddleware

from egress_proxy.providers import ANTHROPIC, OPENAI, Dialect
from egress_proxy.sse import iter_events
from record.digest import Domain, digest
from record.schema import ModelRequest, ModelResponse
from tests.egress_proxy.loopback import Rig, Script, chunked, split_annotation

OPENAI_FILES = [
    "173417d553406f034f643e5db3f8d591fb691ebac56f5ae39a22cc7d455c5353.bin",
    "2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin",
    "4cc50a6135d254573a502310e6af1246f55edb6ad95fa24059f160996b68866d.bin",
    "569c877e69429d4cbc1577d2cd6dd33878095c68badc6b6654a69769b391a1c1.bin",
    "7e5ea4d12e7cc064399b6631415e65923f182256b6e6b752950a3aaa2ad2320a.bin",
    "83b060bae42eb41c4f1edbb7c1542b954b37d9dfd1910b964ddebc9677e6ae85.bin",
    "a247c49c5fcd492bfb7a02a3306ad615ed8d8f649888ebfddfbc3ee151f44d46.bin",
    "a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin",
    "c6aa7e397b7123c3501f25df3a05d4daf7e8ad6d61ffa406ab5361fe36a8d5b1.bin",
    "d615580118391ee13492193e3a8bb74642d23ac1ca13fe37cb6e889b66f759f6.bin",
    "e2aad469b71d1d4894ff833ea147020a9d875eb7ce644a0ff355581690a4cbfd.bin",
    "f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin",
]


def _text(i: int, text: str) -> Callable[[Any], None]:
    def check(m: Any) -> None:
        assert m.content[i].type == "text" and m.content[i].text == text

    return check


def _usage(input_tokens: int, output_tokens: int) -> Callable[[Any], None]:
    def check(m: Any) -> None:
        assert (m.usage.input_tokens, m.usage.output_tokens) == (input_tokens, output_tokens)

    return check


def _block(i: int, **fields: Any) -> Callable[[Any], None]:
    def check(m: Any) -> None:
        for key, value in fields.items():
            assert getattr(m.content[i], key) == value, key

    return check


#: The upstream assertions each manifest's ``expected`` restates, as checks on the message.
ANTHROPIC_EXPECTED: dict[str, list[Callable[[Any], object]]] = {
    "basic_response.txt": [
        lambda m: m.id == "msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK" or pytest.fail(m.id),
        _text(0, "Hello there!"),
        _usage(11, 6),
    ],
    "compaction_response.txt": [
        _block(
            0,
            type="compaction",
            content="Earlier conversation summarized.",
            encrypted_content="EpwBCioIDxgCEAEYASJALd_opaque_compaction_payload",
        ),
        _text(1, "Hello there!"),
    ],
    "fallback_credit_response.txt": [
        lambda m: m.usage.fallback_credit.status.type == "redeemed" or pytest.fail("credit"),
        lambda m: m.usage.output_tokens == 8 or pytest.fail("output_tokens"),
    ],
    "fallback_response.txt": [
        lambda m: m.model == "claude-sonnet-4-5" or pytest.fail(m.model),  # relabelled
        _block(0, type="fallback"),
        _text(1, "Hello there!"),
    ],
    "incomplete_partial_json_response.txt": [
        _block(
            1,
            type="tool_use",
            input={
                "filename": "taxes.txt",
                "lines_of_text": [
                    "# COMPREHENSIVE TAX GUIDE FOR INDIVIDUALS WITH MULTIPLE W-2s",
                    "",
                    "## INTRODUCTION",
                    "",
                ],
            },
        ),
    ],
    "refusal_response.txt": [
        lambda m: (
            (m.stop_details.type, m.stop_details.category, m.stop_details.explanation)
            == ("refusal", "cyber", "This request was refused due to policy.")
            or pytest.fail(str(m.stop_details))
        ),
    ],
    "stream-a-refusal.sse": [_text(1, "Hi")],
    "stream-a-toolrefusal.sse": [
        _block(
            0, type="server_tool_use", input={"query": "solar eclipse viewing safety news 2026"}
        ),
    ],
    "stream-b-fallback.sse": [lambda m: m.usage.output_tokens == 547 or pytest.fail("usage")],
    "tool_use_response.txt": [
        _text(0, "I'll check the current weather in Paris for you."),
        _block(1, type="tool_use", name="get_weather", input={"location": "Paris"}),
        _usage(377, 65),
    ],
}
# Files the upstream's plain ``client.messages`` tests use: checked on that surface too.
PLAIN_SURFACE = {"basic_response.txt", "refusal_response.txt", "tool_use_response.txt"}
ANTHROPIC_CASES = [(name, "beta") for name in sorted(ANTHROPIC_EXPECTED)] + [
    (name, "plain") for name in sorted(PLAIN_SURFACE)
]


@pytest.fixture(scope="module")
def streams(vectors: Path) -> Path:
    return vectors / "provider-streams"


def manifest(streams: Path, provider: str) -> dict[str, Any]:
    files: dict[str, Any] = json.loads((streams / provider / "manifest.json").read_text())["files"]
    return files


def test_the_cases_cover_every_capture(streams: Path) -> None:
    assert sorted(manifest(streams, "openai")) == OPENAI_FILES
    assert sorted(manifest(streams, "anthropic")) == sorted(ANTHROPIC_EXPECTED)


def play(rig: Rig, data: bytes) -> None:
    rig.upstream.script = Script(chunks=chunked(data, 61), content_type="text/event-stream")


def last_call(rig: Rig, stream: str) -> tuple[int, ModelRequest, int, ModelResponse]:
    """The session's latest request and response entries (seq and body of each)."""
    bodies = rig.bodies(stream)
    seq = max(s for s, (_, b) in bodies.items() if isinstance(b, ModelResponse))
    response = bodies[seq][1]
    assert isinstance(response, ModelResponse)
    request = bodies[response.request_seq][1]
    assert isinstance(request, ModelRequest)
    return response.request_seq, request, seq, response


def check_record_and_annotation(
    rig: Rig, session: Any, data: bytes, dialect: Dialect, path: str, body: bytes
) -> ModelResponse:
    """The record holds the file; a raw client gets the file plus one annotation, in place."""
    _, _, _, sdk_reply = last_call(rig, session.session_id)
    assert sdk_reply.outcome == "COMMITTED"
    assert sdk_reply.response_bytes == data
    assert sdk_reply.response_digest == digest(Domain.RESPONSE, data)
    play(rig, data)
    delivered = httpx.post(
        session.base_url + path,
        content=body,
        headers={"authorization": f"Bearer {session.token}"},
        timeout=10,
    ).content
    rest, note, index = split_annotation(delivered)
    assert rest == data  # the client got the upstream's bytes, plus the annotation only
    assert index == next(i for i, e in enumerate(iter_events(data)) if dialect.is_terminal(e))
    request_seq, request, seq, reply = last_call(rig, session.session_id)
    assert reply.response_bytes == data  # ... while the record kept the upstream's bytes
    assert (note["seq"], note["request_seq"], note["stream"]) == (
        seq,
        request_seq,
        session.session_id,
    )
    assert note["content_key"] == request.content_key
    assert note["response_digest"] == reply.response_digest
    return reply


@pytest.mark.parametrize("name", OPENAI_FILES)
def test_openai_capture_through_the_proxy(fresh: Rig, streams: Path, name: str) -> None:
    facts = manifest(streams, "openai")[name]
    data = (streams / "openai" / name).read_bytes()
    session = fresh.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    play(fresh, data)
    must_refuse = "LengthFinishReasonError" in facts["summary"]  # a partial object, cut short
    with client.chat.completions.stream(model="gpt-4o-2024-08-06", messages=messages) as stream:
        final: Any
        try:
            final = stream.get_final_completion()
            assert not must_refuse
        except openai.LengthFinishReasonError as exc:
            assert must_refuse
            final = exc.completion
    expected = facts["expected_final"]
    assert (final.id, final.model) == (facts["completion_id"], facts["model"])
    assert len(final.choices) == len(expected["choices"])
    for want in expected["choices"]:
        got = final.choices[want["index"]]
        assert got.finish_reason == want["finish_reason"]
        assert got.message.content == want["content"]
        assert got.message.refusal == want["refusal"]
        calls = [
            (c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls or []
        ]
        assert calls == [(c["id"], c["name"], c["arguments"]) for c in want.get("tool_calls", [])]
        if "logprob_tokens" in want:
            (kind,) = want["logprob_kind"]
            assert [t.token for t in getattr(got.logprobs, kind)] == want["logprob_tokens"]
    usage = expected["usage"]
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )
    assert final.usage.completion_tokens_details is not None
    assert final.usage.completion_tokens_details.reasoning_tokens == 0
    body = b'{"model":"gpt-4o-2024-08-06","messages":[],"stream":true}'
    reply = check_record_and_annotation(fresh, session, data, OPENAI, "/v1/chat/completions", body)
    (fingerprint,) = set(re.findall(rb'"system_fingerprint":"([^"]+)"', data))
    assert reply.fingerprint == final.system_fingerprint == fingerprint.decode()


@pytest.mark.parametrize(("name", "surface"), ANTHROPIC_CASES)
def test_anthropic_capture_through_the_proxy(
    fresh: Rig, streams: Path, name: str, surface: str
) -> None:
    facts = manifest(streams, "anthropic")[name]
    data = (streams / "anthropic" / name).read_bytes()
    session = fresh.open_session()
    client = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    api: Any = client.beta.messages if surface == "beta" else client.messages
    play(fresh, data)
    with api.stream(
        model="claude", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        kinds = [event.type for event in s]
        final = s.get_final_message()
    assert kinds.count("affidavit") == 1  # the SDK passes the annotation through as unknown
    assert final.stop_reason == facts["stop_reason"]
    assert Counter(block.type for block in final.content) == Counter(facts["content_block_types"])
    if name != "fallback_response.txt" or surface == "plain":
        assert final.model == facts["model_in_message_start"]
    if surface == "beta" or name in PLAIN_SURFACE:
        for check in ANTHROPIC_EXPECTED[name]:
            check(final)
    body = b'{"model":"claude","max_tokens":8,"messages":[],"stream":true}'
    check_record_and_annotation(fresh, session, data, ANTHROPIC, "/v1/messages", body)


def test_refusal_fallback_splices_two_recorded_calls(fresh: Rig, streams: Path) -> None:
    names = ("stream-a-refusal.sse", "stream-b-fallback.sse")
    captures = [(streams / "anthropic" / n).read_bytes() for n in names]
    fresh.upstream.queue = [
        Script(chunks=chunked(d, 61), content_type="text/event-stream") for d in captures
    ]
    session = fresh.open_session()
    client = anthropic.Anthropic(
        base_url=session.anthropic_base_url,
        api_key=session.token,
        max_retries=0,
        middleware=[BetaRefusalFallbackMiddleware([{"model": "claude-opus-4-8"}])],
    )
    with (
        BetaFallbackState(),
        client.beta.messages.stream(
            model="claude-fable-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as s,
    ):
        kinds = Counter(event.type for event in s)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "fallback", "text"]
    assert (kinds["message_start"], kinds["message_delta"], kinds["message_stop"]) == (1, 1, 1)
    assert final.stop_reason == "end_turn"
    assert [(i.type, getattr(i, "model", None)) for i in final.usage.iterations or []] == [
        ("message", "claude-fable-5"),
        ("fallback_message", "claude-opus-4-8"),
    ]
    bodies = fresh.bodies(session.session_id)
    recorded = [b.response_bytes for _, b in bodies.values() if isinstance(b, ModelResponse)]
    assert recorded == captures
