"""Reconstruct (``egress_proxy.replay``): the pipeline over the record, with no network.

A sequence is recorded through a real proxy on loopback (clock injected from the system
clock, a pinned session, derived tool-call ids quoted back, a streamed Anthropic call, a
tool call and result). Then:

- in a fresh interpreter under ``unshare -n`` (no network namespace at all), the
  reconstructed pipeline regenerates every recorded request (same content key, served in
  order), delivers the same reply bytes, serves the tool result, and never imports
  ``egress_proxy.transports.network``; the store file's bytes are unchanged;
- a changed input raises ``ReplayMiss`` (409 ``replay_miss``) naming the nearest recorded
  call with a diff, and nothing is sent anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxy.errors import ReplayMiss
from egress_proxy.replay import reconstruct_pipeline
from egress_proxy.server import ProxyServer
from egress_proxy.tools import NamedReply, ToolAsk, ToolCalls
from egress_proxy.transports.recorded import RecordedCall
from record.digest import canonical_json
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Script, proxy_config

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_IDS = ["call_RandomUpstreamA"]
TOOL_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": UPSTREAM_IDS[0],
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q":"x"}'},
                    }
                ],
            },
        }
    ],
}
FINAL = json.dumps(
    {"id": "c2", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
).encode()
EVENTS = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1"}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@dataclass
class Recorded:
    store_path: Path
    stream: str
    user: KeyPair
    delivered: list[bytes]  # what the client got, annotation removed (see ``_plain``)
    tool_result: bytes


def _plain(body: bytes) -> bytes:
    """A JSON reply without the proxy's ``affidavit`` member, re-serialised for comparing."""
    value = json.loads(body)
    value.pop("affidavit", None)
    return json.dumps(value, sort_keys=True).encode()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One sequence through a real proxy (system clock injected, pinned), then closed."""
    store_path = tmp_path_factory.mktemp("replay") / "record.db"
    user = KeyPair.generate()
    log = Log.open(store_path, appliance_key=KeyPair.generate())
    upstream = FakeUpstream()
    upstream.queue = [
        Script(chunks=[json.dumps(TOOL_REPLY).encode()]),
        Script(chunks=[FINAL]),
        Script(chunks=[EVENTS], content_type="text/event-stream"),
    ]
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, inject_clock=True, engine_extensions=True)
        with ProxyServer(config, log, env=ENV) as proxy:
            opened = proxy.registry.open_session([user.recipient], {}, {"seed": 7})
            session = proxy.registry.get(opened.session_id)
            assert session is not None
            auth = {"authorization": f"Bearer {opened.token}"}
            ask = [{"role": "user", "content": "look it up"}]
            first = httpx.post(
                f"{opened.openai_base_url}/chat/completions",
                json={"model": "m", "messages": ask},
                headers=auth,
            )
            first.raise_for_status()
            body = first.json()
            derived = body["choices"][0]["message"]["tool_calls"][0]["id"]
            assert derived != UPSTREAM_IDS[0]
            arguments = canonical_json({"q": "x"})
            tools = ToolCalls(log)
            named = NamedReply(body["affidavit"]["seq"], derived)
            tool_ask = ToolAsk("srv", "lookup", arguments, named, False)
            result = b'{"content":[{"type":"text","text":"42"}]}'

            async def tool() -> None:
                call_seq = await tools.admit(session, tool_ask)
                await tools.result(session, call_seq, "COMMITTED", result_bytes=result)

            asyncio.run(tool())
            assistant = body["choices"][0]["message"]
            follow = [*ask, assistant, {"role": "tool", "tool_call_id": derived, "content": "42"}]
            second = httpx.post(
                f"{opened.openai_base_url}/chat/completions",
                json={"model": "m", "messages": follow},
                headers=auth,
            )
            second.raise_for_status()
            third = httpx.post(
                f"{opened.anthropic_base_url}/v1/messages",
                json={"model": "claude", "max_tokens": 5, "stream": True, "messages": ask},
                headers={"x-api-key": opened.token},
            )
            third.raise_for_status()
            sent_up = json.loads(upstream.received[1].body)
            assert sent_up["messages"][2]["tool_calls"][0]["id"] == UPSTREAM_IDS[0]
            assert b"Current date and time" in upstream.received[0].body
            delivered = [_plain(first.content), _plain(second.content), EVENTS]
    assert not upstream.errors, upstream.errors
    log.close()
    yield Recorded(store_path, opened.session_id, user, delivered, result)


RECONSTRUCT = r"""
import asyncio, json, sys
from egress_proxy.replay import reconstruct_pipeline
from record.seal import KeyPair

store, stream, key_path = sys.argv[1:4]
recon = reconstruct_pipeline(store, stream, KeyPair.read(__import__("pathlib").Path(key_path)))

async def main():
    bodies = []
    for raw in recon.recorded_inputs():
        reply, body = await recon.run(raw)
        bodies.append(body.hex())
    tool = recon.transport.tool_result("srv", "lookup", b'{"q":"x"}')
    return bodies, tool

bodies, tool = asyncio.run(main())
print(json.dumps({
    "bodies": bodies,
    "served": recon.transport.index.served,
    "recorded": len(recon.transport.index.calls),
    "keys": [c.body.content_key for c in recon.plan],
    "tool": tool.reply.result_bytes.hex(),
    "network": "egress_proxy.transports.network" in sys.modules,
    "httpx": "httpx" in sys.modules,
}))
"""


def _file_digests(store_path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store_path.parent.iterdir())
    }


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("isolate", ["unshare-n", "plain"])
def test_reconstruct_serves_the_whole_sequence_with_no_network(
    recorded: Recorded, tmp_path: Path, isolate: str
) -> None:
    if isolate == "unshare-n" and not _can_unshare():
        pytest.skip("`unshare -n` is not permitted here (needs root or user namespaces)")
    key_path = tmp_path / "user.pem"
    recorded.user.write(key_path)
    before = _file_digests(recorded.store_path)
    argv = [sys.executable, "-c", RECONSTRUCT, str(recorded.store_path), recorded.stream]
    argv.append(str(key_path))
    if isolate == "unshare-n":
        argv = ["unshare", "-n", *argv]
    done = subprocess.run(
        argv, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr.decode()
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["network"] is False
    assert out["recorded"] == out["served"] == 4  # three model calls and one tool call
    bodies = [bytes.fromhex(b) for b in out["bodies"]]
    assert [_plain(b) for b in bodies[:2]] == recorded.delivered[:2]
    assert bodies[2] == recorded.delivered[2]
    assert bytes.fromhex(out["tool"]) == recorded.tool_result
    # Wrote nothing: the store's bytes are unchanged. A SQLite reader of a WAL database may
    # leave an empty ``-wal`` and a ``-shm`` index beside it; neither holds an entry.
    after = _file_digests(recorded.store_path)
    assert after["record.db"] == before["record.db"]
    wal = recorded.store_path.with_name("record.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_the_reconstruct_entry_point_never_imports_the_network_transport() -> None:
    code = (
        "import sys, egress_proxy.replay, egress_proxy.transports.recorded;"
        "print('egress_proxy.transports.network' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip() == b"False"


def test_a_changed_request_is_a_replay_miss_with_the_nearest_call(recorded: Recorded) -> None:
    recon = reconstruct_pipeline(recorded.store_path, recorded.stream, recorded.user)
    first = json.loads(recon.recorded_inputs()[0])
    first["messages"][0]["content"] = "look it up, please"
    with pytest.raises(ReplayMiss) as caught:
        asyncio.run(recon.run(json.dumps(first).encode()))
    miss = caught.value
    assert (miss.code, miss.status) == ("replay_miss", 409)
    assert isinstance(miss.nearest, RecordedCall) and miss.nearest.seq == recon.plan[0].seq
    assert '-   "content": "look it up",' in miss.diff
    assert '+   "content": "look it up, please",' in miss.diff
    error = json.loads(miss.body())["error"]
    assert error["code"] == "replay_miss" and error["nearest"]["seq"] == recon.plan[0].seq
    assert len(recon.transport.calls) == 1 and recon.transport.index.served == 0


def test_a_tool_call_not_recorded_is_a_miss(recorded: Recorded) -> None:
    recon = reconstruct_pipeline(recorded.store_path, recorded.stream, recorded.user)
    with pytest.raises(ReplayMiss) as caught:
        recon.transport.tool_result("srv", "lookup", canonical_json({"q": "y"}))
    assert caught.value.nearest is not None
    assert '- "q": "x"' in caught.value.diff and '+ "q": "y"' in caught.value.diff
    served = recon.transport.tool_result("srv", "lookup", canonical_json({"q": "x"}))
    assert served.reply is not None
    with pytest.raises(ReplayMiss) as again:  # its one recorded answer is used up
        recon.transport.tool_result("srv", "lookup", canonical_json({"q": "x"}))
    assert again.value.diff == "the same bytes; its 1 recorded answer is served already\n"


@pytest.mark.parametrize("rule", ["prepend", "fold"])
def test_a_record_is_rebuilt_under_the_clock_rule_it_was_written_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """A record written under either rule (``prepend`` is what every record before
    ``clock_rule`` used) regenerates its request bytes: reconstruct applies the recorded
    rule, not today's."""
    import functools

    import egress_proxy.app as app_module
    from egress_proxy.replay import read_stream
    from record.schema import ModelRequest

    monkeypatch.setattr(
        app_module, "Upstream", functools.partial(app_module.Upstream, clock_rule=rule)
    )
    store_path, user = tmp_path / "record.db", KeyPair.generate()
    log = Log.open(store_path, appliance_key=KeyPair.generate())
    upstream = FakeUpstream()
    upstream.queue = [Script(chunks=[FINAL])]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, inject_clock=True, engine_extensions=True)
        with ProxyServer(config, log, env=ENV) as proxy:
            opened = proxy.registry.open_session([user.recipient], {}, {"seed": 7})
            httpx.post(
                f"{opened.openai_base_url}/chat/completions",
                json={"model": "m", "messages": messages},
                headers={"authorization": f"Bearer {opened.token}"},
            ).raise_for_status()
    log.close()
    sent = json.loads(upstream.received[0].body)["messages"]
    assert [m["role"] for m in sent] == (
        ["system", "system", "user"] if rule == "prepend" else ["system", "user"]
    )
    (request,) = [
        b
        for _, b in read_stream(store_path, opened.session_id, user)
        if isinstance(b, ModelRequest)
    ]
    assert request.clock_rule == rule
    recon = reconstruct_pipeline(store_path, opened.session_id, user)

    async def rebuild() -> None:
        for raw in recon.recorded_inputs():
            await recon.run(raw)

    asyncio.run(rebuild())
    assert recon.transport.index.served == 1  # the same content key: the same bytes


@pytest.mark.parametrize("rule", ["prepend", "fold"])
def test_a_messages_record_is_rebuilt_under_the_clock_rule_it_was_written_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """The same for Anthropic's Messages API: ``prepend`` put the clock in a text block of its
    own, ``fold`` folds it into a string ``system``; each record rebuilds under its rule."""
    import functools

    import egress_proxy.app as app_module
    from egress_proxy.replay import read_stream
    from record.schema import ModelRequest

    monkeypatch.setattr(
        app_module, "Upstream", functools.partial(app_module.Upstream, clock_rule=rule)
    )
    store_path, user = tmp_path / "record.db", KeyPair.generate()
    log = Log.open(store_path, appliance_key=KeyPair.generate())
    upstream = FakeUpstream()
    upstream.queue = [Script(chunks=[EVENTS], content_type="text/event-stream")]
    ask = {"model": "claude", "max_tokens": 5, "stream": True, "system": "be brief",
           "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, inject_clock=True)
        with ProxyServer(config, log, env=ENV) as proxy:
            opened = proxy.registry.open_session([user.recipient], {}, {"temperature": 0.5})
            httpx.post(
                f"{opened.anthropic_base_url}/v1/messages",
                json=ask,
                headers={"x-api-key": opened.token},
            ).raise_for_status()
    log.close()
    system = json.loads(upstream.received[0].body)["system"]
    if rule == "prepend":
        assert isinstance(system, list) and [b["text"] for b in system][1] == "be brief"
    else:
        assert isinstance(system, str) and system.endswith(" (UTC)\n\nbe brief")
    (request,) = [
        b
        for _, b in read_stream(store_path, opened.session_id, user)
        if isinstance(b, ModelRequest)
    ]
    assert request.clock_rule == rule
    recon = reconstruct_pipeline(store_path, opened.session_id, user)

    async def rebuild() -> None:
        for raw in recon.recorded_inputs():
            await recon.run(raw)

    asyncio.run(rebuild())
    assert recon.transport.index.served == 1  # the same content key: the same bytes
