"""Fixtures shared by the record's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import JsonValue

from record.digest import Domain, canonical_json, digest
from record.log import Appended, Log
from record.schema import (
    ModelRequest,
    ModelResponse,
    Provider,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
)
from record.seal import KeyPair
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

#: ``write_turn(log, stream, turn, tag=b"", wrong_digest=False) -> [Appended, ...]``
WriteTurn = Callable[..., list[Appended]]

#: A reply that is not UTF-8: the record keeps what the provider sent, byte for byte.
NON_UTF8_REPLY = b"data: \xff\xfe\x00caf\xe9 \xc3\x28 \x80\x81\n\ndata: [DONE]\n\n"


def _model_request(turn: int, step: int, messages: list[dict[str, str]]) -> ModelRequest:
    params: dict[str, JsonValue] = {"seed": 42, "temperature": 0.7, "max_tokens": 64}
    raw = canonical_json(
        {"model": "affidavit-tiny", "messages": messages, "stream": True, **params}
    )
    prompt = canonical_json({"model": "affidavit-tiny", "messages": messages})
    return ModelRequest(
        content_key=digest(Domain.REQUEST, raw),
        input_digest=digest(Domain.INPUT, raw),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=raw,
        input_bytes=raw,
        prompt_bytes=prompt,
        provider=Provider(name="embedded", endpoint="http://127.0.0.1/v1/chat/completions"),
        model_id="affidavit-tiny",
        params=params,
        pins={"seed": 42, "temperature": 0.7},
        clock="2026-11-30T12:00:00Z",
        turn=turn,
        step=step,
    )


def _write_turn(
    log: Log,
    stream: str,
    turn: int,
    *,
    tag: bytes = b"",
    wrong_digest: bool = False,
    result: bytes | None = None,
    final: bytes | None = None,
) -> list[Appended]:
    """Append one tool-using turn as the proxy does: 8 entries, ``turn.ended`` last.

    ``turn.ended`` makes the writer sign a checkpoint. Odd turns end with a reply that is
    not UTF-8. ``tag`` varies the content (two forks of one log differ only by it).
    ``wrong_digest``: the final reply's ``response_digest`` is the digest of other bytes;
    the writer does not check digests, the audit with a key must. ``result`` and ``final``:
    the tool's result and the last reply, as an upstream sent them, instead of the usual.
    """
    question = b"What does https://example.org/%d say?" % turn + tag
    out = [
        log.append(
            stream,
            TurnStarted(
                turn=turn, input_bytes=question, input_digest=digest(Domain.INPUT, question)
            ),
        )
    ]
    messages = [{"role": "user", "content": question.decode()}]
    out.append(log.append(stream, _model_request(turn, 0, messages)))
    reply = b'data: {"tool_calls":[{"id":"call_%d","function":{"name":"web_fetch"}}]}\n\n' % turn
    out.append(
        log.append(
            stream,
            ModelResponse(
                request_seq=out[-1].seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=reply,
                response_digest=digest(Domain.RESPONSE, reply),
            ),
        )
    )
    args = canonical_json({"url": f"https://example.org/{turn}"})
    out.append(
        log.append(
            stream,
            ToolCall(
                reply_seq=out[-1].seq,
                call_id=f"call_{turn}",
                server="builtin",
                tool="web_fetch",
                arguments=args,
                arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
                idempotent=True,
            ),
        )
    )
    page = b"<html><title>Example %d</title></html>" % turn + tag if result is None else result
    out.append(
        log.append(
            stream,
            ToolResult(
                call_seq=out[-1].seq,
                outcome="COMMITTED",
                result_bytes=page,
                result_digest=digest(Domain.TOOL_RESULT, page),
            ),
        )
    )
    messages.append({"role": "tool", "content": page.decode("utf-8", "replace")})
    out.append(log.append(stream, _model_request(turn, 1, messages)))
    if final is None:
        final = NON_UTF8_REPLY + tag if turn % 2 else b"data: The page says: Example %d.\n\n" % turn
    claimed = digest(Domain.RESPONSE, final + b"!" if wrong_digest else final)
    out.append(
        log.append(
            stream,
            ModelResponse(
                request_seq=out[-1].seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=final,
                response_digest=claimed,
            ),
        )
    )
    answer = b"Example %d." % turn
    out.append(
        log.append(
            stream,
            TurnEnded(
                turn=turn,
                outcome="ANSWERED",
                answer_bytes=answer,
                answer_digest=digest(Domain.RESPONSE, answer),
            ),
        )
    )
    assert out[-1].checkpoint is not None, "the writer signs a checkpoint after turn.ended"
    return out


@pytest.fixture(scope="session")
def write_turn() -> WriteTurn:
    """Append one realistic tool-using turn (8 entries, checkpointed) to a stream."""
    return _write_turn


@pytest.fixture
def user() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture
def appliance() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Where a test's SQLite store goes (made by the first writer)."""
    return tmp_path / "record.db"
