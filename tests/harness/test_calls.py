"""Replay for any client (#15 line 7): a stream no harness turn drove, replayed as calls.

The client here is the official ``openai`` SDK (a forced tool call, then a streamed answer
that uses the tool's result), the official ``mcp`` client on the session's MCP URL (the
remote ``peek`` tool, whose answer changes on every live call), a fetch on the session's
fetch endpoint of the page a forced ``web_fetch`` call asked for (the proxy admits a fetch
only as a call the model made; the loopback page changes on every live fetch) and the official
``anthropic`` SDK on ``/v1/messages``, against a pinned session on the real engine. Then:
``replay --calls --reconstruct`` rebuilds every call from the record (and names the call a
tampered store breaks), ``replay --calls`` re-sends each one to the engine (identical
verdicts, no live call), and ``session new --replay-of`` re-runs the same client code
against the recorded plan (same answers, every model call judged identical, 0 live MCP
calls or fetches)."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

import anthropic
import httpx
import openai

from harness.calls import reconstruct_calls, reexecute_calls, replay_verdicts
from harness.session import open_session, read_bodies
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
)
from record.seal import KeyPair
from tests.harness.rig import PINS, HarnessRig, harness_rig

PEEK: Any = {
    "type": "function",
    "function": {
        "name": "remote__peek",
        "description": "Peek at a word.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 8}},
            "required": ["word"],
        },
    },
}


def _web_fetch(page: str) -> Any:
    """A ``web_fetch`` tool whose only allowed URL is ``page``: a forced call of it on the
    engine (constrained decoding) asks for exactly that fetch."""
    url = {"type": "string", "enum": [page]}
    parameters = {"type": "object", "properties": {"url": url}, "required": ["url"]}
    return {"type": "function", "function": {"name": "web_fetch", "parameters": parameters}}


@dataclass
class Driven:
    """What the client saw: its answers, and the proxy's annotations."""

    answers: list[Any]
    notes: list[dict[str, Any]]


def drive(base_url: str, token: str, model: str, page: str) -> Driven:
    """The client's own agent code: what a third party would write against a session."""
    import mcp_types
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    answers: list[Any] = []
    notes: list[dict[str, Any]] = []
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Peek at a word for me."}]
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        tools=[PEEK],
        tool_choice={"type": "function", "function": {"name": "remote__peek"}},
    )
    first = json.loads(raw.content)
    notes.append(first["affidavit"])
    (call,) = first["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    answers.append(arguments)

    async def peek() -> str:
        import httpx2

        meta: Any = {
            "affidavit/reply_seq": first["affidavit"]["seq"],
            "affidavit/call_id": call["id"],
        }
        headers = {"authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120, trust_env=False) as http,
            streamable_http_client(f"{base_url}/mcp/remote", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            request = mcp_types.CallToolRequest(
                params=mcp_types.CallToolRequestParams(name="peek", arguments=arguments, _meta=meta)
            )
            result = await session.send_request(request, mcp_types.CallToolResult)
        return "".join(getattr(part, "text", "") for part in result.content)

    peeked = asyncio.run(peek())
    answers.append(peeked)
    messages += [
        first["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": peeked},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        tools=[_web_fetch(page)],
        tool_choice={"type": "function", "function": {"name": "web_fetch"}},
    )
    notes.append(json.loads(raw.content)["affidavit"])  # it asked for the page: now a fetch
    fetched = httpx.post(
        f"{base_url}/v1/fetch",
        json={"method": "GET", "url": page},
        headers={"authorization": f"Bearer {token}"},
        timeout=60,
        trust_env=False,
    )
    page_text = base64.b64decode(fetched.json()["body"]).decode()
    answers.append(page_text)
    messages += [{"role": "user", "content": f"The page says: {page_text}"}]
    text = []
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
        extra = chunk.model_extra or {}
        if "affidavit" in extra:
            notes.append(extra["affidavit"])
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
    answers.append("".join(text))
    client.close()
    claude = anthropic.Anthropic(base_url=base_url, api_key=token, max_retries=0)
    reply = claude.messages.with_raw_response.create(
        model=model, max_tokens=200, messages=[{"role": "user", "content": "Say hello."}]
    )
    message = json.loads(reply.http_response.content)
    notes.append(message["affidavit"])
    answers.append(message["content"])
    claude.close()
    return Driven(answers, notes)


@dataclass
class Recorded:
    rig: HarnessRig
    session: str
    key: KeyPair
    driven: Driven
    peeks: int  # live calls the remote MCP server had once the client was done
    fetches: int

    @property
    def store(self) -> str:
        return self.rig.up.appliance.store


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with harness_rig(tmp_path_factory.mktemp("calls")) as rig:
        state = open_session(rig.home, PINS)
        driven = drive(state.base_url, state.token, rig.up.appliance.model, rig.web_url + "/p")
        key = KeyPair.read(rig.home.user_key_file)
        yield Recorded(rig, state.session_id, key, driven, len(rig.remote.calls), rig.web.fetches)


def cli(home: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args, "--home", str(home.root)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_client_drove_a_pinned_stream_with_no_turns(recorded: Recorded) -> None:
    bodies = read_bodies(recorded.store, recorded.session, recorded.key)
    requests = [b for _, b in bodies if isinstance(b, ModelRequest)]
    assert len(requests) == 4
    assert [json.loads(r.request_bytes).get("stream") is True for r in requests] == [
        False,
        False,
        True,
        False,
    ]
    assert requests[3].provider.endpoint.endswith("/v1/messages")
    (fetch,) = [b for _, b in bodies if isinstance(b, FetchRequest)]  # as the model asked
    replies = [s for s, b in bodies if isinstance(b, ModelResponse)]
    assert fetch.reply_seq == replies[1] and fetch.call_id
    (tool,) = [b for _, b in bodies if isinstance(b, ToolCall)]
    assert (tool.server, tool.tool) == ("remote", "peek")
    assert any(isinstance(b, ToolResult) and b.outcome == "COMMITTED" for _, b in bodies)
    assert recorded.peeks == 1 and recorded.fetches == 1
    assert recorded.driven.answers[1] == "peeked at 1 words"
    assert "page version 0" in recorded.driven.answers[2]
    # the CLI's turn replay has nothing to replay here
    done = cli(recorded.rig.home, "replay", recorded.session, "0", "--reconstruct")
    assert done.returncode == 3 and "has no turns" in done.stderr and "--calls" in done.stderr


def test_calls_reconstruct_from_the_record_alone(recorded: Recorded) -> None:
    done = cli(recorded.rig.home, "replay", recorded.session, "--calls", "--reconstruct")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("Reconstruct call")]
    assert len(lines) == 4
    assert all("differs" not in line for line in lines)
    assert "streamed" in lines[2] and "/v1/messages" in lines[3]
    assert "reconstructed exactly: 4 of 4 calls" in done.stdout
    report = reconstruct_calls(recorded.store, recorded.session, recorded.key)
    assert report.ok
    assert all(
        set(c.checks) >= {"request", "prompt", "clock", "pins", "reply", "annotation"}
        for c in report.calls
    )
    assert recorded.rig.web.fetches == recorded.fetches  # nothing went live
    assert len(recorded.rig.remote.calls) == recorded.peeks


def test_calls_reconstruct_one_named_call_and_refuses_an_unknown_seq(recorded: Recorded) -> None:
    seqs = [c.seq for c in reconstruct_calls(recorded.store, recorded.session, recorded.key).calls]
    done = cli(
        recorded.rig.home,
        "replay",
        recorded.session,
        "--calls",
        str(seqs[2]),
        "--reconstruct",
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert [c["seq"] for c in doc["calls"]] == [seqs[2]] and doc["ok"]
    bad = cli(recorded.rig.home, "replay", recorded.session, "--calls", "99999", "--reconstruct")
    assert bad.returncode == 2 and "99999" in bad.stderr


def test_a_tampered_store_fails_reconstruct_naming_the_call(
    recorded: Recorded, tmp_path: Path
) -> None:
    """An insider with the stream's data key rewrites the streamed call's recorded input
    (sealed again, trigger dropped): the rebuilt request no longer matches, and reconstruct
    exits 1 naming that call, while the calls before and after it still match."""
    import base64

    from record.digest import canonical_json
    from record.log import entry_line
    from record.reader import StreamKeys, associated_data
    from record.schema import parse_entry
    from record.seal import open_sealed, seal

    seq = [c.seq for c in reconstruct_calls(recorded.store, recorded.session, recorded.key).calls][
        2
    ]
    copy = tmp_path / "tampered.sqlite"
    source, db = sqlite3.connect(recorded.store), sqlite3.connect(copy)
    source.backup(db)  # the store is in WAL mode: a file copy could miss committed entries
    source.close()
    rows = db.execute(
        "SELECT seq, line FROM entries WHERE stream = ? ORDER BY seq", (recorded.session,)
    ).fetchall()
    entries = [parse_entry(bytes(line)) for _, line in rows]
    entry = entries[seq]
    data_key = StreamKeys.collect(recorded.session, entries, recorded.key).keys[entry.key_epoch]
    assert isinstance(entry.body, str)
    plain = json.loads(open_sealed(data_key, base64.b64decode(entry.body), associated_data(entry)))
    sent = json.loads(base64.b64decode(plain["input_bytes"]))
    sent["messages"][0]["content"] = "Peek at a word for him."
    plain["input_bytes"] = base64.b64encode(json.dumps(sent).encode()).decode("ascii")
    envelope = entry.model_dump(mode="json", exclude={"body"})
    sealed = seal(data_key, canonical_json(plain), canonical_json(envelope))
    line, _ = entry_line(envelope, base64.b64encode(sealed).decode("ascii"))
    db.execute("DROP TRIGGER entries_no_update")  # editing by hand, as an attacker would
    db.execute(
        "UPDATE entries SET line = ? WHERE stream = ? AND seq = ?", (line, recorded.session, seq)
    )
    db.commit()
    db.close()
    report = reconstruct_calls(copy, recorded.session, recorded.key)
    assert [c.ok for c in report.calls] == [True, True, False, True]
    first = report.first_difference
    assert first is not None and first.seq == seq and first.checks == {"request": False}
    done = cli(
        recorded.rig.home,
        "replay",
        recorded.session,
        "--calls",
        "--reconstruct",
        "--store",
        str(copy),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"first difference at call seq {seq}" in done.stdout
    assert f"Reconstruct call seq {seq} " in done.stdout and "request differs" in done.stdout
    # the appliance's own store is untouched: it still reconstructs
    assert reconstruct_calls(recorded.store, recorded.session, recorded.key).ok


def test_reply_bytes_that_do_not_match_their_digest_fail_naming_the_call(
    recorded: Recorded,
) -> None:
    """The Messages call's recorded reply bytes changed, its digest kept (bodies as an
    insider would re-seal them): the rebuilt request still matches, the reply does not."""
    from record.schema import ModelResponse

    bodies = read_bodies(recorded.store, recorded.session, recorded.key)
    last = max(s for s, b in bodies if isinstance(b, ModelResponse))
    changed = []
    for seq, body in bodies:
        if seq == last:
            assert isinstance(body, ModelResponse) and body.response_bytes
            body = body.model_copy(
                update={"response_bytes": body.response_bytes.replace(b'"text"', b'"texT"', 1)}
            )
        changed.append((seq, body))
    report = reconstruct_calls(recorded.store, recorded.session, recorded.key, bodies=changed)
    assert [c.ok for c in report.calls] == [True, True, True, False]
    first = report.first_difference
    assert first is not None and first.reply_seq == last
    assert first.checks["request"] and not first.checks["reply"]
    assert "reply bytes do not match" in first.what


def test_calls_reexecute_on_the_engine_with_identical_verdicts(recorded: Recorded) -> None:
    peeks, fetches = len(recorded.rig.remote.calls), recorded.rig.web.fetches
    done = cli(recorded.rig.home, "replay", recorded.session, "--calls")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("Replay of call seq")]
    assert len(lines) == 4 and all("differs" not in line for line in lines)
    assert all("0 live calls" in line for line in lines)
    assert "4 of 4 calls identical, 0 live calls" in done.stdout
    report = reexecute_calls(recorded.rig.home, recorded.session, key=recorded.key)
    assert report.identical and len(report.verdicts) == 4
    replay = read_bodies(recorded.store, report.replay_stream, recorded.key)
    verdicts = replay_verdicts(replay)
    assert len(verdicts) == 4 and all(v["reply_identical"] for v in verdicts)
    assert len(recorded.rig.remote.calls) == peeks and recorded.rig.web.fetches == fetches


def test_session_new_replay_of_reruns_the_client_against_the_record(recorded: Recorded) -> None:
    peeks, fetches = len(recorded.rig.remote.calls), recorded.rig.web.fetches
    done = cli(recorded.rig.home, "session", "new", "--replay-of", recorded.session, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    opened = json.loads(done.stdout)
    again = drive(
        opened["base_url"],
        opened["token"],
        recorded.rig.up.appliance.model,
        recorded.rig.web_url + "/p",
    )
    assert again.answers == recorded.driven.answers  # the page and the peek: from the record
    assert len(recorded.rig.remote.calls) == peeks and recorded.rig.web.fetches == fetches
    judged = [note["replay"] for note in again.notes]
    assert len(judged) == 4
    for verdict in judged:
        assert verdict["replays"] == recorded.session
        assert verdict["prompt_identical"] and verdict["clock_identical"]
        assert verdict["request_identical"] and verdict["reply_identical"]
        assert verdict["live_calls"] == 0
    bodies = read_bodies(recorded.store, opened["session"], recorded.key)
    assert len(replay_verdicts(bodies)) == 4
    shown = cli(recorded.rig.home, "replay", opened["session"], "--calls", "--reconstruct")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (
        f"Recorded verdicts: 4 of 4 calls judged identical to their recorded twins in "
        f"{recorded.session}" in shown.stdout
    )
    served = [b for _, b in bodies if isinstance(b, ToolResult | FetchResponse)]
    assert len(served) == 2 and all(b.replayed_from is not None for b in served)


def test_replay_of_judges_a_different_call_and_refuses_a_tool_call_not_recorded(
    recorded: Recorded,
) -> None:
    """Client code that strays: its model call is still sent and judged (request differs),
    and its tool call, which the record does not hold, is refused, never made live."""
    import mcp_types
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    peeks = len(recorded.rig.remote.calls)
    done = cli(recorded.rig.home, "session", "new", "--replay-of", recorded.session, "--json")
    opened = json.loads(done.stdout)
    client = openai.OpenAI(
        base_url=opened["openai_base_url"], api_key=opened["token"], max_retries=0
    )
    raw = client.chat.completions.with_raw_response.create(
        model=recorded.rig.up.appliance.model,
        messages=[{"role": "user", "content": "Something else entirely."}],
        tools=[PEEK],
        tool_choice={"type": "function", "function": {"name": "remote__peek"}},
    )
    client.close()
    reply = json.loads(raw.content)
    verdict = reply["affidavit"]["replay"]
    assert verdict["replays"] == recorded.session
    assert not verdict["request_identical"] and not verdict["prompt_identical"]
    assert verdict["clock_identical"]  # the recorded clock was given to it all the same
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    assert arguments != recorded.driven.answers[0]

    async def peek() -> MCPError | None:
        import httpx2

        meta: Any = {
            "affidavit/reply_seq": reply["affidavit"]["seq"],
            "affidavit/call_id": call["id"],
        }
        headers = {"authorization": f"Bearer {opened['token']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120, trust_env=False) as http,
            streamable_http_client(f"{opened['base_url']}/mcp/remote", http_client=http) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            request = mcp_types.CallToolRequest(
                params=mcp_types.CallToolRequestParams(name="peek", arguments=arguments, _meta=meta)
            )
            try:
                await session.send_request(request, mcp_types.CallToolResult)
            except MCPError as exc:
                return exc
        return None

    refused = asyncio.run(peek())
    assert refused is not None and "replay_miss" in str(refused.error.data)
    assert len(recorded.rig.remote.calls) == peeks


def test_replay_of_an_unknown_stream_is_missing(recorded: Recorded) -> None:
    done = cli(recorded.rig.home, "session", "new", "--replay-of", "no-such-stream")
    assert done.returncode == 3


# -- the panel ----------------------------------------------------------------------------------


def test_in_a_browser_a_stream_with_no_turns_lists_its_calls_with_replay_and_verify(
    recorded: Recorded, browser: Any
) -> None:
    pytest.importorskip("jinja2", reason="the panel renders with Jinja2")
    from harness.panel.server import running_panel
    from harness.panel.source import ApplianceSource

    peeks, fetches = len(recorded.rig.remote.calls), recorded.rig.web.fetches
    with running_panel(ApplianceSource(recorded.rig.home)) as panel:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(panel.url)
        page.click(f"a.stream[href='/s/{recorded.session}']")
        page.click("#calls-link")
        page.wait_for_selector("#replay-button")
        rows = page.locator("tr.call")
        assert rows.count() == 4
        assert "streamed" in rows.nth(2).inner_text()
        assert "/v1/messages" in rows.nth(3).inner_text()
        assert rows.nth(0).locator("td").nth(7).inner_text() == "1"  # the peek it asked for
        assert rows.nth(1).locator("td").nth(7).inner_text() == "1"  # the fetch it asked for
        page.click("#verify-button")
        page.wait_for_selector("#verify-result", timeout=60_000)
        assert "reconstructed exactly: 4 of 4 calls" in page.inner_text("#verify-result")
        checked = page.locator("#verify-lines li.same").all_inner_texts()
        assert len(checked) == 4 and all("differs" not in line for line in checked)
        page.click("#replay-button")
        page.wait_for_selector("#replay-summary", timeout=120_000)
        lines = page.locator("#replay-banner li").all_inner_texts()
        assert len(lines) == 4
        for line in lines:
            assert "prompt identical · injected clock identical · request identical · " in line
            assert line.endswith("reply identical · 0 live calls"), line
        assert "4 of 4 calls identical, 0 live calls" in page.inner_text("#replay-summary")
        assert page.locator("#verify-result").count() == 1  # the verify banner stays
        context.close()
    assert len(recorded.rig.remote.calls) == peeks and recorded.rig.web.fetches == fetches
