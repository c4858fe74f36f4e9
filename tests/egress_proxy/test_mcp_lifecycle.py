"""The MCP servers' lifecycle at the proxy, with real processes and the real proxy route.

- Each session gets its own stdio server process, started on first use: two sessions bump a
  counter held in the server's memory and each sees only its own bumps; a server marked
  ``shared`` is one process whose state every session sees.
- A process unused for ``idle_timeout_s`` is stopped (its PID is gone, not a zombie), and
  the next use starts a fresh one; no process outlives the proxy.
- A server whose command does not exist, that crashes at start, or that cannot list its
  tools is named in the error
  (``upstream_unavailable``, with what it wrote on stderr), its session records a
  ``tool.unavailable`` entry, and the other servers (ours and ``mcp-server-time`` from PyPI)
  keep working in the same session.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from egress_proxy.server import ProxyServer
from record.log import Log
from record.schema import ToolUnavailable
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, Script, proxy_config
from tests.egress_proxy.tool_rig import alive, gone_within, meta, rpc

COUNTER = Path(__file__).with_name("_counter_server.py")
IDLE_S = 3.0


def _servers() -> dict[str, Any]:
    counter = {"transport": "stdio", "command": sys.executable, "args": [str(COUNTER)]}
    return {
        "counter": counter,  # the default idle timeout: nothing is reaped during a test
        "brief": {**counter, "idle_timeout_s": IDLE_S},
        "shared": {**counter, "shared": True},
        "missing": {"transport": "stdio", "command": "/nonexistent/no-such-mcp-server"},
        "crash": {**counter, "env": {"CRASH_AT_START": "boom: no API key configured"}},
        "nolist": {**counter, "env": {"FAIL_LIST": "cannot list: index not built"}},
        "time": {
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        },
    }


@contextmanager
def _rig(tmp: Path) -> Iterator[Rig]:
    store_path = tmp / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as up:
        config = proxy_config(up.url, mcp_servers=_servers())
        with ProxyServer(config, log, env=ENV) as proxy:
            yield Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
    log.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with _rig(tmp_path_factory.mktemp("lifecycle")) as rig:
        yield rig


def _asked(rig: Rig, session: Any, calls: list[tuple[str, str]]) -> int:
    """A committed model reply that asks for ``calls`` (``(call id, tool)``): its seq."""
    listed = ",".join(
        f'{{"id":"{cid}","type":"function","function":{{"name":"{tool}","arguments":"{{}}"}}}}'
        for cid, tool in calls
    )
    body = (
        '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":'
        '[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",'
        f'"content":null,"tool_calls":[{listed}]}}}}]}}'
    )
    rig.upstream.script = Script(chunks=[body.encode()])
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[])
    seq: int = raw.http_response.json()["affidavit"]["seq"]
    return seq


def _call(rig: Rig, session: Any, server: str, tool: str, call_id: str) -> str:
    seq = _asked(rig, session, [(call_id, tool)])
    params = {"name": tool, "arguments": {}, "_meta": meta(seq, call_id)}
    answer = rpc(session, server, "tools/call", params).json()
    assert "result" in answer, answer
    text: str = answer["result"]["content"][0]["text"]
    return text


def test_each_session_gets_its_own_process_and_state(rig: Rig) -> None:
    one, two = rig.open_session(), rig.open_session()
    assert _call(rig, one, "counter", "bump", "a") == "1"
    assert _call(rig, one, "counter", "bump", "b") == "2"
    assert _call(rig, two, "counter", "bump", "c") == "1"  # one's bumps never reach two
    pid_one, pid_two = (int(_call(rig, s, "counter", "pid", "p")) for s in (one, two))
    assert pid_one != pid_two
    assert alive(pid_one) and alive(pid_two)


def test_a_shared_server_is_one_process_for_every_session(rig: Rig) -> None:
    one, two = rig.open_session(), rig.open_session()
    first = int(_call(rig, one, "shared", "bump", "a"))
    assert _call(rig, two, "shared", "bump", "b") == str(first + 1)  # two sees one's bump
    assert _call(rig, one, "shared", "pid", "p") == _call(rig, two, "shared", "pid", "q")


def test_an_idle_process_is_reaped_and_the_next_use_starts_afresh(rig: Rig) -> None:
    session = rig.open_session()
    long_lived = int(_call(rig, session, "counter", "pid", "c"))
    assert _call(rig, session, "brief", "bump", "a") == "1"
    pid = int(_call(rig, session, "brief", "pid", "p"))
    time.sleep(IDLE_S / 4)
    assert alive(pid)  # not idle long enough yet
    assert gone_within(pid, IDLE_S * 6), f"process {pid} outlived its idle timeout"
    assert alive(long_lived)  # another server's timeout is its own
    assert _call(rig, session, "brief", "bump", "b") == "1"  # a fresh process, fresh state
    assert int(_call(rig, session, "brief", "pid", "q")) != pid


def _unavailable(rig: Rig, stream: str) -> list[ToolUnavailable]:
    return [b for _, b in rig.bodies(stream).values() if isinstance(b, ToolUnavailable)]


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ("missing", "/nonexistent/no-such-mcp-server"),
        ("crash", "boom: no API key configured"),
        ("nolist", "cannot list: index not built"),
    ],
)
def test_a_server_that_cannot_start_or_list_is_named_noted_and_contained(
    rig: Rig, server: str, says: str
) -> None:
    session = rig.open_session()
    answer = rpc(session, server, "tools/list", {}).json()
    error = answer["error"]  # a dead process is seen at once: not a timeout's error
    assert error["data"]["code"] == "upstream_unavailable"
    assert f"MCP server {server!r}" in error["message"]
    assert says in error["message"]
    [note] = _unavailable(rig, session.session_id)
    assert note.server == server and says in note.error
    # the other servers keep working in the same session
    listed = rpc(session, "time", "tools/list", {}).json()["result"]["tools"]
    assert "get_current_time" in {t["name"] for t in listed}
    assert _call(rig, session, "counter", "bump", "a") == "1"
    assert len(_unavailable(rig, session.session_id)) == 1  # working servers leave no note


def test_no_process_outlives_the_proxy(tmp_path: Path) -> None:
    with _rig(tmp_path) as rig:
        sessions = [rig.open_session(), rig.open_session()]
        pids = [int(_call(rig, s, "counter", "pid", "p")) for s in sessions]
        pids.append(int(_call(rig, sessions[0], "shared", "pid", "q")))
        assert all(alive(pid) for pid in pids)
    assert [pid for pid in pids if alive(pid)] == []
