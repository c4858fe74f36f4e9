"""Ctrl-C during ``affidavit turn`` (#18, acceptance line 3), against a real appliance (the
engine with the tiny model, the egress proxy, the control plane, a loopback web) with the
harness as the real CLI in a subprocess, sent SIGINT once its first model reply is committed.

It exits 130 (the shell's code for SIGINT) with one line on stderr naming where the turn
stopped, as the record tells it, and the exact ``resume`` command (with the ``--home`` it was
given). ``session show`` and ``session list``, text and ``--json`` alike, then say
``interrupted``; the printed command, run as printed, finishes the turn, and both say ``idle``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the appliance runs the embedded engine (`engine` extra)")
pytest.importorskip("openai", reason="the harness drives turns with the openai client")

from harness.agent import TurnPolicy
from harness.session import open_session
from harness.state import Home
from harness.up import RunningAppliance
from tests.harness.rig import PINS, named, web_appliance

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "affidavit"]
#: The CLI as a terminal starts its foreground job: SIGINT at its default. A test run started
#: in the background (``make test &``) has SIGINT ignored; a child inherits that, Python then
#: leaves it ignored, and the Ctrl-C this test sends would never reach the turn.
FOREGROUND = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'affidavit', *sys.argv[1:]])",
]
#: web_search forced at step 0, then words: the turn has a tool step to stop around.
POLICY = TurnPolicy(3, (named("web_search"), "none"))
LINE = re.compile(
    r"^interrupted: turn 0 of session (?P<session>\S+) stopped "
    r"(?:at|after) step [01] \([^)]*\); run: (?P<command>affidavit resume .+)$"
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_HOME"}
    env["AFFIDAVIT_TRACE_PHASES"] = "1"  # the turn prints its phases on stderr
    env["PYTHONPATH"] = str(REPO)
    return env


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAppliance]:
    with web_appliance(Home(tmp_path_factory.mktemp("interrupt") / "home")) as running:
        yield running


def _status(home: Home, session: str) -> tuple[str, str, str, str]:
    """``session show`` and ``session list``, each as text and as JSON: the four statuses."""
    where = ("--home", str(home.root))
    show = _cli("session", "show", session, *where)
    assert show.returncode == 0, show.stderr
    text_show = re.search(r"status (\S+)", show.stdout)
    assert text_show is not None, show.stdout
    shown = _cli("session", "show", session, *where, "--json")
    listed = _cli("session", "list", *where)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(session))
    rows = json.loads(_cli("session", "list", *where, "--json").stdout)
    return (
        text_show.group(1),
        json.loads(shown.stdout)["status"],
        row.split()[1],
        next(r["status"] for r in rows if r["session"] == session),
    )


def test_ctrl_c_says_where_the_turn_stopped_and_how_to_resume(up: RunningAppliance) -> None:
    home = up.home
    session = open_session(home, PINS, policy=POLICY).session_id
    with subprocess.Popen(
        [*FOREGROUND, "turn", session, "What does the web say?", "--home", str(home.root)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        seen = []
        for raw in iter(proc.stderr.readline, ""):
            seen.append(raw.rstrip("\n"))
            if raw.startswith("phase model_committed step=0"):  # step 0 is in the record
                proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
                break
        out, err = proc.communicate(timeout=120)
    lines = [*seen, *err.splitlines()]
    assert proc.returncode == 130, "\n".join(lines)
    said = [line for line in lines if not line.startswith("phase ")]
    assert len(said) == 1, said  # one line, no traceback
    print(said[0])
    match = LINE.match(said[0])
    assert match is not None, said[0]
    assert match["session"] == session
    command = shlex.split(match["command"])
    assert command == ["affidavit", "resume", session, "--home", str(home.root)]
    assert "Traceback" not in err and out == ""

    assert _status(home, session) == ("interrupted",) * 4

    finished = _cli(*command[1:])  # the printed command, as printed
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "turn 0: " in finished.stdout
    assert _status(home, session) == ("idle",) * 4
