"""``make demo`` on the embedded defaults, as far as the landed parts reach.

Today it exercises the record end to end: a session's stream is opened and sealed to the
user's key, one tool-using turn is appended as the proxy will append it (request hashed
before the call, verbatim reply, tool call and result), the turn's checkpoint is signed,
the stream is exported as an auditor bundle, and both are verified, with the v1.0 record
projected from the log. The engine, proxy and harness turn replace the scripted replies
as their issues land.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import JsonValue

from record.audit import verify_store
from record.bundle import export_stream, verify_bundle
from record.digest import Domain, canonical_json, digest
from record.log import Log
from record.reader import StreamKeys
from record.schema import (
    ModelRequest,
    ModelResponse,
    Provider,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    parse_entry,
    project_v1,
)
from record.seal import KeyPair

_REPLY_1 = (
    b'data: {"id":"chatcmpl-demo","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":'
    b'{"name":"web_fetch","arguments":"{\\"url\\":\\"https://example.org/\\"}"}}]},'
    b'"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n'
)
_REPLY_2 = (
    b'data: {"id":"chatcmpl-demo2","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"The page says: Example Domain."},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def _request(step: int, messages: list[dict[str, str]]) -> ModelRequest:
    params: dict[str, JsonValue] = {"seed": 42, "temperature": 0.7, "max_tokens": 64}
    request = {"model": "affidavit-tiny", "messages": messages, "stream": True, **params}
    raw = canonical_json(request)
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
        turn=0,
        step=step,
    )


def run_demo(workdir: Path | None = None) -> int:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="affidavit-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    user = KeyPair.generate()
    appliance = KeyPair.generate()
    store_path = workdir / "record.db"
    stream = "demo-session"
    print(f"store: {store_path}")
    with Log.open(store_path, appliance_key=appliance) as log:
        log.open_stream(stream, [user.recipient, appliance.recipient], {"pinned": "seed=42"})
        question = b"What does https://example.org/ say?"
        log.append(
            stream,
            TurnStarted(turn=0, input_bytes=question, input_digest=digest(Domain.INPUT, question)),
        )
        messages = [{"role": "user", "content": question.decode()}]
        req = log.append(stream, _request(0, messages))
        print(f"  seq {req.seq}: model.request appended before the call")
        reply = log.append(
            stream,
            ModelResponse(
                request_seq=req.seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=_REPLY_1,
                response_digest=digest(Domain.RESPONSE, _REPLY_1),
            ),
        )
        args = canonical_json({"url": "https://example.org/"})
        call = log.append(
            stream,
            ToolCall(
                reply_seq=reply.seq,
                call_id="call_0",
                server="builtin",
                tool="web_fetch",
                arguments=args,
                arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
                idempotent=True,
            ),
        )
        page = b"<html><title>Example Domain</title></html>"
        log.append(
            stream,
            ToolResult(
                call_seq=call.seq,
                outcome="COMMITTED",
                result_bytes=page,
                result_digest=digest(Domain.TOOL_RESULT, page),
            ),
        )
        messages += [{"role": "tool", "content": page.decode()}]
        req2 = log.append(stream, _request(1, messages))
        log.append(
            stream,
            ModelResponse(
                request_seq=req2.seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=_REPLY_2,
                response_digest=digest(Domain.RESPONSE, _REPLY_2),
            ),
        )
        answer = b"The page says: Example Domain."
        end = log.append(
            stream,
            TurnEnded(
                turn=0,
                outcome="ANSWERED",
                answer_bytes=answer,
                answer_digest=digest(Domain.RESPONSE, answer),
            ),
        )
        assert end.checkpoint is not None
        print(
            f"  seq {end.seq}: turn.ended; checkpoint signed:\n" + _indent(end.checkpoint.decode())
        )
        (workdir / "kept.checkpoint").write_bytes(end.checkpoint)
    report = verify_store(store_path, key=user, kept=[(workdir / "kept.checkpoint").read_bytes()])
    print(
        f"verify store with the user's key: {'ok' if report.ok else 'FAILED'} ({report.entries} entries)"
    )
    bundle = workdir / "bundle"
    export_stream(store_path, stream, bundle)
    breport = verify_bundle(bundle, key=user)
    print(f"verify exported bundle {bundle}: {'ok' if breport.ok else 'FAILED'}")
    _print_v1(store_path, stream, user)
    for problem in report.problems + breport.problems:
        print(f"  {problem.code} {problem.stream}/{problem.seq}: {problem.detail}")
    return 0 if report.ok and breport.ok else 1


def _print_v1(store_path: Path, stream: str, key: KeyPair) -> None:
    from record.sqlite_store import SQLiteStore

    store = SQLiteStore(store_path, readonly=True)
    try:
        entries = [parse_entry(e.line) for e in store.entries(stream)]
    finally:
        store.close()
    keys = StreamKeys.collect(stream, entries, key)
    bodies = {e.seq: keys.open(e) for e in entries}
    for entry in entries:
        body = bodies[entry.seq]
        if isinstance(body, ModelRequest):
            response = next(
                (
                    b
                    for b in bodies.values()
                    if isinstance(b, ModelResponse) and b.request_seq == entry.seq
                ),
                None,
            )
            v1 = project_v1(entry.envelope(), body, response)
            print(
                f"v1.0 record seq {v1.seq}: content_key {v1.content_key[:23]}… outcome {v1.outcome}, {len(v1.response_bytes or b'')} response bytes"
            )


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" for line in text.splitlines())
