"""An MCP server's answer the record cannot keep as received (#20 hardening, found by an
adversarial review): a number RFC 8785 cannot write (``NaN``, ``1e400``, an integer past
2**53, all of which the SDK reads), nesting past ``record.limits``, or a JSON-RPC error
whose ``data`` holds such a number.

Before, the encoding failed after the ``tool.call`` was durable: the call had no
``tool.result`` until the next start's recovery, and the client got a bare error with no
code. Now each is answered with a JSON-RPC error whose ``data.code`` is
``upstream_reply_invalid`` naming the server and tool, recorded as that call's ``FAILED``
result (the tool answered, so the call is settled and never sent again); the record still
verifies, its readers read it back, and the server goes on answering. Real processes, the
real proxy route.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import mcp_types as types
import pytest

from egress_proxy.server import ProxyServer
from harness.tools import recorded_output
from record.audit import verify_store
from record.log import Log
from record.schema import ToolCall, ToolResult
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, proxy_config
from tests.egress_proxy.tool_rig import committed_reply, meta, rpc

SERVER = Path(__file__).with_name("_mcp_unrecordable_server.py")
UNRECORDABLE = ["bigint", "nan", "inf", "deep", "bad_error"]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("unrecordable")
    server = {"transport": "stdio", "command": sys.executable, "args": [str(SERVER)]}
    servers = {"u": {**server, "timeout_s": 20.0}}  # a lost answer fails the test quickly
    appliance = KeyPair.generate()
    log = Log.open(tmp / "record.db", appliance_key=appliance)
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, mcp_servers=servers)
        with ProxyServer(config, log, env=ENV) as proxy:
            yield Rig(
                upstream, up.url, proxy, log, tmp / "record.db", KeyPair.generate(), appliance
            )
    log.close()


def _results(rig: Rig, stream: str) -> dict[str, ToolResult]:
    bodies = rig.bodies(stream)
    calls = {s: b.call_id for s, (_, b) in bodies.items() if isinstance(b, ToolCall)}
    return {calls[b.call_seq]: b for _, b in bodies.values() if isinstance(b, ToolResult)}


def test_an_answer_the_record_cannot_keep_is_refused_recorded_and_settled(rig: Rig) -> None:
    session = rig.open_session()
    asked = [(tool, f"u__{tool}", {}) for tool in [*UNRECORDABLE, "ok"]]
    seq = committed_reply(rig, session, asked)
    errors = {}
    for tool in UNRECORDABLE:
        params = {"name": tool, "arguments": {}, "_meta": meta(seq, tool)}
        answer = rpc(session, "u", "tools/call", params)
        assert answer.status_code == 200, answer.text
        error = answer.json()["error"]
        assert error["code"] == types.INTERNAL_ERROR, (tool, error)
        assert error["data"] == {"code": "upstream_reply_invalid", "server": "u", "tool": tool}
        assert error["message"].startswith(
            f"upstream_reply_invalid: MCP server 'u' answered tool '{tool}' with "
        ), error
        errors[tool] = error
    assert "'it broke'" in errors["bad_error"]["message"]  # the server's own words are kept

    fine = rpc(
        session, "u", "tools/call", {"name": "ok", "arguments": {}, "_meta": meta(seq, "ok")}
    )
    assert fine.json()["result"]["content"][0]["text"] == "fine"  # the server goes on

    results = _results(rig, session.session_id)
    assert set(results) == {*UNRECORDABLE, "ok"}  # every call has its result, now
    for tool in UNRECORDABLE:
        done = results[tool]
        assert done.outcome == "FAILED", (
            tool,
            done.error_bytes,
        )  # answered: settled, never sent again
        assert done.error_bytes is not None
        assert json.loads(done.error_bytes) == errors[tool]
        assert recorded_output(done).text == f"tool error: {errors[tool]['message']}"
    assert results["ok"].outcome == "COMMITTED"

    report = verify_store(rig.store_path, key=rig.user)
    assert report.ok, report


def test_a_byte_that_is_not_utf8_reads_as_a_replacement_and_the_server_goes_on(rig: Rig) -> None:
    """The SDK decoded a server's output strictly: one byte that is not UTF-8 ended its reader,
    and every request on that process waited out its timeout. Now the byte reads as U+FFFD,
    the call is answered and recorded, and the next call is answered too."""
    session = rig.open_session()
    seq = committed_reply(rig, session, [("b", "u__bad_utf8", {}), ("k", "u__ok", {})])
    bad = rpc(session, "u", "tools/call", {"name": "bad_utf8", "_meta": meta(seq, "b")})
    assert bad.json()["result"]["content"][0]["text"] == "a\ufffdb"
    fine = rpc(session, "u", "tools/call", {"name": "ok", "_meta": meta(seq, "k")})
    assert fine.json()["result"]["content"][0]["text"] == "fine"
    results = _results(rig, session.session_id)
    assert (results["b"].outcome, results["k"].outcome) == ("COMMITTED", "COMMITTED")
