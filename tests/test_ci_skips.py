"""CI's rule on skips (``tests/conftest.py``): with ``CI=true`` a skip for something missing
fails, a skip by design stays a skip; without it both skip. Run as a real pytest session on a
test file written for it, with this suite's conftest loaded as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = """
import pytest

pytest.importorskip("a_package_nobody_ships", reason="needs a_package_nobody_ships")


def test_nothing():
    pass
"""
CASES = """
import pytest


def test_missing_tool():
    pytest.skip("strace is not installed")


def test_by_design():
    pytest.skip("by design: this needs a GPU")


def test_fine():
    pass
"""


def run(tmp_path: Path, text: str, ci: bool) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "test_cases.py"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-q", "-rs", "--rootdir", str(tmp_path), str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("ci", [True, False], ids=["CI=true", "no CI"])
def test_a_skip_for_something_missing_fails_only_in_ci(tmp_path: Path, ci: bool) -> None:
    result = run(tmp_path, CASES, ci)
    if ci:
        assert result.returncode == 1, result.stdout
        assert "1 failed, 1 passed, 1 skipped" in result.stdout
        assert "strace is not installed" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "1 passed, 2 skipped" in result.stdout


def test_a_module_skipped_at_import_fails_the_run_in_ci(tmp_path: Path) -> None:
    result = run(tmp_path, TESTS, True)
    assert result.returncode == 1, result.stdout
    assert "modules skipped in CI" in result.stdout
    assert run(tmp_path, TESTS, False).returncode == pytest.ExitCode.NO_TESTS_COLLECTED  # skipped
