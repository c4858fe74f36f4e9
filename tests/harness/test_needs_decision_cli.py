"""``turn`` that ends waiting for a decision prints the exact command that settles it.

Found running the docs: a ``web_search`` whose endpoint never answered (its fetch recorded
``UNKNOWN``, and again after the one retry an idempotent tool gets) ended the turn
``NEEDS_DECISION``, and ``turn`` said "the tool is not idempotent" and printed
``affidavit resume SESSION …`` with the placeholder, not the id. The real tiny engine, proxy
and CLI; the search endpoint reads each request and closes without a word (the request went
out, so its outcome is unknown; a port nothing listens on is a call that surely did not
happen, ``FAILED``: ``test_failed_tool.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the appliance runs the embedded engine (`engine` extra)")

from affidavit.cli import main
from harness.state import Home
from harness.up import TINY_MODEL, running_appliance
from tests.egress_proxy.tool_rig import RawHttpServer
from tests.harness.rig import CLOCK


def test_a_turn_waiting_for_a_decision_prints_the_command_that_settles_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = Home(tmp_path / "home")
    with (
        RawHttpServer(b"") as silent,
        running_appliance(
            home,
            engine=TINY_MODEL,
            search_url=f"http://127.0.0.1:{silent.port}/search?q={{query}}",
            fetch_allow=("127.0.0.1/32",),
            clock=CLOCK,
        ),
    ):
        where = ["--home", str(home.root)]
        opened = ["session", "new", "--pin", "seed=42,max_tokens=64", "--json", *where]
        assert main([*opened, "--tool-choice", "web_search,none"]) == 0
        session = json.loads(capsys.readouterr().out)["session"]
        assert main(["turn", session, "Search the web.", *where]) == 1
        out = capsys.readouterr().out
    assert len(silent.received) == 2  # the call, and the one retry of an idempotent tool
    assert "turn 0: NEEDS_DECISION (web_search: no outcome after a retry)" in out
    assert "is not idempotent" not in out
    assert f"  affidavit resume {session} --home {home.root} --decide retry|skip|abort" in out
