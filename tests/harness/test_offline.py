"""The read-only commands work with no appliance running (#18, acceptance line 4).

A real appliance (what ``affidavit up`` runs: the engine with the tiny model, the egress
proxy, the control plane, a loopback web) records one pinned tool-using turn and stops,
which removes ``appliance.json``. Then, with ``--home`` only: ``session list``, ``session
show``, ``replay --reconstruct``, ``replay --calls --reconstruct``, ``diverge
--reconstruct-only`` and every ``log`` command read the home's store (``record.db`` in it) and
exit 0 with their usual output; ``log`` finds it through ``$AFFIDAVIT_HOME`` too and still
takes ``--store``. ``diverge`` without ``--reconstruct-only`` needs the appliance: 3, naming
the offline way. ``log verify --against`` takes a folder of kept checkpoints, a quoted glob
and several files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the appliance runs the embedded engine (`engine` extra)")
pytest.importorskip("openai", reason="the harness drives turns with the openai client")

from affidavit.cli import main
from harness.agent import TurnPolicy
from harness.session import open_session, run_turn
from harness.state import Home
from record.cli import kept_checkpoint_files
from record.errors import StoreMissing
from tests.harness.rig import PINS, named, web_appliance

POLICY = TurnPolicy(3, (named("web_search"), "none"))


@dataclass(frozen=True)
class Stopped:
    """A home whose ``up`` recorded a turn and stopped."""

    home: Home
    session: str
    answered: int  # model steps the turn recorded

    @property
    def at(self) -> list[str]:
        return ["--home", str(self.home.root)]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stopped]:
    home = Home(tmp_path_factory.mktemp("offline") / "home")
    with web_appliance(home):
        session = open_session(home, PINS, policy=POLICY).session_id
        result = run_turn(home, session, "What does the web say?")
    assert not home.appliance_file.exists()  # the appliance is gone
    assert (home.root / "record.db").is_file()
    yield Stopped(home, session, len(result.steps))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_session_list_and_show(stopped: Stopped, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "session", "list", *stopped.at)
    assert code == 0, err
    assert out.split() == [stopped.session, "idle", "pinned"]

    code, out, err = _run(capsys, "session", "show", stopped.session, *stopped.at)
    assert code == 0, err
    assert f"session {stopped.session}  status idle" in out
    assert f"{stopped.answered} model steps, 1 tool call " in out  # web_search, then words

    code, out, err = _run(capsys, "session", "show", stopped.session, *stopped.at, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["status"] == "idle"
    assert [t["outcome"] for t in doc["turns"]] == ["ANSWERED"]


def test_replay_reconstruct(stopped: Stopped, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "replay", stopped.session, "0", "--reconstruct", *stopped.at)
    assert code == 0, out + err
    assert out.splitlines()[-1] == (
        f"Turn 0 of {stopped.session}: reconstructed exactly: {stopped.answered} requests, "
        "1 tool result and the final answer, byte for byte"
    )

    code, out, err = _run(
        capsys, "replay", stopped.session, "--calls", "--reconstruct", *stopped.at
    )
    assert code == 0, out + err
    assert f"Calls of {stopped.session}:" in out


def test_diverge_reconstruction_pass(stopped: Stopped, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "diverge", "--reconstruct-only", *stopped.at)
    assert code == 0, out + err
    assert f"{stopped.session} turn 0: reconstruct ok · re-execute not run" in out
    assert "1 turn checked: 0 reconstruction failures, re-execution not run" in out

    code, out, err = _run(capsys, "diverge", "--reconstruct-only", *stopped.at, "--json")
    assert code == 0, err
    (turn,) = json.loads(out)["turns"]
    assert turn["reconstruct"]["ok"] is True and turn["reexecute"]["verdict"] == "not run"

    code, out, err = _run(capsys, "diverge", *stopped.at)  # re-execution needs the appliance
    assert code == 3
    assert "--reconstruct-only" in err and "Traceback" not in err


def test_every_log_command_reads_the_home_s_store(
    stopped: Stopped, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = stopped.home.root / "record.db"
    key = str(stopped.home.user_key_file)

    code, out, err = _run(capsys, "log", "verify", *stopped.at, "--key", key)
    assert code == 0, out + err
    assert out.startswith(f"ok: {store}: ") and out.rstrip().endswith("no problem")

    code, out, err = _run(capsys, "log", "show", stopped.session, *stopped.at, "--key", key)
    assert code == 0, err
    assert "turn.started" in out and "turn.ended" in out

    code, out, err = _run(capsys, "log", "key", *stopped.at)
    assert code == 0, err
    vkey = out.strip()
    assert vkey.startswith("affidavit")

    bundle = tmp_path / "bundle"
    code, out, err = _run(
        capsys, "log", "export", stopped.session, *stopped.at, "--out", str(bundle)
    )
    assert code == 0, err
    assert out.startswith("exported ") and (bundle / "entries.jsonl").is_file()

    note = tmp_path / "now.note"
    code, out, err = _run(
        capsys, "log", "checkpoint", stopped.session, *stopped.at, "--out", str(note)
    )
    assert code == 0, err
    assert note.read_text() == out

    # --store still works, and wins over the home
    code, out, err = _run(capsys, "log", "key", "--store", str(store), "--home", str(tmp_path))
    assert (code, out.strip()) == (0, vkey)


def test_log_finds_the_home_through_the_environment(
    stopped: Stopped, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFFIDAVIT_HOME", str(stopped.home.root))
    code, out, err = _run(capsys, "log", "verify")
    assert code == 0, out + err
    assert out.startswith(f"ok: {stopped.home.root / 'record.db'}: ")


def test_a_home_with_no_store_is_missing_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = str(tmp_path / "empty-home")
    for argv in (["log", "verify"], ["log", "key"], ["log", "show", "s"]):
        code, out, err = _run(capsys, *argv, "--home", empty)
        assert code == 3, argv
        assert err.count("\n") == 1 and "record.db does not exist" in err and out == ""


def test_against_takes_a_folder_a_glob_and_several_files(
    stopped: Stopped, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = stopped.home.root / "checkpoints"
    kept = sorted(p for p in folder.rglob("*.note"))
    assert len(kept) >= 2, kept  # the turn's annotations handed back checkpoints
    check = [*stopped.at, "--json", "--against"]

    for against in (
        [str(folder)],
        [f"{folder}/*/*.note"],
        [str(kept[0]), "--against", str(kept[-1])],
    ):
        code, out, err = _run(capsys, "log", "verify", *check, *against)
        assert code == 0, out + err
        assert json.loads(out)["ok"] is True

    assert kept_checkpoint_files([str(folder)]) == kept
    assert kept_checkpoint_files([f"{folder}/*/*.note"]) == kept
    with pytest.raises(StoreMissing, match="nope"):
        kept_checkpoint_files([str(tmp_path / "nope" / "*.note")])


def test_against_fails_on_a_kept_checkpoint_the_log_contradicts(
    stopped: Stopped, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A folder's checkpoints are each held against the log: a forged one among them fails."""
    folder = tmp_path / "kept"
    folder.mkdir()
    good = sorted((stopped.home.root / "checkpoints").rglob("*.note"))[-1]
    lines = good.read_text().split("\n")
    lines[2] = "A" * len(lines[2])  # another root hash for the same tree size
    (folder / "a.note").write_text(good.read_text())
    (folder / "b.note").write_text("\n".join(lines))
    code, out, err = _run(capsys, "log", "verify", *stopped.at, "--json", "--against", str(folder))
    assert code == 1, out + err
    assert json.loads(out)["ok"] is False
