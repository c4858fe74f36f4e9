"""``affidavit up`` as a real service process, used by the CLI as a user would: open a
pinned session, run a turn, reconstruct it; then SIGTERM stops it cleanly.

The engine is a process of its own (#18 line 7), ``affidavit engine serve`` as the appliance
runs it: ``up``'s one child, stopped with it, and gone too when ``up`` is SIGKILLed."""

from __future__ import annotations

import json
import os
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
        [sys.executable, "-m", "affidavit", *args, "--home", str(home)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _started(home: Path) -> subprocess.Popen[str]:
    up = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "up", "--model", "tiny", "--home", str(home)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while _pid_written(home) != up.pid:  # a killed one's file may be there still
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        assert time.monotonic() < deadline, "affidavit up did not come up"
        time.sleep(0.1)
    return up


def _pid_written(home: Path) -> int | None:
    try:
        return int(json.loads((home / "appliance.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _children(pid: int) -> list[tuple[int, list[str]]]:
    """Each child process of ``pid`` with its command line (Linux ``/proc``)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")
            found.append((int(child), [a for a in argv if a]))
    return found


def _gone(pid: int, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # exited; only its reaping is left
            return True
        time.sleep(0.1)
    return False


def _engine_child(up: subprocess.Popen[str]) -> int:
    engines = [(pid, argv) for pid, argv in _children(up.pid) if "engine" in argv]
    assert len(engines) == 1, _children(up.pid)
    pid, argv = engines[0]
    assert argv[argv.index("engine") + 1] == "serve" and "--token-file" in argv, argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1", argv
    return pid


def _listening(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


def test_up_serves_the_cli_and_stops_on_sigterm(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = _started(home)
    try:
        engine = _engine_child(up)
        engine_url = json.loads((home / "appliance.json").read_text())["engine_url"]
        argv = dict(_children(up.pid))[engine]
        # it bound a free port itself (no race with another process for one chosen for it),
        # and the URL up uses is the port that very process listens on
        assert argv[argv.index("--port") + 1] == "0", argv
        assert engine_url.rsplit(":", 1)[1] in {str(p) for p in _listening(engine)}
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
        # the engine answers its token only; `probe --home` finds the URL and the token
        probed = _cli("probe", "--probes", "1", "--batch-sizes", "1,2", "--max-tokens", "4",
                      "--json", home=home)  # fmt: skip
        assert probed.returncode == 0, probed.stdout + probed.stderr
        assert all(row["identical"] == 1 for row in json.loads(probed.stdout)["rows"])
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert _gone(engine), "the engine outlived `affidavit up`"
    assert "affidavit is up" in out and "affidavit stopped" in out
    assert not (home / "appliance.json").exists()  # it says it is gone
    assert not (home / "control.sock").exists()
    gone = _cli("session", "new", home=home)
    assert gone.returncode == 3 and "affidavit up" in gone.stderr
    unprobed = _cli("probe", home=home)
    assert unprobed.returncode == 3 and "run `affidavit up`" in unprobed.stderr


def test_the_engine_does_not_outlive_a_killed_up(tmp_path: Path) -> None:
    """SIGKILL gives ``up`` no chance to stop anything: the engine goes by itself (its
    parent-death signal), so no engine is left holding the model and its port."""
    home = tmp_path / "home"
    up = _started(home)
    engine = _engine_child(up)
    up.kill()
    up.communicate(timeout=60)
    assert _gone(engine), "the engine outlived a SIGKILLed `affidavit up`"
    again = _started(home)  # and the home comes up again, with an engine of its own
    try:
        assert _engine_child(again) != engine
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)
    assert again.returncode == 0


def test_an_engine_tool_with_a_long_stdout_and_stderr_does_not_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``up`` runs ``affidavit engine pull`` and reads its progress from stderr as it comes:
    a child that writes more than a pipe holds to stdout first must not block both."""
    from harness import up

    script = (
        "import sys; sys.stdout.write('x' * 300_000); sys.stdout.flush(); "
        "print('progress 1 of 1', file=sys.stderr)"
    )
    monkeypatch.setattr(up, "_engine_command", lambda *args: [sys.executable, "-c", script])
    assert up._engine_tool("pull", "anything") == "x" * 300_000
    assert capsys.readouterr().err == "progress 1 of 1\n"
