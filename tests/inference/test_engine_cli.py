"""``affidavit engine make-model``: the typer command, its body, and the base install.

``affidavit.cli`` builds the ``affidavit`` app and calls :func:`inference.cli.register`; the
command hands its arguments to ``run_make_model``, which is also driven here directly.
Importing ``inference.cli`` (and the whole command line) must work without torch (an
auditor's base install) and the command must then exit 3 with the install hint; that test
runs with or without torch installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import inference.cli
from affidavit.cli import main
from inference.cli import register, run_make_model

REPO = Path(__file__).resolve().parents[2]


def test_cli_make_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="making the model needs the `engine` extra")
    from inference.make_model import known_answers

    target = tmp_path / "model"
    assert run_make_model(argparse.Namespace(dir=str(target))) == 0
    out = capsys.readouterr().out
    assert f"weights_digest {known_answers()['weights_digest']}" in out
    assert "matches the known answers" in out
    assert run_make_model(argparse.Namespace(dir=str(target))) == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_cli_registers_engine_make_model(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(inference.cli, "run_make_model", lambda args: seen.append(args) or 0)
    assert main(["engine", "make-model", "some/dir"]) == 0
    assert [vars(args) for args in seen] == [{"dir": "some/dir", "json": False}]
    assert main(["engine", "make-model", "other/dir", "--json"]) == 0
    assert vars(seen[-1]) == {"dir": "other/dir", "json": True}
    assert main(["engine", "make-model"]) == 2  # DIR is required
    assert main(["engine", "make-model", "a", "b"]) == 2
    assert len(seen) == 2  # the usage errors never reached the command


def test_register_adds_engine_and_probe_to_any_typer_app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inference.cli, "run_make_model", lambda args: 1)
    app = typer.Typer(no_args_is_help=True)
    app.callback()(lambda: None)
    register(app)
    command = typer.main.get_command(app)
    assert sorted(getattr(command, "commands", {})) == ["engine", "probe"]
    result = CliRunner().invoke(app, ["engine", "make-model", "d"])
    assert result.exit_code == 1  # the code run_make_model returned, as a typer.Exit


def test_cli_imports_without_torch_and_exits_3() -> None:
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import argparse, inference.cli as cli, affidavit.cli\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
        "assert cli.run_make_model(argparse.Namespace(dir='unused')) == 3\n"
        "sys.exit(affidavit.cli.main(['engine', 'make-model', 'unused']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 3, result.stderr
    assert "pip install 'affidavit[engine]'" in result.stderr
    assert "torch" in result.stderr


def test_cli_make_model_reports_a_digest_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="making the model needs the `engine` extra")
    import inference.make_model

    monkeypatch.setattr(
        inference.make_model, "known_answers", lambda: {"weights_digest": "sha256:" + "0" * 64}
    )
    assert run_make_model(argparse.Namespace(dir=str(tmp_path / "model"))) == 1
    assert "differs from the known answers" in capsys.readouterr().err
