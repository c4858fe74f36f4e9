"""The ``affidavit`` typer app as a whole: every command's ``--help``, and the exit codes.

The command tree is walked from ``typer.main.get_command(app)``, so a command added anywhere
(a part's ``register`` or ``harness.commands``) is covered: ``main([*path, "--help"])``
returns 0 and prints the command's usage line and a help text. ``main`` returns the exit
code rather than raising ``SystemExit``: 2 for a usage error (printed on stderr), 3 for a
file it needs that is missing, and a record error raised by any command maps to its code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

import affidavit.cli
from affidavit.cli import app, build_app, click_command, main
from record.errors import StoreMissing, UnknownStream


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(typer.main.get_command(app)))
PATHS = [path for path, _ in COMMANDS]


def test_the_tree_holds_every_part_s_commands() -> None:
    expected = {
        ("demo",),
        ("probe",),
        ("keys", "new"),
        ("log", "verify"),
        ("log", "export"),
        ("log", "show"),
        ("log", "key"),
        ("log", "checkpoint"),
        ("engine", "make-model"),
        ("engine", "serve"),
        ("engine", "pull"),
    }
    assert expected <= set(PATHS)


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "affidavit" for p in PATHS]
)
def test_help_works_on_every_command(
    path: tuple[str, ...], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: {' '.join(('affidavit', *path))} " in out
    # a one-line help: in the parent's listing, and at the top of its own page
    summary = command.get_short_help_str(limit=200)
    assert summary.strip(), f"{' '.join(path)} has no help"
    assert "\n" not in summary
    assert (command.help or "").split()[0] in out


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "affidavit" for p in PATHS]
)
def test_help_shows_readable_metavars(
    path: tuple[str, ...], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value's placeholder names what to give (``--pin PINS``), never typer's Python type
    (``<list[str]>``, ``<dict[str, Any]>``)."""
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<list[" not in out and "<dict[" not in out, out


LEAVES = [
    (path, command)
    for path, command in _walk(click_command())
    if path and not hasattr(command, "commands")
]


@pytest.mark.parametrize(("path", "command"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_takes_home(
    path: tuple[str, ...], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--home`` on every command, in its help, so a script can pass it to each."""
    assert main([*path, "--home", "somewhere", "--help"]) == 0
    assert "--home" in capsys.readouterr().out


def test_home_changes_nothing_where_no_home_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command that reads no state folder prints the same with and without ``--home``, and
    makes no folder for it."""
    assert main(["attest", "policy", "--show", "--json"]) == 0
    plain = capsys.readouterr().out
    home = tmp_path / "home"
    assert main(["attest", "policy", "--show", "--json", "--home", str(home)]) == 0
    assert capsys.readouterr().out == plain
    assert not home.exists()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"affidavit {version('affidavit')}\n"
    assert "--version" in (main(["--help"]), capsys.readouterr().out)[1]


def test_counts_read_right() -> None:
    from record.cli import counted

    assert [counted(n, "entry", "entries") for n in (0, 1, 2)] == [
        "0 entries",
        "1 entry",
        "2 entries",
    ]
    assert counted(1, "request") == "1 request" and counted(3, "request") == "3 requests"


def test_log_verify_without_a_path_reads_the_home_s_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    assert main(["log", "verify", "--home", str(home)]) == 3
    captured = capsys.readouterr()
    assert f"store {home / 'record.db'} does not exist" in captured.err
    assert captured.out == "" and not home.exists()


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "Usage: affidavit" in capsys.readouterr().err


def test_unknown_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "verify", "record.db", "--bogus"]) == 2
    captured = capsys.readouterr()
    assert "No such option: --bogus" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["log", "frobnicate"],
        ["keys", "new"],
        ["engine", "serve", "--model", "m", "--port", "eighty"],
    ],
    ids=" ".join,
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() != ""


def test_keys_new_writes_the_homes_user_key_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``keys new --home`` makes the key the harness opens that home's sessions with."""
    from harness.session import user_key
    from harness.state import Home

    home = tmp_path / "home"
    assert main(["keys", "new", "--home", str(home)]) == 0
    public = capsys.readouterr().out.strip()
    assert (home / "user.key").stat().st_mode & 0o777 == 0o600
    assert user_key(Home(home)).recipient.text() == public
    assert main(["keys", "new", "--home", str(home)]) == 2  # never over an existing key
    assert "already exists" in capsys.readouterr().err


def test_log_verify_on_a_missing_path_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.db"
    assert main(["log", "verify", str(missing)]) == 3
    captured = capsys.readouterr()
    assert f"affidavit: missing: {missing}" in captured.err
    assert captured.out == ""
    assert not missing.exists()


@pytest.mark.parametrize(
    ("error", "code"), [(StoreMissing("no store"), 3), (UnknownStream("no stream"), 3)]
)
def test_a_record_error_from_any_command_is_its_exit_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    code: int,
) -> None:
    other = build_app()

    @other.command("boom")
    def boom() -> None:
        """Raise a record error."""
        raise error

    monkeypatch.setattr(affidavit.cli, "app", other)
    assert main(["boom"]) == code
    assert str(error) in capsys.readouterr().err


def test_a_command_s_exit_code_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    other = build_app()

    @other.command("exit-4")
    def exit_4() -> None:
        """Exit 4."""
        raise typer.Exit(4)

    @other.command("fine")
    def fine() -> None:
        """Do nothing."""

    monkeypatch.setattr(affidavit.cli, "app", other)
    assert main(["exit-4"]) == 4
    assert main(["fine"]) == 0
