"""``affidavit engine make-model``: the parser entry, the command, and the base install.

``harness.cli`` owns the top-level parser and calls :func:`inference.cli.add_commands`, so
the command is driven here through ``run_make_model`` directly. Importing ``inference.cli``
must work without torch (an auditor's base install) and the command must then exit 3 with
the install hint; that test runs with or without torch installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from inference.cli import add_commands, run_make_model

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


def test_cli_registers_engine_make_model() -> None:
    parser = argparse.ArgumentParser(prog="affidavit")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["engine", "make-model", "some/dir"])
    assert args.func is run_make_model
    assert args.dir == "some/dir"


def test_cli_imports_without_torch_and_exits_3() -> None:
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import argparse, inference.cli as cli\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
        "sys.exit(cli.run_make_model(argparse.Namespace(dir='unused')))\n"
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
