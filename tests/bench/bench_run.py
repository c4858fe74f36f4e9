"""Shared by the bench smoke tests: run a bench script in ``--quick`` mode, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, *extra: str) -> tuple[list[str], dict[str, Any]]:
    """The script's output lines and its closing JSON line; fails on a non-zero exit."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    figures: dict[str, Any] = json.loads(lines[-1])
    return lines, figures
