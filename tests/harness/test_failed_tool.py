"""A tool call that surely did not happen is ``FAILED`` with its reason (#18, acceptance line 5).

A real appliance (the tiny engine, the egress proxy, the control plane) whose search endpoint
is a loopback port nothing listens on: the turn's forced ``web_search`` is recorded
``FAILED`` (``upstream_unreachable``: no connection opened, so not a byte was sent), the model
is told and answers, and the turn ends ``ANSWERED`` rather than stopping for a decision (what an
``UNKNOWN`` outcome would ask). ``turn`` prints why the call failed, ``--json`` carries it in
``tool_errors``, and ``session show`` and ``replay`` (re-executed and reconstructed) count the
same one tool call.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("torch", reason="the appliance runs the embedded engine (`engine` extra)")
pytest.importorskip("openai", reason="the harness drives turns with the openai client")

from affidavit.cli import main
from harness.agent import TurnPolicy
from harness.session import open_session, read_bodies, user_key
from harness.state import Home
from harness.up import TINY_MODEL, running_appliance
from record.cli import home_store
from record.schema import FetchResponse
from tests.egress_proxy.test_fetch import _closed_port
from tests.harness.rig import CLOCK, PINS, named

POLICY = TurnPolicy(3, (named("web_search"), "none"))


@dataclass(frozen=True)
class Turned:
    home: Home
    session: str
    code: int
    out: str
    search_url: str

    @property
    def at(self) -> list[str]:
        return ["--home", str(self.home.root)]


@pytest.fixture(scope="module")
def turned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Turned]:
    """One turn through ``affidavit turn`` on an appliance whose search endpoint is dark;
    the appliance stays up for the replay."""
    home = Home(tmp_path_factory.mktemp("failed-tool") / "home")
    search = f"http://127.0.0.1:{_closed_port()}/search?q={{query}}"
    with running_appliance(
        home, engine=TINY_MODEL, search_url=search, fetch_allow=("127.0.0.1/32",), clock=CLOCK
    ):
        session = open_session(home, PINS, policy=POLICY).session_id
        out = io.StringIO()  # capsys is per test: the module's one turn is captured by hand
        with contextlib.redirect_stdout(out):
            code = main(["turn", session, "What does the web say?", *["--home", str(home.root)]])
        yield Turned(home, session, code, out.getvalue(), search)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_turn_goes_on_and_prints_why_the_call_failed(turned: Turned) -> None:
    assert turned.code == 0, turned.out
    lines = turned.out.splitlines()
    step = next(line for line in lines if line.startswith("  step 0 "))
    assert "web_search(" in step and step.endswith("FAILED")
    why = lines[lines.index(step) + 1]
    host = turned.search_url.split("/")[2]
    assert why.startswith("    web_search failed: fetch failed: 502 upstream_unreachable: ")
    assert host in why and "ConnectError" in why
    assert "turn 0: ANSWERED" in lines
    assert not any("NEEDS_DECISION" in line or "resume" in line for line in lines)


def test_json_carries_the_reason_in_call_order(
    turned: Turned, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same turn's record, re-executed on the live appliance, as one JSON document: the
    reasons are read back from the record, not kept from the live call."""
    code, out, err = _run(capsys, "replay", turned.session, "0", *turned.at)
    assert code == 0, err
    assert "1 tool result replayed from the record" in out, out
    code, out, err = _run(capsys, "session", "show", turned.session, *turned.at, "--json")
    assert code == 0, err
    turns = json.loads(out)["turns"]
    assert [(t["outcome"], t["tool_calls"]) for t in turns] == [("ANSWERED", 1)]


def test_session_show_and_reconstruct_count_the_same_call(
    turned: Turned, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "session", "show", turned.session, *turned.at)
    assert code == 0, err
    assert " 1 tool call " in out, out
    code, out, err = _run(capsys, "replay", turned.session, "0", "--reconstruct", *turned.at)
    assert code == 0, err
    assert out.splitlines()[-1].endswith(
        ": reconstructed exactly: 2 requests, 1 tool result and the final answer, byte for byte"
    ), out


def test_the_record_holds_the_reason(turned: Turned) -> None:
    bodies = read_bodies(home_store(turned.home.root), turned.session, user_key(turned.home))
    fetched = [b for _, b in bodies if isinstance(b, FetchResponse)]
    assert [f.outcome for f in fetched] == ["FAILED"]
    assert fetched[0].error_bytes is not None
    error = json.loads(fetched[0].error_bytes)["error"]
    assert error["code"] == "upstream_unreachable"
