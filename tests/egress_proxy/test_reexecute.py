"""Re-execute: a replay plan armed on the live proxy serves tool calls from the record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from egress_proxy.replay_plan import VERDICT_KEY
from egress_proxy.sessions import REPLAYS_LABEL
from record.schema import ModelResponse, ToolCall, ToolResult
from tests.egress_proxy.tool_rig import build_tool_rig, committed_reply, meta, rpc


def _call(session: Any, seq: int, arguments: dict[str, Any], call_id: str = "c1") -> Any:
    params = {"name": "peek", "arguments": arguments, "_meta": meta(seq, call_id)}
    return rpc(session, "remote", "tools/call", params)


#: The reply asks for three calls; the live turn made only the first.
ASKED: list[Any] = [
    ("c1", "peek", {"q": 1}),
    ("c2", "peek", {"q": 2}),
    ("c3", "sentinel__peek", {"q": 1}),
]


def test_an_armed_session_serves_tools_from_the_plan_and_judges_each_step(tmp_path: Path) -> None:
    with build_tool_rig(tmp_path) as tools:
        rig = tools.rig
        old = rig.open_session()
        seq = committed_reply(rig, old, ASKED)
        first = _call(old, seq, {"q": 1})
        assert first.status_code == 200, first.text
        assert len(tools.remote.calls) == 1

        registry = rig.proxy.registry
        armed, opened = registry.arm_replay(None, old.session_id, recipients=[rig.user.recipient])
        assert opened is not None and armed.labels[REPLAYS_LABEL] == old.session_id
        new_seq = committed_reply(rig, opened, ASKED)  # the same bytes from the upstream
        served = _call(opened, new_seq, {"q": 1})
        assert served.status_code == 200, served.text
        assert served.json()["result"] == first.json()["result"]
        missed = _call(opened, new_seq, {"q": 2}, "c2")  # asked, but never recorded
        assert missed.status_code == 409
        data = missed.json()["error"]["data"]
        assert data["code"] == "replay_miss" and data["nearest"]["name"] == "peek"
        assert data["diff"]
        assert len(tools.remote.calls) == 1  # the tool upstream was never asked again
        # A tool the plan never saw, on a server that is only a listening socket: a miss,
        # and the socket receives no connection at all.
        params = {"name": "peek", "arguments": {"q": 1}, "_meta": meta(new_seq, "c3")}
        unseen = rpc(opened, "sentinel", "tools/call", params)
        assert unseen.status_code == 409 and unseen.json()["error"]["data"]["code"] == "replay_miss"
        assert tools.sentinel.accepted == 0

        bodies = rig.bodies(opened.session_id)
        results = [b for _, b in bodies.values() if isinstance(b, ToolResult)]
        assert results[0].replayed_from is not None and results[0].outcome == "COMMITTED"
        # the two misses (other arguments; a tool the plan never saw), recorded as refused
        assert [r.outcome for r in results[1:]] == ["FAILED", "FAILED"]
        assert sum(isinstance(b, ToolCall) for _, b in bodies.values()) == 3
        (response,) = [b for _, b in bodies.values() if isinstance(b, ModelResponse)]
        verdict = (response.reproducibility or {})[VERDICT_KEY]
        assert isinstance(verdict, dict)
        assert verdict["prompt_identical"] and verdict["request_identical"]
        assert verdict["reply_identical"] and verdict["clock_identical"]
        assert verdict["live_calls"] == 0
        plan = armed.replay
        assert plan is not None and plan.tools_replayed == 1
        assert json.loads(json.dumps(plan.summary()))["verdicts"][0] == verdict
        assert tools.sentinel.accepted == 0
