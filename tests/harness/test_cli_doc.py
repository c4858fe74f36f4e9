"""``docs/cli.md`` names every command of the real command tree, and every command that
reports takes ``--json`` (services and the demo, which writes a report file, excepted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer.main

from affidavit.cli import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SERVICES = {"up", "engine serve", "demo", "panel"}


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    # typer may bring its own copy of click: groups are recognised by their commands
    found: dict[str, Any] = {}
    if hasattr(group, "commands"):
        for name, command in group.commands.items():
            found.update(_commands(command, f"{prefix}{name} "))
    else:
        found[prefix.strip()] = group
    return found


def test_every_command_is_documented_and_every_report_takes_json() -> None:
    text = DOC.read_text()
    commands = _commands(typer.main.get_command(app))
    assert {"turn", "replay", "resume", "session new", "diverge", "log verify"} <= set(commands)
    for path, command in commands.items():
        assert f"`affidavit {path}" in text, f"docs/cli.md does not document `affidavit {path}`"
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        if path not in SERVICES:
            assert "--json" in options, f"`affidavit {path}` reports but has no --json"
