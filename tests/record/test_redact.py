"""Redaction covers every copy (#16 line 11), on a session recorded through the real proxy.

A secret is planted where a careless view would leak it: in the user's input, in the client's
request behind a ``\\u`` escape, in a streamed reply split across SSE deltas (text and
tool-call arguments), in a whole JSON reply behind an escape, in a fetched page (chunked, and
escaped), and in the turn's answer. ``affidavit log show --redact`` (a real subprocess) and
the panel started with ``--redact`` (a real ``affidavit panel`` process, read with raw HTTP)
show none of it: not the secret, not a piece of it a delta carried, not its base64 at any of
the three alignments, not its JSON escapes. Raw byte fields are shown as the record's own
digests. A field rule (``input_bytes``) hides the client's request in every entry that
repeats it. The store's file bytes, its lines and the Merkle root are the same afterwards.

The record's decoder (``record.decoded``) is also held to whole-reply shapes for each
streaming dialect, so a page that reads a reply reads the reassembled one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import merkle_reference as ref
import pytest

from egress_proxy.control import ControlClient, ControlPlane
from egress_proxy.server import ProxyServer
from record.decoded import decode, read
from record.digest import Domain, digest
from record.log import Log
from record.redact import REDACTED, RedactionRules
from record.schema import ModelRequest, ModelResponse, TurnStarted
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Script,
    chunked,
    proxy_config,
    read_bodies,
)
from tests.record.raw_store import stored_lines

SECRET = "secret-4711-quokka"
RULE = r"re:secret-\d+-quokka"
ESCAPED = "\\u0073ecret-4711-quokka"  # the secret as JSON may spell it
TAIL = "ret-4711-quokka"  # what the second SSE delta carries


def leaks(text: str) -> list[str]:
    """Each form of the secret found in ``text``: plain, a delta's piece, JSON-escaped, or
    base64 at each of the three alignments (the characters that depend on it alone)."""
    forms = {"plain": SECRET, "delta": TAIL, "escaped": ESCAPED, "escaped-all": _all_escaped()}
    raw = SECRET.encode()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        whole = (shift + len(raw)) // 3 * 4
        forms[f"base64+{shift}"] = encoded[4 if shift else 0 : whole]
        forms[f"urlsafe+{shift}"] = forms[f"base64+{shift}"].replace("+", "-").replace("/", "_")
    return [name for name, form in forms.items() if form in text]


def _all_escaped() -> str:
    return "".join(f"\\u{ord(c):04x}" for c in SECRET)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


#: The streamed reply: the secret split across two text deltas, and across two argument
#: deltas of a tool call, one of them behind an escape.
STREAMED = b"".join(
    [
        _chunk({"role": "assistant", "content": "The key is sec"}),
        _chunk({"content": "ret-4711-quokka, keep it."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "store", "arguments": '{"value": "\\u0073e'},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'cret-4711-quokka"}'}}]}),
        _chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
)
#: A whole reply whose content spells the secret behind an escape.
WHOLE = (
    b'{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m","choices":[{"index"'
    b':0,"message":{"role":"assistant","content":"Stored \\u0073ecret-4711-quokka."},'
    b'"finish_reason":"stop"}]}'
)


def _asks_for(url: str) -> bytes:
    """A whole reply asking for ``web_fetch`` of ``url``: the call the fetch is admitted as."""
    function = {"name": "web_fetch", "arguments": json.dumps({"url": url})}
    call = {"id": "call_2", "type": "function", "function": function}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    reply = {"id": "chatcmpl-3", "object": "chat.completion", "created": 1, "model": "m"}
    return json.dumps({**reply, "choices": [choice]}).encode()


#: The page the fetch reads: chunked, the secret split across chunks and escaped in JSON.
PAGE = b'{"note": "the \\u0073ecret-4711-quokka page"}'


async def web(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A loopback web server: one JSON page, sent in two chunks (chunked transfer coding)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"json")]}
    )
    cut = PAGE.index(b"cret")
    await send({"type": "http.response.body", "body": PAGE[:cut], "more_body": True})
    await send({"type": "http.response.body", "body": PAGE[cut:], "more_body": False})


@dataclass
class Session:
    dir: Path
    store: Path
    stream: str
    user: KeyPair
    user_key: Path


def _request(text: str, *, stream: bool) -> bytes:
    """A client's request with ``text`` as the user's message, the secret escaped in it."""
    body = json.dumps(
        {
            "model": "m",
            "stream": stream,
            "messages": [
                {"role": "system", "content": "You keep what you are told."},
                {"role": "user", "content": text},
            ],
        }
    )
    return body.replace(SECRET, ESCAPED).encode()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One turn recorded through the real proxy: the harness's events over the control
    plane, three model calls (streamed, whole, whole asking for the page) to a scripted
    upstream, and one fetch."""
    tmp = tmp_path_factory.mktemp("redact")
    store = tmp / "record.db"
    user, appliance = KeyPair.generate(), KeyPair.generate()
    user.write(tmp / "user.key")
    upstream = FakeUpstream()
    upstream.queue = [
        Script(chunks=chunked(STREAMED, 7), content_type="text/event-stream"),
        Script(chunks=[WHOLE]),
    ]
    fetch = {"enabled": True, "max_response_bytes": 64 * 1024, "allow": ["127.0.0.1/32"]}
    with (
        Log.open(store, appliance_key=appliance) as log,
        LoopbackServer(upstream) as up,
        LoopbackServer(web) as page,
        ProxyServer(proxy_config(up.url, fetch=fetch), log, env=ENV) as proxy,
        ControlPlane(proxy.registry, tmp / "control.sock") as control,
    ):
        opened = proxy.registry.open_session([user.recipient], {"test": "redact"}, None)
        said = f"Please remember {SECRET} for me.".encode()
        harness = ControlClient(control.path)

        def append(kind: str, body: dict[str, Any]) -> None:
            harness.append_event(opened.session_id, kind, body)

        append(
            "turn.started",
            {
                "turn": 0,
                "input_bytes": base64.b64encode(said).decode(),
                "input_digest": digest(Domain.INPUT, said),
            },
        )
        headers = {"authorization": f"Bearer {opened.token}"}
        url = f"{opened.openai_base_url}/chat/completions"
        with httpx.Client(timeout=30) as client:
            first = client.post(url, content=_request(said.decode(), stream=True), headers=headers)
            assert first.status_code == 200, first.text
            second = client.post(url, content=_request("Stored?", stream=False), headers=headers)
            assert second.status_code == 200, second.text
            upstream.script = Script(chunks=[_asks_for(f"{page.url}/notes")])
            third = client.post(url, content=_request("Read it.", stream=False), headers=headers)
            assert third.status_code == 200, third.text  # it asked for the page: now a fetch
            fetched = client.post(
                f"{opened.openai_base_url}/fetch",
                json={"method": "GET", "url": f"{page.url}/notes"},
                headers=headers,
            )
            assert fetched.status_code == 200, fetched.text
        answer = f"Kept {SECRET}.".encode()
        append(
            "turn.ended",
            {
                "turn": 0,
                "outcome": "ANSWERED",
                "answer_bytes": base64.b64encode(answer).decode(),
                "answer_digest": digest(Domain.RESPONSE, answer),
            },
        )
        harness.close()
        log.checkpoint(opened.session_id)
        assert not upstream.errors, upstream.errors
    yield Session(tmp, store, opened.session_id, user, tmp / "user.key")


def affidavit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=120,
    )


def fingerprint(store: Path) -> tuple[str, ...]:
    """sha256 of the database file and of its WAL (an absent WAL counts as empty)."""
    wal = store.with_name(store.name + "-wal")
    return (
        hashlib.sha256(store.read_bytes()).hexdigest(),
        hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest(),
    )


def test_the_secret_is_in_the_record_where_a_careless_view_finds_it(session: Session) -> None:
    """The plant worked: the bodies hold the secret in each form the views must see through."""
    bodies = read_bodies(session.store, session.stream, session.user)
    kinds = [body.kind for _, body in bodies.values()]  # type: ignore[attr-defined]
    assert kinds.count("model.request") == 3 and kinds.count("fetch.response") == 1
    streamed = next(b for _, b in bodies.values() if isinstance(b, ModelResponse))
    assert streamed.response_bytes is not None
    assert SECRET.encode() not in streamed.response_bytes  # only in pieces
    assert TAIL.encode() in streamed.response_bytes
    request = next(b for _, b in bodies.values() if isinstance(b, ModelRequest))
    assert ESCAPED.encode() in request.input_bytes and SECRET.encode() not in request.input_bytes
    plain = affidavit(
        "log", "show", session.stream, "--store", session.store, "--key", session.user_key,
        cwd=session.dir,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert {"plain", "delta", "escaped"} <= set(leaks(plain.stdout))
    assert SECRET in decode(streamed.response_bytes)["reply"]["choices"][0]["message"]["content"]


def test_log_show_redacted_shows_no_form_of_the_secret(session: Session) -> None:
    store = session.store
    before, lines = fingerprint(store), stored_lines(store, session.stream)
    root = ref.mth(lines)
    for rules in (RULE, f"{RULE},input_bytes", f"model.response:response_bytes,{RULE}"):
        for extra in ((), ("--json",)):
            shown = affidavit(
                "log", "show", session.stream, "--store", store, "--key", session.user_key,
                "--redact", rules, *extra, cwd=session.dir,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            assert leaks(shown.stdout) == [], (rules, extra)
            assert REDACTED in shown.stdout
    shown = affidavit(
        "log", "show", session.stream, "--store", store, "--key", session.user_key,
        "--redact", RULE, "--json", cwd=session.dir,
    )  # fmt: skip
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert len(rows) == len(lines)
    bodies = read_bodies(store, session.stream, session.user)
    for row in rows:
        _, body = bodies[row["envelope"]["seq"]]
        for name in type(body).model_fields:
            value = getattr(body, name)
            if isinstance(value, bytes):  # every raw byte field is its digest, never its bytes
                assert row["body"][name].startswith("sha256:"), (row["envelope"]["kind"], name)
                assert name in row["body"]["decoded"]
    digests = {
        r["envelope"]["kind"]: r["body"] for r in rows if r["envelope"]["kind"] == "turn.started"
    }
    started = next(b for _, b in bodies.values() if isinstance(b, TurnStarted))
    assert digests["turn.started"]["input_bytes"] == started.input_digest
    assert digests["turn.started"]["decoded"]["input_bytes"] == (
        f"Please remember {REDACTED} for me."
    )
    # the streamed reply is shown reassembled, with the rule applied to the joined text
    reply = next(
        r["body"]["decoded"]["response_bytes"]
        for r in rows
        if r["envelope"]["kind"] == "model.response"
    )
    message = reply["reply"]["choices"][0]["message"]
    assert message["content"] == f"The key is {REDACTED}, keep it."
    assert message["tool_calls"][0]["function"]["arguments"] == {"value": REDACTED}

    # nothing stored changed
    assert fingerprint(store) == before
    assert stored_lines(store, session.stream) == lines
    assert ref.mth(stored_lines(store, session.stream)) == root


def test_a_field_rule_hides_every_copy_of_the_field(session: Session) -> None:
    """``--redact input_bytes`` hides the client's request in ``request_bytes`` and
    ``prompt_bytes`` too, and the user's input wherever the requests repeat it."""
    shown = affidavit(
        "log", "show", session.stream, "--store", session.store, "--key", session.user_key,
        "--redact", "input_bytes", "--json", cwd=session.dir,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "Please remember" not in shown.stdout
    assert "You keep what you are told." not in shown.stdout
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    requests = [r["body"] for r in rows if r["envelope"]["kind"] == "model.request"]
    assert len(requests) == 3
    for body in requests:
        assert body["decoded"]["input_bytes"] == REDACTED
        sent = body["decoded"]["request_bytes"]
        assert sent["messages"][0]["content"] == REDACTED  # the system message's copy
        prompt = body["decoded"]["prompt_bytes"]
        assert prompt["messages"][0]["content"] == REDACTED
    assert requests[0]["decoded"]["request_bytes"]["messages"][1]["content"] == REDACTED
    # what no rule hides stays readable
    assert requests[1]["decoded"]["request_bytes"]["messages"][1]["content"] == "Stored?"


def _serve_panel(session: Session, rules: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    bundle = session.dir / "bundle"
    if not bundle.exists():
        exported = affidavit(
            "log", "export", session.stream, "--store", session.store, "--out", bundle,
            cwd=session.dir,
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "panel", "--bundle", str(bundle), "--key",
         str(session.user_key), "--redact", rules, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=session.dir,
        env={**os.environ, "AFFIDAVIT_HOME": str(session.dir / "home")},
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise AssertionError(f"the panel did not start: {process.communicate()[1]}")
    return process, json.loads(line)


def test_the_panel_with_redact_shows_no_form_of_the_secret(session: Session) -> None:
    before, lines = fingerprint(session.store), stored_lines(session.store, session.stream)
    process, doc = _serve_panel(session, RULE)
    try:
        token = doc["url"].split("token=", 1)[1]
        pages = ["/", f"/s/{session.stream}", f"/s/{session.stream}/t/0"]
        pages.append(f"/s/{session.stream}/calls")
        seen = []
        with httpx.Client(base_url=doc["base"], timeout=30) as client:
            for page in pages:
                response = client.get(page, headers={"authorization": f"Bearer {token}"})
                assert response.status_code == 200, (page, response.status_code)
                assert leaks(response.text) == [], page
                seen.append(response.text)
            for job in (f"/s/{session.stream}/t/0/verify", f"/s/{session.stream}/calls/verify"):
                refused = client.post(job, headers={"authorization": f"Bearer {token}"})
                assert refused.status_code == 409, (job, refused.status_code)  # diffs would leak
                assert "replay and verify are off" in refused.text
        turn = seen[2]
        assert REDACTED in turn
        assert "The key is" in turn  # the reassembled reply is shown, the secret is not
        assert "Please remember" in turn and "the" in turn
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert fingerprint(session.store) == before
    assert stored_lines(session.store, session.stream) == lines


# -- the decoder, one dialect at a time ------------------------------------------------------


def _sse(*events: tuple[str | None, dict[str, Any]]) -> bytes:
    out = b""
    for name, data in events:
        out += (
            (f"event: {name}\n".encode() if name else b"") + b"data: " + json.dumps(data).encode()
        )
        out += b"\r\n\r\n"
    return out


def test_a_messages_stream_is_reassembled_into_its_message() -> None:
    data = _sse(
        ("message_start", {"type": "message_start", "message": {"id": "m", "type": "message",
         "role": "assistant", "content": [], "usage": {"input_tokens": 3}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "sec"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "ret-4711-quokka"}}),
        ("content_block_start", {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "t", "name": "store", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '{"v": "\\u0073e'}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": 'cret-4711-quokka"}'}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 9}}),
        ("message_stop", {"type": "message_stop"}),
        ("ping", {"type": "ping"}),
    )  # fmt: skip
    decoded = read(data)
    assert decoded.form == "event-stream"
    message = decoded.value["reply"]
    assert message["content"] == [
        {"type": "text", "text": SECRET},
        {"type": "tool_use", "id": "t", "name": "store", "input": {"v": SECRET}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 9}
    assert decoded.value["other"] == [] and decoded.value["events"] == 10
    view = RedactionRules.parse(RULE).stream([("model.response", {"r": data})])
    assert leaks(json.dumps(view.views())) == []


def test_a_responses_stream_is_reassembled_and_unknown_events_are_kept() -> None:
    data = _sse(
        ("response.output_text.delta", {"type": "response.output_text.delta",
         "output_index": 0, "delta": "sec"}),
        ("response.output_text.delta", {"type": "response.output_text.delta",
         "output_index": 0, "delta": "ret-4711-quokka"}),
        (None, {"type": "custom.event", "note": "kept"}),
    )  # fmt: skip
    value = decode(data)
    assert value["reply"]["streamed"] == [
        {"output_index": 0, "type": "response.output_text", "text": SECRET}
    ]
    assert value["other"] == [{"type": "custom.event", "note": "kept"}]


def test_other_bodies_decode_by_what_they_are() -> None:
    assert read(b'{"a": "\\u0073"}').value == {"a": "s"}
    assert read(b'{"args": "{\\"q\\": \\"\\\\u0073\\"}"}').value == {"args": {"q": "s"}}
    http = read(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nsec\r\n2\r\nre\r\n0\r\n\r\n"
    )
    assert http.form == "http" and http.value == {
        "head": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
        "body": "secre",
    }
    assert read("plain text é".encode()).value == "plain text é"
    assert read(b"\xff\xfe\x00").form == "binary" and decode(b"\xff\xfe") is None
