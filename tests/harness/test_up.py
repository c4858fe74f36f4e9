"""``affidavit up`` as a real service process, used by the CLI as a user would: open a
pinned session, run a turn, reconstruct it; then SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="`affidavit up` runs the embedded engine (`engine` extra)")

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args, "--home", str(home)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_up_serves_the_cli_and_stops_on_sigterm(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "up", "--model", "tiny", "--home", str(home)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (home / "appliance.json").is_file():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "affidavit up did not come up"
            time.sleep(0.1)
        opened = _cli("session", "new", "--pin", "seed=7,max_tokens=64", "--json", home=home)
        assert opened.returncode == 0, opened.stderr
        session = json.loads(opened.stdout)["session"]
        assert json.loads(opened.stdout)["pins"]["strict_cache"] is True
        turn = _cli("turn", session, "hello", "--json", home=home)
        assert turn.returncode == 0, turn.stdout + turn.stderr
        assert json.loads(turn.stdout)["outcome"] == "ANSWERED"
        shown = _cli("session", "show", session, "--json", home=home)
        assert json.loads(shown.stdout)["turns"][0]["outcome"] == "ANSWERED"
        rebuilt = _cli("replay", session, "0", "--reconstruct", "--json", home=home)
        assert rebuilt.returncode == 0 and json.loads(rebuilt.stdout)["ok"] is True
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert "affidavit is up" in out and "affidavit stopped" in out
    assert not (home / "appliance.json").exists()  # it says it is gone
    assert not (home / "control.sock").exists()
    gone = _cli("session", "new", home=home)
    assert gone.returncode == 3 and "affidavit up" in gone.stderr
