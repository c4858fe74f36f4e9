"""The harness on an Anthropic provider: the official ``anthropic`` SDK through the proxy's
Messages route, a tool call made only after the ``affidavit`` event said the reply is
committed, tool results sent back as ``tool_result`` blocks, and the turn reconstructed
from the record. The provider is a loopback HTTP server answering in Anthropic's streaming
format (a stand-in for api.anthropic.com, which cannot be reached here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.agent import TurnPolicy
from harness.demo import ChangingWeb
from harness.reconstruct import reconstruct_turn
from harness.session import open_session, read_bodies, run_turn
from harness.state import Home
from harness.up import _serve, running_appliance
from record.schema import FetchRequest, ModelRequest, StreamOpened
from record.seal import KeyPair
from tests.egress_proxy.loopback import request_body

MODEL = "claude-stand-in-1"


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _reply(blocks: list[dict[str, Any]], stop: str) -> bytes:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_standin_0001", "type": "message", "role": "assistant",
                "model": MODEL, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        }
    ]  # fmt: skip
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index,
                 "content_block": {"type": "text", "text": ""}}
            )  # fmt: skip
            events.append(
                {"type": "content_block_delta", "index": index,
                 "delta": {"type": "text_delta", "text": block["text"]}}
            )  # fmt: skip
        else:
            events.append(
                {"type": "content_block_start", "index": index,
                 "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"],
                                   "input": {}}}
            )  # fmt: skip
            for piece in (block["json"][:7], block["json"][7:]):
                events.append(
                    {"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": piece}}
                )  # fmt: skip
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
         "usage": {"output_tokens": 9}}
    )  # fmt: skip
    events.append({"type": "message_stop"})
    return _sse(events)


@dataclass
class StandIn:
    """Answers a tool call first, then (once a ``tool_result`` came back) a text answer."""

    requests: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = await request_body(receive)
        request = json.loads(body)
        self.requests.append(request)
        last = request["messages"][-1]["content"]
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if answered:
            reply = _reply([{"type": "text", "text": "The page says hello."}], "end_turn")
        else:
            call = {"type": "tool_use", "id": "toolu_standin_01", "name": "web_search",
                    "json": '{"query": "hello"}'}  # fmt: skip
            reply = _reply([{"type": "text", "text": "Let me look."}, call], "tool_use")
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


@dataclass
class Recorded:
    home: Home
    session: str
    store: str
    result: Any
    stand_in: StandIn
    web: ChangingWeb


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    stand_in, web = StandIn(), ChangingWeb()
    home = Home(tmp_path_factory.mktemp("anthropic") / "home")
    provider = {"api": "anthropic", "api_key_env": "TEST_ANTHROPIC_KEY"}
    env = {"TEST_ANTHROPIC_KEY": "sk-ant-standin"}
    with (
        _serve(stand_in) as upstream,
        _serve(web) as web_url,
        running_appliance(
            home,
            provider={**provider, "base_url": upstream},
            model=MODEL,
            search_url=web_url + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),  # the loopback web: refused unless allow-listed
            env=env,
        ) as up,
    ):
        state = open_session(home, None, policy=TurnPolicy(4))
        result = run_turn(home, state.session_id, "What does the page say?")
        yield Recorded(home, state.session_id, up.appliance.store, result, stand_in, web)


def test_a_turn_on_an_anthropic_provider_goes_through_the_anthropic_sdk(
    recorded: Recorded,
) -> None:
    result = recorded.result
    assert result.outcome == "ANSWERED", result.detail
    assert result.answer == "The page says hello."
    first, second = recorded.stand_in.requests
    assert first["tools"][0]["name"] == "web_fetch" and "input_schema" in first["tools"][0]
    assert first["tool_choice"] == {"type": "auto"}
    # the reply and its tool result went back in Anthropic's shapes
    assistant, user = second["messages"][-2:]
    assert assistant["content"][1] == {
        "type": "tool_use", "id": "toolu_standin_01", "name": "web_search",
        "input": {"query": "hello"},
    }  # fmt: skip
    (block,) = user["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_standin_01"
    assert "page version 0 of /search" in block["content"]
    # the tool ran only after the proxy said the reply was committed
    annotation = result.steps[0].completion.annotation
    assert annotation is not None and annotation["outcome"] == "COMMITTED"
    key = KeyPair.read(recorded.home.user_key_file)
    bodies = read_bodies(recorded.store, recorded.session, key)
    reply_seq = annotation["seq"]
    fetch_seq = next(s for s, b in bodies if isinstance(b, FetchRequest))
    assert reply_seq < fetch_seq
    requests = [b for _, b in bodies if isinstance(b, ModelRequest)]
    assert [r.provider.endpoint.endswith("/v1/messages") for r in requests] == [True, True]
    labels = next(b for _, b in bodies if isinstance(b, StreamOpened)).labels
    assert labels["affidavit/api"] == "anthropic"


def test_the_anthropic_turn_reconstructs_exactly(recorded: Recorded) -> None:
    key = KeyPair.read(recorded.home.user_key_file)
    fetched, asked = recorded.web.fetches, len(recorded.stand_in.requests)
    report = reconstruct_turn(recorded.store, recorded.session, 0, key)
    assert report.ok, report.json()
    assert len(report.steps) == 2 and report.answer_identical
    assert (recorded.web.fetches, len(recorded.stand_in.requests)) == (fetched, asked)
