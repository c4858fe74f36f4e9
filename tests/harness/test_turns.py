"""The harness against the real appliance (engine, egress proxy, control plane, MCP servers
spawned by the proxy, a loopback web whose page changes on every fetch): a live pinned turn
with tool calls, its reconstruction (in-process, no network, under ``unshare -n`` too), a
planted change in prompt building caught at the right step, its re-execution with every
step identical and the engine asked exactly once per step, and a negative control."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the harness tests run the embedded engine (`engine` extra)")

from affidavit.cli import main
from harness import prompt as prompt_module
from harness.agent import TurnPolicy
from harness.reconstruct import reconstruct_turn
from harness.reexecute import reexecute_turn
from harness.session import open_session, read_bodies, run_turn
from record.schema import (
    FetchRequest,
    ModelRequest,
    ModelResponse,
    StreamOpened,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
)
from record.seal import KeyPair
from tests.harness.rig import PINS, Recorded, harness_rig, named

REPO = Path(__file__).resolve().parents[2]
POLICY = TurnPolicy(
    6,
    (
        named("ledger__append_note"),
        named("time__get_current_time"),
        named("remote__peek"),
        named("web_search"),
        "none",
    ),
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with harness_rig(tmp_path_factory.mktemp("turns")) as rig:
        state = open_session(rig.home, PINS, policy=POLICY)
        result = run_turn(rig.home, state.session_id, "Note this, tell the time, search the web.")
        yield Recorded(rig, state.session_id, KeyPair.read(rig.home.user_key_file), result)


def test_a_live_turn_calls_three_tools_through_the_proxy_and_records_it_in_order(
    recorded: Recorded,
) -> None:
    result = recorded.result
    assert result.outcome == "ANSWERED", result.detail
    names = [c[1] for s in result.steps for c in s.completion.tool_calls]
    assert names == [
        "ledger__append_note",
        "time__get_current_time",
        "remote__peek",
        "web_search",
    ]
    assert len(recorded.rig.remote.calls) == 1  # the remote server, reached by the proxy
    assert recorded.rig.ledger.read_text().count("\n") == 1  # the side effect, once
    assert recorded.rig.web.fetches == 1
    bodies = read_bodies(recorded.store, recorded.session, recorded.key)
    kinds = [b.kind for _, b in bodies]
    assert kinds[:3] == ["stream.opened", "pins.set", "turn.started"]
    assert kinds[-1] == "turn.ended"
    # every tool call comes after the committed reply that asked for it
    reply_of = {b.call_id: b.reply_seq for s, b in bodies if isinstance(b, ToolCall)}
    seqs = {b.call_id: s for s, b in bodies if isinstance(b, ToolCall)}
    assert all(reply_of[c] < seqs[c] for c in seqs)
    calls = [b for _, b in bodies if isinstance(b, ToolCall)]
    assert [(c.server, c.tool, c.idempotent) for c in calls] == [
        ("ledger", "append_note", False),
        ("time", "get_current_time", True),  # mcp-server-time from PyPI, through the proxy
        ("remote", "peek", True),  # a remote streamable-HTTP server, through the proxy
    ]
    assert sum(isinstance(b, FetchRequest) for _, b in bodies) == 1  # web_search via fetch
    steps = [(b.turn, b.step) for _, b in bodies if isinstance(b, ModelRequest)]
    assert steps == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]  # numbered, recorded by the proxy
    started = next(b for _, b in bodies if isinstance(b, TurnStarted))
    assert started.input_bytes == b"Note this, tell the time, search the web."
    ended = next(b for _, b in bodies if isinstance(b, TurnEnded))
    assert ended.answer_bytes == result.answer.encode()
    labels = next(b for _, b in bodies if isinstance(b, StreamOpened)).labels
    assert json.loads(labels["affidavit/policy"])["tool_choice"][4] == "none"
    assert recorded.rig.home.checkpoints(recorded.session), "annotations' checkpoints are kept"


def _store_bytes(store: Path) -> list[str | None]:
    """sha256 of the store and its -wal (None: absent), and whether a -shm exists (a live
    store's readers share that index; its bytes are theirs to update, not the record's)."""
    files = [store, store.with_name(store.name + "-wal")]
    out = [hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None for f in files]
    return [*out, str(store.with_name(store.name + "-shm").exists())]


def test_reconstruct_is_exact_and_touches_no_network_and_writes_nothing(recorded: Recorded) -> None:
    before = _store_bytes(Path(recorded.store)), recorded.rig.web.fetches
    report = reconstruct_turn(recorded.store, recorded.session, 0, recorded.key)
    assert report.ok, report.json()
    assert [s["identical"] for s in report.steps] == [True] * 5 and report.answer_identical
    assert (_store_bytes(Path(recorded.store)), recorded.rig.web.fetches) == before


def test_reconstruct_runs_under_unshare_n_from_the_cli(recorded: Recorded, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    copy = tmp_path / "record.db"
    with sqlite3.connect(recorded.store) as source, sqlite3.connect(copy) as target:
        source.backup(target)  # a consistent copy: the live appliance keeps writing its store
    home = recorded.rig.home.root
    args = [
        "unshare", "-rn", sys.executable, "-m", "affidavit", "replay", recorded.session, "0",
        "--reconstruct", "--store", str(copy), "--home", str(home), "--json",
    ]  # fmt: skip
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True
    probe = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c",
         "import socket; socket.create_connection(('127.0.0.1', 9), 1)"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert probe.returncode != 0  # the namespace really has no network at all


def test_a_planted_change_in_prompt_building_fails_reconstruct_at_step_1(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = prompt_module.tool_message

    def planted(call_id: str, output: Any) -> dict[str, Any]:
        message = real(call_id, output)
        message["content"] = message["content"] + " "  # one byte more
        return message

    monkeypatch.setattr(prompt_module, "tool_message", planted)
    report = reconstruct_turn(recorded.store, recorded.session, 0, recorded.key)
    assert not report.ok
    difference = report.difference
    assert difference is not None and difference.step == 1  # the first request with a result
    bodies = dict(read_bodies(recorded.store, recorded.session, recorded.key))
    assert isinstance(bodies[difference.seq], ModelRequest)  # it names the recorded request
    assert "request differs" in difference.what and difference.diff


def test_reexecute_is_identical_with_zero_live_calls_and_one_engine_request_per_step(
    recorded: Recorded,
) -> None:
    engine = recorded.rig.engine
    admitted = engine.stats()["scheduler"]["admitted"]
    fetches, ledger = recorded.rig.web.fetches, recorded.rig.ledger.read_text()
    lines: list[str] = []
    report = reexecute_turn(
        recorded.rig.home,
        recorded.session,
        0,
        key=recorded.key,
        on_step=lambda v: lines.append(v.line()),
    )
    assert report.identical, report.json()
    assert engine.stats()["scheduler"]["admitted"] - admitted == 5  # one request per step
    assert len(recorded.rig.remote.calls) == 1
    assert report.live_calls == 0 and recorded.rig.web.fetches == fetches
    assert recorded.rig.ledger.read_text() == ledger  # the side effect did not happen again
    assert lines[0] == (
        "Replay of turn 0, step 0: prompt identical · injected clock identical · request "
        "identical · reply identical · 1 tool result replayed from the record · 0 live calls"
    )
    assert [v.tools_replayed for v in report.verdicts] == [1, 1, 1, 1, 0]
    replay = read_bodies(recorded.store, report.replay_stream, recorded.key)
    labels = next(b for _, b in replay if isinstance(b, StreamOpened)).labels
    assert labels["affidavit/replays"] == recorded.session
    assert labels["affidavit/replays-turn"] == "0"
    served = [b for _, b in replay if isinstance(b, ToolResult)]
    assert served and all(b.replayed_from is not None for b in served)


def test_a_different_seed_is_reported_as_reply_differs_and_goes_no_further(
    recorded: Recorded,
) -> None:
    ledger = recorded.rig.ledger.read_text()
    report = reexecute_turn(
        recorded.rig.home, recorded.session, 0, key=recorded.key,
        pins_override={**PINS, "seed": 43},
    )  # fmt: skip
    assert not report.identical
    (verdict,) = report.verdicts  # it stopped at the first differing reply
    assert not verdict.reply and verdict.first_difference is not None
    assert verdict.first_difference["byte"] > 0
    assert verdict.first_difference["recorded_token"] != verdict.first_difference["replayed_token"]
    assert "reply differs" in verdict.line() and "first difference at byte" in verdict.line()
    assert recorded.rig.ledger.read_text() == ledger  # no tool ran on the differing reply
    assert report.stopped.startswith("step 0: the reply differs")


def test_replay_cli_prints_verdicts_and_exits_by_them(
    recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(recorded.rig.home.root)
    assert main(["replay", recorded.session, "0", "--home", home]) == 0
    out = capsys.readouterr().out
    assert out.count("reply identical") == 5 and "identical: 5 of 5 steps" in out
    assert main(["replay", recorded.session, "0", "--home", home, "--pin", "seed=43"]) == 1
    assert "reply differs" in capsys.readouterr().out
    assert main(["replay", recorded.session, "0", "--home", home, "--reconstruct", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    # a turn the record does not hold is missing (3), never a difference (1)
    assert main(["replay", recorded.session, "7", "--home", home, "--reconstruct"]) == 3
    assert "turn 7" in capsys.readouterr().err


def test_session_new_cli_pins_default_draws_a_seed_once_and_records_it(
    recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(recorded.rig.home.root)
    assert main(["session", "new", "--pin", "default", "--home", home, "--json"]) == 0
    opened = json.loads(capsys.readouterr().out)
    pins = opened["pins"]
    assert isinstance(pins["seed"], int) and pins["strict_cache"] is True
    assert pins["temperature"] == 1.0 and pins["top_p"] == 1.0 and pins["max_tokens"] > 0
    assert opened["base_url"].endswith("/s/" + opened["session"])
    bodies = read_bodies(recorded.store, opened["session"], recorded.key)
    assert [b.kind for _, b in bodies] == ["stream.opened", "pins.set"]
    assert bodies[1][1].pins == pins  # type: ignore[attr-defined]
    assert main(["session", "new", "--home", home, "--json"]) == 0  # unpinned: the default
    plain = json.loads(capsys.readouterr().out)
    assert plain["pins"] is None
    assert [b.kind for _, b in read_bodies(recorded.store, plain["session"], recorded.key)] == [
        "stream.opened"
    ]
    assert main(["session", "new", "--pin", "seed=abc", "--home", home]) == 2
    assert main(["session", "new", "--pin", "colour=1", "--home", home]) == 2
    assert main(["session", "show", "nope", "--home", home]) == 3


def test_session_new_cli_takes_a_tool_name_per_step_and_the_turn_calls_it(
    recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(recorded.rig.home.root)
    args = ["session", "new", "--pin", "seed=9,max_tokens=200", "--home", home, "--json"]
    assert main([*args, "--tool-choice", "ledger__count_notes,none"]) == 0
    session = json.loads(capsys.readouterr().out)["session"]
    result = run_turn(recorded.rig.home, session, "How many notes are there?")
    called = [[c[1] for c in s.completion.tool_calls] for s in result.steps]
    assert called == [["ledger__count_notes"], []], result.detail  # forced, then no tool
    assert main([*args, "--tool-choice", "auto,what the"]) == 2  # neither a mode nor a name
    assert "a tool's name" in capsys.readouterr().err


def test_the_harness_connects_to_nothing_but_the_proxy(recorded: Recorded, tmp_path: Path) -> None:
    """A whole live turn run as the CLI under strace: every connect() it makes goes to the
    proxy's data plane or its control socket (the web, the engine and the MCP servers are
    reached only by the proxy)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (the Makefile installs it)")
    rig = recorded.rig
    state = open_session(rig.home, PINS, policy=TurnPolicy(3, (named("web_search"), "none")))
    trace = tmp_path / "connects.txt"
    args = [
        "strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace),
        sys.executable, "-m", "affidavit", "turn", state.session_id, "Search, then answer.",
        "--home", str(rig.home.root),
    ]  # fmt: skip
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [x for x in trace.read_text().splitlines() if "connect(" in x]
    port = int(rig.up.appliance.proxy_url.rsplit(":", 1)[1])
    inet = [x for x in lines if "AF_INET" in x]
    unix = [x for x in lines if "AF_UNIX" in x]
    assert inet and unix, lines  # it did use both planes
    assert all(f"sin_port=htons({port})" in x and "127.0.0.1" in x for x in inet), inet
    assert all(rig.up.appliance.control_socket in x for x in unix), unix
    assert len(inet) + len(unix) == len(lines), lines
    assert rig.web.fetches >= 1  # the web was reached, by the proxy


def test_an_armed_session_answers_fetches_from_the_plan_and_refuses_the_rest(
    recorded: Recorded,
) -> None:
    """The proxy side of re-execute for web tools: a fetch is admitted, in the replay stream
    too, only as a call its re-executed reply asked for; the recorded fetch is then answered
    with the recorded page (the live web has moved on); anything else is 409."""
    import base64

    import httpx

    from egress_proxy.control import ControlClient
    from harness.calls import route_of
    from harness.session import LABEL_SEARCH, labels_of

    rig = recorded.rig
    bodies = read_bodies(recorded.store, recorded.session, recorded.key)
    fetched = next(b for _, b in bodies if isinstance(b, FetchRequest))
    asked_by = next(
        b for s, b in bodies if isinstance(b, ModelResponse) and s == fetched.reply_seq
    )  # the live fetch names the reply whose web_search call it was
    steps = [b for s, b in bodies if isinstance(b, ModelRequest) and s <= asked_by.request_seq]
    search = labels_of(bodies)[LABEL_SEARCH]  # the live session's: web_search is admitted by it
    labels = {"affidavit/replays": recorded.session, LABEL_SEARCH: search}
    with ControlClient(rig.up.appliance.control_socket) as control:
        opened = control.open_session([recorded.key.recipient], labels)
        armed = control.arm_replay(opened.session_id, recorded.session, turn=0)
    assert armed.model_steps == 5 and armed.tool_calls == 4  # 3 MCP calls and 1 fetch
    before = rig.web.fetches
    url = opened.base_url + "/v1/fetch"
    auth = {"authorization": f"Bearer {opened.token}"}
    body = {"method": "GET", "url": fetched.url, "headers": {"user-agent": "affidavit-harness"}}
    with httpx.Client(trust_env=False, timeout=120) as http:
        early = http.post(url, json=body, headers=auth)  # no reply asked for it yet
        for step in steps:  # the recorded model calls, re-executed up to the one that asked
            sent = http.post(
                opened.base_url + route_of(step.provider.endpoint),
                content=step.input_bytes,
                headers={**auth, "content-type": "application/json"},
            )
            assert sent.status_code == 200, sent.text
        served = http.post(url, json=body, headers=auth)
        again = http.post(url, json=body, headers=auth)
        other = http.post(url, json={**body, "url": rig.web_url + "/elsewhere"}, headers=auth)
    assert early.status_code == 409 and early.json()["error"]["code"] == "reply_not_committed"
    assert served.status_code == 200, served.text
    answer = served.json()
    assert answer["affidavit"]["replayed_from"] is not None
    assert base64.b64decode(answer["body"]).startswith(b"page version 0 ")
    assert again.status_code == 409 and again.json()["error"]["code"] == "tool_call_served"
    assert other.status_code == 409 and other.json()["error"]["code"] == "tool_not_asked"
    assert rig.web.fetches == before  # none reached the web


def test_resume_of_an_ended_turn_does_nothing_and_a_decision_nobody_waits_for_is_refused(
    recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(recorded.rig.home.root)
    before = len(read_bodies(recorded.store, recorded.session, recorded.key))
    assert main(["resume", recorded.session, "--home", home, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["detail"] == "nothing to resume"
    assert main(["resume", recorded.session, "--home", home, "--decide", "skip"]) == 2
    assert "not waiting for a decision" in capsys.readouterr().err
    assert main(["resume", recorded.session, "--home", home, "--decide", "maybe"]) == 2
    assert len(read_bodies(recorded.store, recorded.session, recorded.key)) == before


def test_reconstruct_invents_no_key_and_writes_nothing_to_a_fresh_home(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An auditor's machine: a store copy and no state folder. Without --key it is a missing
    input (exit 3), and nothing is created; with the key it reconstructs."""
    copy = tmp_path / "record.db"
    with sqlite3.connect(recorded.store) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    home = tmp_path / "auditor"
    args = ["replay", recorded.session, "0", "--reconstruct", "--store", str(copy)]
    assert main([*args, "--home", str(home)]) == 3
    assert "--key" in capsys.readouterr().err
    assert not home.exists()
    key = recorded.rig.home.user_key_file
    assert main([*args, "--home", str(home), "--key", str(key)]) == 0
    assert not home.exists()
