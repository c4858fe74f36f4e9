"""Re-execute end to end: the real embedded engine, a real MCP server, the gRPC control plane.

A pinned session records two model steps (a required tool call, then the answer) and one
tool call on a real streamable-HTTP MCP server reached through a counting TCP forwarder.
``ArmReplay`` over the control socket arms a new session naming that stream; the same client
requests through it go to the engine, its tool call is served from the plan, and every
verdict (``GetVerdicts`` and the recorded ``reproducibility``) says prompt, clock, request
and reply identical, one tool replayed, no live calls. The forwarder accepts no connection
after arming and the MCP server sees no new call.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path
from typing import Any

import openai

from egress_proxy.clock import Clock
from egress_proxy.control import ControlClient
from egress_proxy.replay_plan import VERDICT_KEY
from egress_proxy.server import ProxyServer
from egress_proxy.sessions import REPLAYS_LABEL
from record.log import Log
from record.schema import ModelResponse, ToolResult
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, LoopbackServer, proxy_config, read_bodies
from tests.egress_proxy.tool_rig import Remote, meta, rpc

PINS: dict[str, Any] = {"seed": 4321, "temperature": 0.7, "max_tokens": 24, "strict_cache": True}
#: The remote server's tool, without parameters: the tiny model's call is ``{}``.
PEEK: Any = {"type": "function", "function": {"name": "peek"}}


class Forwarder:
    """A TCP forwarder on its own port: counts accepts and pipes bytes both ways."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            try:
                out = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, out]
            for a, b in ((conn, out), (out, conn)):
                pipe = threading.Thread(target=_pipe, args=(a, b), daemon=True)
                self._threads.append(pipe)
                pipe.start()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)
        with self._lock:
            for conn in self._conns:
                conn.close()
        for pipe in self._threads:
            pipe.join(5)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _episode(session: Any, user_text: str) -> tuple[list[int], Any, str, dict[str, Any]]:
    """Step 0 (a required tool call), the tool through the proxy, step 1 (no tools):
    the two replies' seqs, the tool's JSON-RPC result, its text and the tool call."""
    gpt = openai.OpenAI(base_url=session.base_url + "/v1", api_key=session.token, max_retries=0)
    messages: Any = [{"role": "user", "content": user_text}]
    raw = gpt.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, tools=[PEEK], tool_choice="required"
    )
    first_seq: int = raw.http_response.json()["affidavit"]["seq"]
    message = raw.parse().choices[0].message
    (call,) = message.tool_calls or []
    assert call.type == "function" and call.function.name == "peek"
    arguments = json.loads(call.function.arguments or "{}")
    params = {"name": "peek", "arguments": arguments, "_meta": meta(first_seq, call.id)}
    tool = rpc(session, "remote", "tools/call", params)
    assert tool.status_code == 200, tool.text
    result = tool.json()["result"]
    text: str = result["content"][0]["text"]
    messages.append(message.model_dump(exclude_none=True, include={"role", "tool_calls"}))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    raw = gpt.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, tools=[PEEK], tool_choice="none"
    )
    second_seq: int = raw.http_response.json()["affidavit"]["seq"]
    return [first_seq, second_seq], result, text, {"id": call.id, "arguments": arguments}


def test_an_armed_session_reexecutes_on_the_engine_with_tools_from_the_plan(
    engine_url: str, tmp_path: Path
) -> None:
    user = KeyPair.generate()
    remote = Remote(on_call=lambda name, args, headers: f"peeked {name} {sorted(args)}")
    socket_path = tmp_path / "ctl.sock"
    with LoopbackServer(remote.app()) as far:
        forwarder = Forwarder(int(far.url.rsplit(":", 1)[1]))
        try:
            servers = {"remote": {"transport": "streamable_http", "url": forwarder.url + "/mcp"}}
            config = proxy_config(
                engine_url, inject_clock=True, engine_extensions=True, mcp_servers=servers
            )
            with (
                Log.open(tmp_path / "r.db", appliance_key=KeyPair.generate()) as log,
                ProxyServer(config, log, env=ENV, clock=Clock.system(), control_socket=socket_path),
                ControlClient(socket_path) as control,
            ):
                old = control.open_session([user.recipient], pins=PINS)
                seqs, first, text, call = _episode(old, "peek, please")
                assert len(remote.calls) == 1 and forwarder.accepted >= 1
                accepted, calls = forwarder.accepted, len(remote.calls)

                new = control.open_session([user.recipient], {REPLAYS_LABEL: old.session_id})
                armed = control.arm_replay(new.session_id, old.session_id)
                assert (armed.model_steps, armed.tool_calls) == (2, 1)
                new_seqs, served, served_text, new_call = _episode(new, "peek, please")
                verdicts = control.get_verdicts(new.session_id)
        finally:
            forwarder.close()

    assert served == first and served_text == text and new_call == call
    assert forwarder.accepted == accepted  # not one connection after arming
    assert len(remote.calls) == calls  # and the real tool server saw no new call
    assert verdicts.source_stream == old.session_id
    assert verdicts.tools_replayed == 1 and verdicts.live_calls == 0
    from_grpc = [json.loads(v) for v in verdicts.verdicts_json]
    assert [v["step"] for v in from_grpc] == [0, 1]

    originals = read_bodies(tmp_path / "r.db", old.session_id, user)
    for seq in seqs:  # the recorded run carries no verdict of its own
        original = originals[seq][1]
        assert isinstance(original, ModelResponse)
        assert VERDICT_KEY not in (original.reproducibility or {})
    bodies = {s: b for s, (_, b) in read_bodies(tmp_path / "r.db", new.session_id, user).items()}
    recorded = []
    for seq in new_seqs:
        response = bodies[seq]
        assert isinstance(response, ModelResponse)
        recorded.append((response.reproducibility or {})[VERDICT_KEY])
    assert recorded == from_grpc
    for ordinal, verdict in enumerate(from_grpc):
        assert isinstance(verdict, dict) and verdict["replays"] == old.session_id
        assert verdict["prompt_identical"] and verdict["clock_identical"], verdict
        assert verdict["request_identical"] and verdict["reply_identical"], verdict
        assert verdict["live_calls"] == 0
        assert verdict["tools_replayed"] == ordinal  # step 1 follows the one replayed tool
    (result,) = [b for b in bodies.values() if isinstance(b, ToolResult)]
    assert result.replayed_from is not None and result.outcome == "COMMITTED"
    assert not socket_path.exists()
