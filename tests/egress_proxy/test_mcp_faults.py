"""MCP faults stay with the call and the server that had them, with real processes and the
real proxy route (the test server ``_mcp_hang_server.py`` writes what it receives to a file).

- A ``tools/call`` past its server's ``timeout_s``: the server receives
  ``notifications/cancelled`` for the id of that very request; the client gets HTTP 200 with
  a JSON-RPC error ``REQUEST_TIMEOUT`` (-32001) whose ``data.code`` is ``tool_timeout``
  (the official SDK client raises it as ``MCPError``); the call is recorded ``tool.result``
  ``UNKNOWN`` with that error as ``error_bytes``; the process is stopped (its PID is gone)
  and the next call is answered by a new one.
- One session's open call holds up no other session's call, on a per-session server and on
  a shared one: B's call is answered while A's is still open (an order, not a duration).
- A shared server restarted after a timeout: a call another session still has running on
  the old process finishes there, a new call is answered by a new process meanwhile, and the
  old process is stopped once its last call is done.
- A server that crashes at start: the ``tools/call`` error names it and carries the line it
  wrote on stderr, and the call is recorded ``UNKNOWN`` with that error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from egress_proxy.server import ProxyServer
from record.log import Log
from record.schema import ToolCall, ToolResult
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, proxy_config
from tests.egress_proxy.tool_rig import alive, committed_reply, gone_within, mcp_url, meta, rpc

HANG_SERVER = Path(__file__).with_name("_mcp_hang_server.py")
COUNTER = Path(__file__).with_name("_counter_server.py")
TIMEOUT_S = 2.0  # "hang": a call is cut quickly
SHARED_TIMEOUT_S = 10.0  # "hang-shared": room for another session's call around a restart
CRASH_LINE = "boom: no API key configured"


@dataclass
class Faults:
    rig: Rig
    logs: Path  # what each hang server's processes received: ``<server>.jsonl``

    def events(self, server: str) -> list[dict[str, Any]]:
        log = self.logs / f"{server}.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def wait_for(self, server: str, what: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first event of ``server``'s that ``what`` matches, once a process wrote it."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [e for e in self.events(server) if what(e)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no such event in {self.events(server)}")


def _call_of(
    tool: str, arguments: dict[str, Any] | None = None
) -> Callable[[dict[str, Any]], bool]:
    def match(event: dict[str, Any]) -> bool:
        return (
            event["event"] == "call"
            and event["tool"] == tool
            and (arguments is None or event["arguments"] == arguments)
        )

    return match


def _servers(logs: Path) -> dict[str, Any]:
    def hang(name: str, **knobs: Any) -> dict[str, Any]:
        log = str(logs / f"{name}.jsonl")
        command = {"command": sys.executable, "args": [str(HANG_SERVER)]}
        return {"transport": "stdio", **command, "env": {"FAULT_LOG": log}, **knobs}

    return {
        "hang": hang("hang", timeout_s=TIMEOUT_S),
        "hang-shared": hang("hang-shared", shared=True, timeout_s=SHARED_TIMEOUT_S),
        "slow": hang("slow", timeout_s=120.0),
        "slow-shared": hang("slow-shared", shared=True, timeout_s=120.0),
        "crash": {
            "transport": "stdio",
            "command": sys.executable,
            "args": [str(COUNTER)],
            "env": {"CRASH_AT_START": CRASH_LINE},
        },
    }


@contextmanager
def _rig(tmp: Path) -> Iterator[Faults]:
    store_path = tmp / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, mcp_servers=_servers(tmp))
        with ProxyServer(config, log, env=ENV) as proxy:
            rig = Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
            yield Faults(rig, tmp)
    log.close()


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    with _rig(tmp_path_factory.mktemp("faults")) as faults:
        yield faults


def _params(name: str, arguments: dict[str, Any], m: types.RequestParamsMeta) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "_meta": m}


def _text(answer: Any) -> str:
    body = answer.json()
    assert "result" in body, body
    text: str = body["result"]["content"][0]["text"]
    return text


def _results(rig: Rig, stream: str) -> dict[str, ToolResult]:
    """Each tool call's result in the stream, by the call's ``call_id``."""
    bodies = rig.bodies(stream)
    calls = {s: b.call_id for s, (_, b) in bodies.items() if isinstance(b, ToolCall)}
    return {calls[b.call_seq]: b for _, b in bodies.values() if isinstance(b, ToolResult)}


def _sdk_call(session: Any, server: str, tool: str, m: types.RequestParamsMeta) -> MCPError:
    """One ``tools/call`` through the official SDK client; the ``MCPError`` it raises."""

    async def go() -> MCPError:
        auth = {"authorization": f"Bearer {session.token}"}
        async with (
            httpx2.AsyncClient(headers=auth, timeout=120) as http,
            streamable_http_client(mcp_url(session, server), http_client=http) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            params = types.CallToolRequestParams(name=tool, arguments={}, _meta=m)
            try:
                await client.send_request(
                    types.CallToolRequest(params=params), types.CallToolResult
                )
            except MCPError as exc:
                return exc
        raise AssertionError("the call was answered")

    return anyio.run(go)


def test_a_call_past_its_timeout_is_cancelled_recorded_and_its_server_restarted(
    faults: Faults,
) -> None:
    rig = faults.rig
    session = rig.open_session()
    asked = [("p1", "hang__pid", {}), ("h", "hang__hang", {}), ("p2", "hang__pid", {})]
    seq = committed_reply(rig, session, list(asked))
    before = int(_text(rpc(session, "hang", "tools/call", _params("pid", {}, meta(seq, "p1")))))

    answer = rpc(session, "hang", "tools/call", _params("hang", {}, meta(seq, "h")))
    assert answer.status_code == 200
    error = answer.json()["error"]
    assert error["code"] == types.REQUEST_TIMEOUT
    assert error["data"] == {
        "code": "tool_timeout",
        "server": "hang",
        "tool": "hang",
        "timeout_s": TIMEOUT_S,
    }
    assert error["message"].startswith("tool_timeout: MCP server 'hang': tool 'hang'")

    # the server was told to stop that very request
    call = faults.wait_for("hang", lambda e: _call_of("hang")(e) and e["pid"] == before)
    cancelled = faults.wait_for("hang", lambda e: e["event"] == "received" and e["pid"] == before)
    assert cancelled["method"] == "notifications/cancelled"
    assert cancelled["params"]["requestId"] == call["id"]

    done = _results(rig, session.session_id)["h"]
    assert done.outcome == "UNKNOWN"  # the tool may have acted before it was cut
    assert done.error_bytes is not None and json.loads(done.error_bytes) == error

    assert gone_within(before, 30), f"the hung process {before} was not stopped"
    after = int(_text(rpc(session, "hang", "tools/call", _params("pid", {}, meta(seq, "p2")))))
    assert after != before
    assert _results(rig, session.session_id)["p2"].outcome == "COMMITTED"


@pytest.mark.parametrize("server", ["slow", "slow-shared"])
def test_one_sessions_open_call_holds_up_no_other_sessions_call(
    faults: Faults, server: str, tmp_path: Path
) -> None:
    rig = faults.rig
    one, two = rig.open_session(), rig.open_session()
    gate = {"path": str(tmp_path / "gate")}
    seq_one = committed_reply(rig, one, [("w", f"{server}__wait_for", gate)])
    seq_two = committed_reply(rig, two, [("p", f"{server}__pid", {})])
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            rpc, one, server, "tools/call", _params("wait_for", gate, meta(seq_one, "w"))
        )
        started = faults.wait_for(server, _call_of("wait_for", gate))
        answered = rpc(two, server, "tools/call", _params("pid", {}, meta(seq_two, "p")))
        open_then = not held.done()
        Path(gate["path"]).touch()
        released = held.result(timeout=60)
    assert int(_text(answered)) > 0
    assert open_then, "the other session's call waited for this one"
    assert int(_text(released)) == started["pid"]
    assert (started["pid"] == int(_text(answered))) is (server == "slow-shared")


def test_a_shared_server_restarted_after_a_timeout_lets_running_calls_finish(
    faults: Faults, tmp_path: Path
) -> None:
    rig = faults.rig
    a, b, c = rig.open_session(), rig.open_session(), rig.open_session()
    gate = {"path": str(tmp_path / "gate")}
    seq_a = committed_reply(rig, a, [("h", "hang-shared__hang", {})])
    seq_b = committed_reply(rig, b, [("w", "hang-shared__wait_for", gate)])
    seq_c = committed_reply(rig, c, [("p", "hang-shared__pid", {})])
    with ThreadPoolExecutor(2) as pool:
        hung = pool.submit(_sdk_call, a, "hang-shared", "hang", meta(seq_a, "h"))
        old_pid = faults.wait_for("hang-shared", _call_of("hang"))["pid"]
        # B's call starts well after A's, so it is still within its own timeout after A's ends
        time.sleep(SHARED_TIMEOUT_S / 2)
        held = pool.submit(
            rpc, b, "hang-shared", "tools/call", _params("wait_for", gate, meta(seq_b, "w"))
        )
        b_started = faults.wait_for("hang-shared", _call_of("wait_for", gate))
        error = hung.result(timeout=60)
        b_open_after_restart = not held.done()
        new_pid = int(
            _text(rpc(c, "hang-shared", "tools/call", _params("pid", {}, meta(seq_c, "p"))))
        )
        b_open_after_new_call = not held.done()
        old_kept = alive(old_pid)
        Path(gate["path"]).touch()
        released = held.result(timeout=60)
    assert error.code == types.REQUEST_TIMEOUT
    assert isinstance(error.error.data, dict) and error.error.data["code"] == "tool_timeout"
    assert b_started["pid"] == old_pid  # B's call ran on the process A's call hung
    assert b_open_after_restart and b_open_after_new_call
    assert new_pid != old_pid  # a new call went to a fresh process while B's still ran
    assert old_kept, "the old process was stopped under another session's running call"
    assert int(_text(released)) == old_pid  # B's call finished where it started
    assert _results(rig, b.session_id)["w"].outcome == "COMMITTED"
    assert _results(rig, a.session_id)["h"].outcome == "UNKNOWN"
    assert gone_within(old_pid, 30), "the retired process outlived its last call"


def test_a_server_that_crashes_at_start_is_named_with_what_it_said(faults: Faults) -> None:
    rig = faults.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, [("x", "crash__bump", {})])
    answer = rpc(session, "crash", "tools/call", _params("bump", {}, meta(seq, "x")))
    error = answer.json()["error"]
    assert error["data"]["code"] == "upstream_unavailable"
    assert error["message"].startswith("upstream_unavailable: MCP server 'crash': ")
    assert CRASH_LINE in error["message"]
    done = _results(rig, session.session_id)["x"]
    assert done.outcome == "UNKNOWN"
    assert done.error_bytes is not None and json.loads(done.error_bytes) == error
