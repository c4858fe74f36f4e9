"""``affidavit diverge`` against a real appliance: the engine with the tiny model, the egress
proxy with its control socket, a loopback page server behind the fetch endpoint, and a
loopback webhook receiver that keeps every page it is sent.

Two turns are recorded once for the module: one in a session pinned with strict cache, one
in a session pinned without it (its re-execution is information only). A clean run must exit
0, post nothing, reconstruct both and find the strict one identical on re-execution. A
reconstruction failure is then planted honestly, by changing the harness code a
reconstruction re-drives (how a tool's answer is put in the conversation): the run must exit 1
and the receiver must get exactly one page naming the stream, the turn and step 1, the first
step whose request carries a tool result.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer

import affidavit.cli
import harness.prompt
from harness import diverge as diverge_module
from harness.agent import TurnPolicy
from harness.diverge import (
    DivergenceRun,
    Selection,
    TurnCheck,
    TurnRef,
    page,
    parse_since,
)
from harness.session import open_session, run_turn
from harness.state import Home
from harness.tools import ToolOutput
from harness.up import TINY_MODEL, running_appliance
from record.cli import UsageError
from tests.egress_proxy.loopback import LoopbackServer, request_body

STRICT = {"seed": 42, "temperature": 0.7, "top_p": 0.95, "max_tokens": 64, "strict_cache": True}
LOOSE = {"seed": 7, "temperature": 0.7, "top_p": 0.95, "max_tokens": 64}  # no strict cache
POLICY = TurnPolicy(4, ("required", "none"))
PAGE = b"<html><body><p>The page says: hello from loopback.</p></body></html>\n"


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


async def page_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The web, on loopback: one page for every GET (``/search?q=…`` included)."""
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]}
    )
    await send({"type": "http.response.body", "body": PAGE})


@dataclass
class Receiver:
    """A webhook receiver: keeps each POST's JSON body."""

    pages: list[dict[str, Any]]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        body = await request_body(receive)
        if scope["method"] == "POST":
            self.pages.append(json.loads(body))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b"{}"})


@dataclass
class Recorded:
    home: Path
    strict: str  # the strict-cache session's stream
    loose: str  # the session pinned without strict cache
    receiver: Receiver
    receiver_url: str


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    pytest.importorskip("torch", reason="the appliance runs the embedded engine (`engine` extra)")
    root = tmp_path_factory.mktemp("diverge") / "home"
    home = Home(root)
    receiver = Receiver([])
    with (
        LoopbackServer(page_app) as web,
        LoopbackServer(receiver) as hook,
        running_appliance(
            home,
            engine=TINY_MODEL,
            search_url=web.url + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),  # the loopback web: refused unless allow-listed
        ),
    ):
        streams = []
        for pins in (STRICT, LOOSE):
            state = open_session(home, pins, policy=POLICY)
            result = run_turn(home, state.session_id, "What does the page say?")
            assert result.outcome == "ANSWERED", result.detail
            assert result.steps[0].completion.tool_calls, "step 0 must call a tool"
            streams.append(state.session_id)
        yield Recorded(root, streams[0], streams[1], receiver, hook.url + "/page")


@pytest.fixture()
def cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``affidavit.cli.main``, with ``diverge`` on the app (until ``harness.commands`` has it)."""
    command = typer.main.get_command(affidavit.cli.app)
    if "diverge" not in getattr(command, "commands", {}):
        app = affidavit.cli.build_app()
        diverge_module.register(app)
        monkeypatch.setattr(affidavit.cli, "app", app)
    return affidavit.cli.main


def _run(cli: Any, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(["diverge", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_clean_run_exits_0_and_pages_nobody(
    recorded: Recorded, cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded.receiver.pages.clear()
    code, out, err = _run(
        cli,
        capsys,
        *("--home", str(recorded.home), "--last", "5", "--json"),
        *("--webhook", recorded.receiver_url),
    )
    assert code == 0, out + err
    assert recorded.receiver.pages == []
    report = json.loads(out)
    assert report["ok"] is True
    assert report["reconstruct_failures"] == 0
    assert report["divergent"] == 0
    by_stream = {t["stream"]: t for t in report["turns"]}
    # replay streams the re-executions wrote are never themselves selected
    assert set(by_stream) == {recorded.strict, recorded.loose}
    strict = by_stream[recorded.strict]
    assert strict["turn"] == 0
    assert strict["strict_cache"] is True
    assert strict["reconstruct"]["ok"] is True
    assert strict["reexecute"]["verdict"] == "identical"
    assert strict["reexecute"]["information_only"] is False
    assert strict["reexecute"]["steps"] == strict["reexecute"]["steps_identical"] == 2
    loose = by_stream[recorded.loose]
    assert loose["strict_cache"] is False
    assert loose["reconstruct"]["ok"] is True
    assert loose["reexecute"]["information_only"] is True
    assert "[1/2]" in err and "[2/2]" in err  # progress on stderr


def test_the_text_report_and_since(
    recorded: Recorded, cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(cli, capsys, "--home", str(recorded.home), "--since", "2000-01-01")
    assert code == 0, out + err
    lines = out.splitlines()
    assert f"{recorded.strict} turn 0: reconstruct ok · re-execute identical" in lines
    assert any(
        line.startswith(f"{recorded.loose} turn 0: reconstruct ok · re-execute information only")
        for line in lines
    )
    assert lines[-1].startswith("2 turns checked: 0 reconstruction failures")
    code, out, _ = _run(
        cli, capsys, "--home", str(recorded.home), "--since", "2999-01-01T00:00:00Z"
    )
    assert code == 0
    assert out.splitlines()[0] == "no finished turns to check"
    code, _, err = _run(cli, capsys, "--home", str(recorded.home), "--since", "last week")
    assert code == 2 and "--since" in err


def _render_differently(call_id: str, output: ToolOutput) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "Tool said: " + output.text}


def test_a_reconstruction_failure_exits_1_and_sends_one_page(
    recorded: Recorded,
    cli: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness.prompt, "tool_message", _render_differently)
    recorded.receiver.pages.clear()
    code, out, err = _run(
        cli,
        capsys,
        *("--home", str(recorded.home), "--last", "5", "--json"),
        *("--webhook", recorded.receiver_url),
    )
    assert code == 1, out + err
    assert "Traceback" not in err
    report = json.loads(out)
    assert report["ok"] is False
    assert report["reconstruct_failures"] == 2  # both turns put a tool result in step 1
    assert report["page"] == {"sent": True, "error": None}
    assert len(recorded.receiver.pages) == 1
    sent = recorded.receiver.pages[0]
    assert set(sent) == {"title", "text", "failures", "host", "at"}
    assert sent["host"] == socket.gethostname()
    datetime.fromisoformat(sent["at"])
    assert "2 reconstruction failures" in sent["title"]
    named = {(f["stream"], f["turn"], f["step"]) for f in sent["failures"]}
    assert (recorded.strict, 0, 1) in named
    strict = next(f for f in sent["failures"] if f["stream"] == recorded.strict)
    assert isinstance(strict["seq"], int) and strict["what"].startswith("reconstruct failed")
    assert recorded.strict in sent["text"]
    turn = next(t for t in report["turns"] if t["stream"] == recorded.strict)
    assert turn["reconstruct"]["difference"]["step"] == 1


def test_a_page_that_cannot_be_sent_is_a_problem(
    recorded: Recorded,
    cli: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness.prompt, "tool_message", _render_differently)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/page"  # bound, not listening
        code, out, err = _run(
            cli, capsys, "--home", str(recorded.home), "--last", "1", "--webhook", dead
        )
    assert code == 1
    assert f"the page could not be sent to {dead}" in err
    assert "Traceback" not in err
    assert "reconstruct FAILED (step 1, seq" in out


def test_since_and_last_together_are_a_usage_error(
    tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        cli, capsys, "--home", str(tmp_path), "--since", "2025-01-01", "--last", "3"
    )
    assert code == 2
    assert "--since and --last" in err


def test_a_missing_appliance_exits_3(
    tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "nothing-here"
    code, _, err = _run(cli, capsys, "--home", str(home), "--last", "2")
    assert code == 3
    assert "affidavit up" in err and "Traceback" not in err
    assert not home.exists()  # no user.key made for a home with no appliance


def test_help(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(cli, capsys, "--help")
    assert code == 0
    assert "Usage: affidavit diverge" in out
    for option in ("--since", "--last", "--json", "--webhook", "--max-divergence", "--key"):
        assert option in out


# -- the pieces, without an appliance ------------------------------------------------------------


def test_parse_since() -> None:
    assert parse_since("2025-06-01") == datetime(2025, 6, 1, tzinfo=UTC)
    assert parse_since("2025-06-01T10:00:00+02:00") == datetime(2025, 6, 1, 8, tzinfo=UTC)
    assert parse_since("2025-06-01T08:00:00Z") == datetime(2025, 6, 1, 8, tzinfo=UTC)
    for bad in ("2025-06-01T08:00:00", "yesterday", "2025-13-01"):
        with pytest.raises(UsageError):
            parse_since(bad)


def _check(stream: str, *, strict: bool, identical: bool) -> TurnCheck:
    ref = TurnRef(stream, 0, 2, datetime(2025, 1, 1, tzinfo=UTC))
    steps = [
        {"step": 0, "prompt": "identical", "clock": "identical", "request": "identical"},
        {"step": 1, "prompt": "identical", "clock": "identical", "request": "identical"},
    ]
    steps[0]["reply"] = "identical"
    steps[1]["reply"] = "identical" if identical else "differs"
    check = TurnCheck(ref, strict_cache=strict, reconstruct_ok=True)
    check.reconstruct = {"steps": [{"request_seq": 3}, {"request_seq": 7}]}
    check.reexecute = {
        "identical": identical,
        "recorded_steps": 2,
        "steps": steps,
        "replay_stream": "r-" + stream,
    }
    return check


def test_divergence_fails_only_past_the_maximum() -> None:
    checks = [
        _check("a", strict=True, identical=False),
        _check("b", strict=True, identical=True),
        _check("c", strict=False, identical=False),  # information only: never counted
    ]
    unlimited = DivergenceRun(checks, None, Selection())
    assert unlimited.divergent == 1 and unlimited.ok
    assert (
        checks[0].line() == "a turn 0: reconstruct ok · re-execute differs (1 of 2 steps identical)"
    )
    assert "information only: differs" in checks[2].line()
    assert DivergenceRun(checks, 1, Selection()).ok
    over = DivergenceRun(checks, 0, Selection())
    assert not over.ok and over.divergence_exceeded
    sent = page(over, host="h")
    assert [(f["stream"], f["turn"], f["step"], f["seq"]) for f in sent["failures"]] == [
        ("a", 0, 1, 7)
    ]
    assert "1 divergent turns (maximum 0)" in sent["title"]
