"""#18 line 1: one appliance per home, and every expected condition is one line and its code.

Each command runs against a missing home, a stale home (``appliance.json`` left by a killed
``up``: a dead control socket, a pid that is not running), a bad key file, an unknown
session and an unknown turn; each must print exactly one line on stderr, never a
traceback, and exit with the documented code (3: something missing; 2: a file given that is
not a key). The homes are built from a real appliance (in-process, a provider behind the
proxy that is never called: no engine) and a real record; the second-``up`` refusal runs
real ``affidavit up`` processes, killed with SIGKILL as a crash would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from affidavit.cli import main
from harness.session import open_session, require_turn
from harness.state import Appliance, Home, HomeInUse, HomeLock, TurnUnknown
from harness.up import running_appliance
from record.digest import Domain, digest
from record.schema import TurnEnded, TurnStarted
from record.seal import KeyPair

REPO = Path(__file__).resolve().parents[2]
#: Nothing listens here: the proxy is never asked for a completion in these tests.
PROVIDER = {"api": "openai", "base_url": "http://127.0.0.1:9/v1"}
MODEL = "conditions-model"


@dataclass(frozen=True)
class Homes:
    missing: Path  # never created
    offline: Path  # a stopped appliance's home: record, a session, user.key; nothing running
    stale: Path  # offline + appliance.json and control.sock a killed `up` left (lock free)
    stale_unlocked: Path  # the same without up.lock: only the dead socket says it is gone
    bad_home_key: Path  # offline with a user.key that is not a key
    live: Path  # offline's copy with an appliance running (in this process)
    bad_key: Path  # a key file that is not a key (0600)
    open_key: Path  # a real key readable by others (0644)
    session: str
    dead_pid: int


def _dead_socket(path: Path) -> None:
    """A Unix socket file nobody listens on (connecting is refused), as SIGKILL leaves one."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def _reaped() -> int:
    """The pid of a process that has exited (for the stale home's ``appliance.json``)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Homes]:
    root = tmp_path_factory.mktemp("conditions")
    offline = root / "offline"
    with running_appliance(Home(offline), provider=PROVIDER, model=MODEL):
        session = open_session(Home(offline), None).session_id
    assert not (offline / "appliance.json").exists()  # a clean stop removes what it wrote
    dead_pid = _reaped()
    copies = {}
    for name in ("stale", "stale_unlocked", "bad_home_key", "live"):
        copies[name] = root / name
        shutil.copytree(offline, copies[name])
    for name in ("stale", "stale_unlocked"):
        home = copies[name]
        _dead_socket(home / "control.sock")
        Home(home).write_appliance(
            Appliance(
                proxy_url="http://127.0.0.1:9",
                control_socket=str(home / "control.sock"),
                store=str(home / "record.db"),
                model=MODEL,
                pid=dead_pid,
            )
        )
    assert (copies["stale"] / "up.lock").is_file()  # left by the stopped `up`, and free
    (copies["stale_unlocked"] / "up.lock").unlink()
    (copies["bad_home_key"] / "user.key").write_text("not a key\n")
    bad_key = root / "bad.key"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nnonsense\n-----END PRIVATE KEY-----\n")
    bad_key.chmod(0o600)
    open_key = root / "open.key"
    KeyPair.generate().write(open_key)
    open_key.chmod(0o644)
    with running_appliance(Home(copies["live"]), provider=PROVIDER, model=MODEL):
        yield Homes(
            missing=root / "absent",
            offline=offline,
            stale=copies["stale"],
            stale_unlocked=copies["stale_unlocked"],
            bad_home_key=copies["bad_home_key"],
            live=copies["live"],
            bad_key=bad_key,
            open_key=open_key,
            session=session,
            dead_pid=dead_pid,
        )


# (home, argv: S = the session, K = the bad key file, O = the open key file, D = a fresh
#  folder; expected exit code; what the one line must say)
GONE = "left by a stopped `affidavit up`, pid"
NOT_RUNNING = "no appliance is running on"
NOT_A_KEY = "not a PEM private key"
ROWS: list[tuple[str, list[str], int, str]] = [
    # a missing home: nothing to find, 3
    ("missing", ["session", "new"], 3, NOT_RUNNING),
    ("missing", ["session", "show", "S"], 3, "no session 'S'"),
    ("missing", ["turn", "S", "hello"], 3, "no key"),
    ("missing", ["replay", "S", "0"], 3, "no key"),
    ("missing", ["replay", "S", "0", "--reconstruct"], 3, "no key"),
    ("missing", ["replay", "S", "--calls", "--reconstruct"], 3, "no key"),
    ("missing", ["resume", "S"], 3, "no key"),
    ("missing", ["tools", "list"], 3, NOT_RUNNING),
    ("missing", ["diverge", "--last", "1"], 3, NOT_RUNNING),
    ("missing", ["attest", "collect", "S", "--print-report-data"], 3, NOT_RUNNING),
    ("missing", ["log", "show", "S"], 3, "does not exist"),
    ("missing", ["log", "verify"], 3, "does not exist"),
    ("missing", ["log", "export", "S", "--out", "D"], 3, "does not exist"),
    ("missing", ["log", "key"], 3, "does not exist"),
    ("missing", ["log", "checkpoint", "S"], 3, "does not exist"),
    ("missing", ["panel"], 3, NOT_RUNNING),
    # a stale home: the appliance is gone, said in one line naming the dead pid, 3
    ("stale", ["session", "new"], 3, GONE),
    ("stale", ["turn", "S", "hello"], 3, GONE),
    ("stale", ["replay", "S", "0"], 3, GONE),
    ("stale", ["replay", "S", "--calls"], 3, GONE),
    ("stale", ["resume", "S"], 3, GONE),
    ("stale", ["tools", "list"], 3, GONE),
    ("stale", ["attest", "collect", "S", "--print-report-data"], 3, GONE),
    ("stale", ["session", "new", "--replay-of", "S"], 3, GONE),
    ("stale", ["diverge", "--last", "1"], 3, GONE),
    # no lock file (an appliance.json another writer left): the dead socket says it, 3
    ("stale_unlocked", ["session", "new"], 3, "does not answer"),
    ("stale_unlocked", ["turn", "S", "hello"], 3, "does not answer"),
    ("stale_unlocked", ["replay", "S", "0"], 3, "no turns"),
    # a key file that is not a key: the file given is wrong, 2
    ("offline", ["session", "show", "S", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["turn", "S", "hello", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["replay", "S", "0", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["replay", "S", "0", "--reconstruct", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["replay", "S", "--calls", "--reconstruct", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["resume", "S", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["log", "show", "S", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["log", "verify", "--key", "K"], 2, NOT_A_KEY),
    ("offline", ["session", "show", "S", "--key", "O"], 2, "others could read it"),
    ("offline", ["replay", "S", "0", "--reconstruct", "--key", "O"], 2, "others could read it"),
    ("bad_home_key", ["session", "show", "S"], 2, NOT_A_KEY),
    ("bad_home_key", ["replay", "S", "0", "--reconstruct"], 2, NOT_A_KEY),
    # a key file that is not there: 3
    ("offline", ["session", "show", "S", "--key", "D"], 3, "does not exist"),
    ("offline", ["log", "show", "S", "--key", "D"], 3, "does not exist"),
    # an unknown session: missing, never tampering, 3
    ("offline", ["session", "show", "nope"], 3, "no session 'nope'"),
    ("offline", ["replay", "nope", "0", "--reconstruct"], 3, "no session 'nope'"),
    ("offline", ["replay", "nope", "--calls", "--reconstruct"], 3, "no session 'nope'"),
    ("offline", ["log", "show", "nope"], 3, "no stream 'nope'"),
    ("offline", ["log", "export", "nope", "--out", "D"], 3, "no stream 'nope'"),
    ("live", ["turn", "nope", "hello"], 3, "no session 'nope'"),
    ("live", ["resume", "nope"], 3, "no session 'nope'"),
    ("live", ["replay", "nope", "0"], 3, "no session 'nope'"),
    ("live", ["session", "new", "--replay-of", "nope"], 3, "no session 'nope' to replay"),
    # an unknown turn: 3
    ("offline", ["replay", "S", "5", "--reconstruct"], 3, "has no turns"),
    ("live", ["replay", "S", "5"], 3, "has no turns"),
]


def _argv(row: list[str], homes: Homes, home: Path, scratch: Path) -> list[str]:
    fill = {
        "S": homes.session,
        "K": str(homes.bad_key),
        "O": str(homes.open_key),
        "D": str(scratch / "absent"),
    }
    return [fill.get(arg, arg) for arg in row] + ["--home", str(home)]


def _said(says: str, homes: Homes) -> str:
    return says.replace("'S'", repr(homes.session))


def _row_id(row: tuple[str, list[str], int, str]) -> str:
    return f"{row[0]}:{' '.join(row[1])}"


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_each_condition_is_one_line_and_its_code(
    homes: Homes,
    row: tuple[str, list[str], int, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kind, args, code, says = row
    home = getattr(homes, kind)
    before = _untouched(home)
    assert main(_argv(args, homes, home, tmp_path)) == code
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("affidavit: ") and _said(says, homes) in lines[0], lines[0]
    if kind == "stale":
        assert str(homes.dead_pid) in lines[0]
    assert _untouched(home) == before  # a refusal leaves the home as it was


def _untouched(home: Path) -> dict[str, bytes]:
    """What no command that fails may change: session files, keys, appliance.json."""
    if not home.is_dir():
        return {}
    kept = [home / "user.key", home / "appliance.json", *sorted(home.glob("sessions/*.json"))]
    return {p.name: p.read_bytes() for p in kept if p.is_file()}


SUBPROCESS_ROWS = [
    ROWS[0],  # missing: session new
    next(r for r in ROWS if r[0] == "stale" and r[1][0] == "turn"),
    next(r for r in ROWS if r[0] == "stale_unlocked" and r[1][0] == "session"),
    next(
        r for r in ROWS if r[1][:2] == ["replay", "S"] and "K" in r[1] and "--reconstruct" in r[1]
    ),
    next(r for r in ROWS if r[1][:2] == ["replay", "nope"]),
    next(r for r in ROWS if r[1][:2] == ["log", "show"] and r[0] == "offline" and "nope" in r[1]),
]


@pytest.mark.parametrize("row", SUBPROCESS_ROWS, ids=[_row_id(r) for r in SUBPROCESS_ROWS])
def test_the_program_prints_no_traceback(
    homes: Homes, row: tuple[str, list[str], int, str], tmp_path: Path
) -> None:
    kind, args, code, says = row
    done = _affidavit(*_argv(args, homes, getattr(homes, kind), tmp_path))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    assert len(done.stderr.splitlines()) == 1 and _said(says, homes) in done.stderr, done.stderr


def test_a_turn_the_session_does_not_have_is_named_with_the_turns_it_has() -> None:
    def started(turn: int) -> TurnStarted:
        return TurnStarted(turn=turn, input_bytes=b"hi", input_digest=digest(Domain.INPUT, b"hi"))

    ended = TurnEnded(
        turn=0, outcome="ANSWERED", answer_bytes=b"a", answer_digest=digest(Domain.RESPONSE, b"a")
    )
    bodies = [(1, started(0)), (2, ended), (3, started(1))]
    require_turn(bodies, "s", 1)  # there: nothing raised
    with pytest.raises(TurnUnknown, match=r"no turn 2 \(its turns: 0\.\.1\)"):
        require_turn(bodies, "s", 2)
    with pytest.raises(TurnUnknown, match="has no turns"):
        require_turn([], "s", 0)


# -- one appliance per home --------------------------------------------------------------------


def test_the_home_lock_is_held_by_one_taker_and_free_when_released(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    held = HomeLock.take(home)
    try:
        assert HomeLock.held(home.lock_file)
        with pytest.raises(HomeInUse, match=f"pid {os.getpid()}"):
            HomeLock.take(home)  # another descriptor, even in this process: refused
        with pytest.raises(HomeInUse), running_appliance(home, provider=PROVIDER, model=MODEL):
            pass
    finally:
        held.release()
    assert not HomeLock.held(home.lock_file)
    HomeLock.take(home).release()  # free again: taken at once


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _affidavit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


class _Up:
    """``affidavit up`` as a process in front of a provider it never calls."""

    def __init__(self, home: Path, console: Path) -> None:
        self.console = console
        with console.open("wb") as sink:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "affidavit", "up", "--home", str(home)),
                    *("--provider-url", PROVIDER["base_url"], "--model-name", MODEL),
                ],
                cwd=REPO,
                env=_env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 90
        while b"affidavit is up" not in console.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"affidavit up did not start:\n{console.read_text()}")
            time.sleep(0.05)

    def text(self) -> str:
        return self.console.read_text()


def test_a_second_up_is_refused_and_a_killed_one_is_replaced(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _Up(home, tmp_path / "first.log")
    try:
        url = Appliance.model_validate_json((home / "appliance.json").read_bytes()).proxy_url
        second = _affidavit(
            *("up", "--home", str(home), "--provider-url", PROVIDER["base_url"]),
            *("--model-name", MODEL),
        )
        assert second.returncode == 2, second.stdout + second.stderr
        (line,) = second.stderr.splitlines()
        assert f"pid {first.proc.pid}" in line and url in line, line
        opened = _affidavit("session", "new", "--json", "--home", str(home))
        assert opened.returncode == 0, opened.stderr  # the first still serves, untouched
        session = json.loads(opened.stdout)["session"]
    finally:
        first.proc.send_signal(signal.SIGKILL)  # a crash: nothing cleaned up
        first.proc.wait(30)
    kept = {p: p.read_bytes() for p in (home / "sessions").glob("*.json")}
    kept[home / "user.key"] = (home / "user.key").read_bytes()
    assert (home / "appliance.json").is_file() and (home / "control.sock").exists()

    gone = _affidavit("session", "new", "--home", str(home))
    assert gone.returncode == 3 and "Traceback" not in gone.stderr, gone.stderr
    assert gone.stderr.strip() == (
        f"affidavit: missing: no appliance is running on {home} (left by a stopped "
        f"`affidavit up`, pid {first.proc.pid}): run `affidavit up`"
    )

    third = _Up(home, tmp_path / "third.log")
    try:
        replaced = [line for line in third.text().splitlines() if "replacing" in line]
        assert replaced == [
            f"replacing the appliance.json and control.sock a stopped `affidavit up` "
            f"(pid {first.proc.pid}) left in {home}"
        ]
        shown = _affidavit("session", "show", session, "--json", "--home", str(home))
        assert shown.returncode == 0, shown.stderr  # the record and the session survive
        assert {p: p.read_bytes() for p in kept} == kept
    finally:
        third.proc.send_signal(signal.SIGINT)
        third.proc.wait(60)
    assert third.proc.returncode == 0, third.text()
    assert not (home / "appliance.json").exists()  # it removed what it wrote
    assert {p: p.read_bytes() for p in kept} == kept
