"""The reproducibility block, the derived reply identity, and the reply's shapes.

- a pinned request's ``id``, ``request_id`` and ``created`` are functions of its bytes and
  clock (``created`` 0 without a clock); an unpinned one's ids are fresh each time;
- the system fingerprint changes with the weights, the engine and the linear path;
- the block names every member the issue lists, in a fixed order, with the enclave's
  ``AFFIDAVIT_TEE_TYPE``/``AFFIDAVIT_IMAGE_DIGEST`` and ``MKL_CBWR`` from the environment;
- a finished sequence becomes content or derived tool calls with the right finish reason,
  and a stream releases content, then the calls, the finish, the block and ``[DONE]``;
- token bytes in logprobs are exact even for half a UTF-8 character; clocks must be UTC.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.block import (  # noqa: E402
    EngineInfo,
    Reply,
    mkl_version,
    reply_identity,
    reproducibility_block,
    system_fingerprint,
)
from inference.protocol import ApiError, TokenTable, parse_clock  # noqa: E402
from inference.sampling import SampledToken  # noqa: E402
from inference.scheduler import Event, Finished, TokenEvent  # noqa: E402
from inference.server import stream  # noqa: E402
from inference.tool_calls import derived_tool_call_ids  # noqa: E402
from inference.weights import weights_digest  # noqa: E402
from record.digest import Domain  # noqa: E402

#: The members acceptance line 6 names, in the block's order.
BLOCK_KEYS = [
    "request_id",
    "seed",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "clock",
    "model",
    "weights_digest",
    "weights_source",
    "engine",
    "torch_version",
    "mkl_version",
    "mkl_cbwr",
    "device",
    "dtype",
    "batch_invariance",
    "invariance_path",
    "kv_cache_mode",
    "cached_tokens",
    "batch_peers_max",
    "tee_type",
    "image_digest",
    "prompt_digest",
    "prompt_tokens_digest",
    "system_fingerprint",
]


def test_pinned_identity_is_derived_from_the_bytes_and_clock() -> None:
    body = b'{"model":"m","messages":[],"seed":1}'
    clock = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    a = reply_identity(body, pinned=True, clock=clock)
    assert a == reply_identity(body, pinned=True, clock=clock)
    assert a.created == int(clock.timestamp()) == 1741064767
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", a.id)
    assert a.request_id == "req_" + a.id.removeprefix("chatcmpl-")
    assert reply_identity(body, pinned=True, clock=None).created == 0
    other = reply_identity(body + b" ", pinned=True, clock=clock)
    assert other.id != a.id and other.request_id != a.request_id

    u1 = reply_identity(body, pinned=False, clock=None)
    u2 = reply_identity(body, pinned=False, clock=None)
    assert u1.id != u2.id and u1.request_id != u2.request_id and u1.created > 0
    assert reply_identity(body, pinned=False, clock=clock).created == a.created


def test_system_fingerprint_depends_on_each_input() -> None:
    base = system_fingerprint("sha256:aa", "affidavit-embedded/1", "fixed-chunk-8")
    assert re.fullmatch(r"fp_[0-9a-f]{16}", base)
    assert base == system_fingerprint("sha256:aa", "affidavit-embedded/1", "fixed-chunk-8")
    assert base != system_fingerprint("sha256:ab", "affidavit-embedded/1", "fixed-chunk-8")
    assert base != system_fingerprint("sha256:aa", "affidavit-embedded/2", "fixed-chunk-8")
    assert base != system_fingerprint("sha256:aa", "affidavit-embedded/1", "stock")


def _info(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> EngineInfo:
    monkeypatch.setenv("AFFIDAVIT_TEE_TYPE", "sev-snp")
    monkeypatch.setenv("AFFIDAVIT_IMAGE_DIGEST", "sha256:" + "1" * 64)
    monkeypatch.setenv("MKL_CBWR", "AVX2,STRICT")
    return EngineInfo.collect(
        model="tiny",
        weights_digest=weights_digest(tiny_model_dir),
        invariance_path="fixed-chunk-8",
        batch_invariance=True,
    )


def test_block_members_and_environment(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    info = _info(monkeypatch, tiny_model_dir)
    assert (info.tee_type, info.image_digest, info.mkl_cbwr) == (
        "sev-snp",
        "sha256:" + "1" * 64,
        "AVX2,STRICT",
    )
    assert info.engine.startswith("affidavit-embedded/")
    assert info.torch_version == torch.__version__
    assert info.mkl_version == mkl_version()
    if torch.backends.mkl.is_available():
        assert info.mkl_version and info.mkl_version in torch.__config__.show()
    block = reproducibility_block(
        info,
        request_id="req_x",
        seed=5,
        temperature=0.5,
        top_p=0.9,
        top_k=3,
        max_tokens=7,
        clock=None,
        kv_cache_mode="strict",
        cached_tokens=0,
        batch_peers_max=2,
        prompt_digest="sha256:" + "2" * 64,
        prompt_token_ids=[1, 20, 300],
    )
    assert list(block) == BLOCK_KEYS
    assert block["system_fingerprint"] == info.system_fingerprint
    # the token ids the engine ran, rebuilt from the documented definition
    material = bytes([Domain.PROMPT_TOKENS]) + b"[1,20,300]"
    assert block["prompt_tokens_digest"] == "sha256:" + hashlib.sha256(material).hexdigest()
    assert json.loads(json.dumps(block)) == block

    monkeypatch.delenv("AFFIDAVIT_TEE_TYPE")
    monkeypatch.delenv("AFFIDAVIT_IMAGE_DIGEST")
    monkeypatch.delenv("MKL_CBWR")
    plain = EngineInfo.collect(
        model="tiny", weights_digest="sha256:00", invariance_path="stock", batch_invariance=False
    )
    assert (plain.tee_type, plain.image_digest, plain.mkl_cbwr) == ("none", None, None)


@pytest.fixture(scope="module")
def tokens(tiny_model_dir: Path) -> TokenTable:
    return TokenTable.load(tiny_model_dir, 768)


def _reply(tokens: TokenTable, mode: str) -> Reply:
    identity = reply_identity(b"{}", pinned=True, clock=None)
    return Reply(
        identity=identity,
        model="tiny",
        fingerprint="fp_0",
        block={"request_id": identity.request_id, "cached_tokens": 0, "batch_peers_max": 0},
        tool_mode=mode,
        grammar=None,
        prompt_digest="sha256:" + "3" * 64,
        seed=42,
        logprobs=False,
        stream=False,
        include_usage=False,
        tokens=tokens,
    )


def _finished(text: str, reason: str = "stop") -> Finished:
    return Finished(
        reason=reason,  # type: ignore[arg-type]
        token_ids=(1, 2, 3),
        text=text,
        tail="",
        prompt_tokens=10,
        cached_tokens=4,
        batch_peers_max=3,
        constraint_complete=False,
    )


def test_reply_outcomes(tokens: TokenTable) -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    plain = _reply(tokens, "none")
    assert plain.outcome(_finished(call)) == (call, [], "stop")
    assert plain.outcome(_finished("cut", "length"))[2] == "length"

    auto = _reply(tokens, "auto")
    content, calls, reason = auto.outcome(_finished("before " + call))
    assert (content, reason) == ("before", "tool_calls")
    assert [c.id for c in calls] == derived_tool_call_ids("sha256:" + "3" * 64, 42, 1)
    assert calls[0].function.name == "f" and json.loads(calls[0].function.arguments) == {"a": 1}
    assert auto.outcome(_finished(call))[0] is None
    assert auto.outcome(_finished("no call here")) == ("no call here", [], "stop")

    done = _finished("hi")
    completion = plain.completion(done, [])
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    assert completion.usage.total_tokens == 13
    assert completion.reproducibility["batch_peers_max"] == 3
    assert completion.reproducibility["cached_tokens"] == 4
    assert plain.trailer(done).startswith(b"data: {") and plain.trailer(done).endswith(b"\n\n")
    trailer = json.loads(plain.trailer(done)[len(b"data: ") :])
    assert trailer["choices"] == [] and "usage" not in trailer


def test_token_table_reports_exact_bytes(tokens: TokenTable) -> None:
    halves = [i for i, text in enumerate(tokens.texts) if text == "\ufffd"]
    assert halves, "a byte-level vocabulary has tokens holding part of a character"
    assert all(len(tokens.raw[i]) == 1 and tokens.raw[i][0] >= 0x80 for i in halves)
    tag = tokens.texts.index("<tool_call>")
    assert tokens.raw[tag] == b"<tool_call>"
    assert tokens.texts.index("<|im_end|>") in tokens.special
    entry = tokens.logprob(SampledToken(tag, float("-inf"), ((tag, -0.5),)))
    assert entry.logprob == -9999.0 and entry.top_logprobs[0].bytes == list(b"<tool_call>")


def test_clock_must_be_rfc3339_utc() -> None:
    assert parse_clock("2025-01-02T03:04:05Z") == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_clock("2025-01-02T03:04:05.5+00:00").microsecond == 500000
    for bad in ("2025-01-02T03:04:05+01:00", "2025-01-02T03:04:05", "yesterday", "2025-01-02"):
        with pytest.raises(ApiError) as caught:
            parse_clock(bad)
        assert caught.value.param == "clock"


class _Ticket:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _stream(reply: Reply, events: list[Event]) -> tuple[list[Any], _Ticket]:
    async def run() -> list[bytes]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for event in events:
            queue.put_nowait(event)
        return [chunk async for chunk in stream(reply, queue, ticket)]  # type: ignore[arg-type]

    ticket = _Ticket()
    raw = b"".join(asyncio.run(run())).decode()
    parts = raw.split("\n\n")
    assert parts[-2:] == ["data: [DONE]", ""]
    return [json.loads(p.removeprefix("data: ")) for p in parts[:-2]], ticket


def test_an_auto_stream_sends_text_then_the_calls(tokens: TokenTable) -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    token = SampledToken(5, -1.0, ())
    events: list[Event] = [TokenEvent(token, "hello "), TokenEvent(token, "")]
    chunks, ticket = _stream(_reply(tokens, "auto"), [*events, _finished("hello " + call)])
    assert ticket.cancelled
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": "hello "}]
    calls = deltas[2]["tool_calls"]
    assert [c["index"] for c in calls] == [0] and calls[0]["function"]["name"] == "f"
    assert calls[0]["id"] == derived_tool_call_ids("sha256:" + "3" * 64, 42, 1)[0]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["reproducibility"]["cached_tokens"] == 4


def test_a_failed_stream_ends_with_an_error_event(tokens: TokenTable) -> None:
    failed = Finished("error", (), "", "", 3, 0, 0, False, error="decode failed: boom")
    chunks, _ = _stream(_reply(tokens, "none"), [failed])
    assert chunks[-1]["error"]["message"] == "decode failed: boom"
    assert chunks[-1]["error"]["type"] == "server_error"
