"""Shared fixtures for the test suite, and CI's rule on skips.

In CI (``CI=true``) a test that skips because something it needs is missing (a tool, a
permission, the vector folder, a package) fails instead: CI provides all of them, so a skip
there is a broken set-up that would otherwise pass unseen. Only skips by design stay skips,
those whose reason starts with :data:`BY_DESIGN` (what cannot exist on a CI machine, such as
a TEE or a GPU, or a run a person asks for by name, such as ``make image-full``).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

#: The prefix of a skip reason that CI accepts (see the module's docstring).
BY_DESIGN = "by design: "


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not (in_ci() and report.skipped):
        return
    reason = _skip_reason(report).removeprefix("Skipped: ")
    if not reason.startswith(BY_DESIGN):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped in CI (CI=true), where nothing it needs may be missing: {reason}"
        )


_module_skips: list[str] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped at import: counted here, failed at the end (failing the
    collection itself would stop the whole run)."""
    if in_ci() and report.skipped:
        reason = _skip_reason(report).removeprefix("Skipped: ")
        if not reason.startswith(BY_DESIGN):
            _module_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _module_skips:
        print("\nmodules skipped in CI (CI=true), where nothing they need may be missing:")
        for line in _module_skips:
            print(f"  {line}")
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def vectors() -> Path:
    """``../shared/vectors`` beside the repository: external test vectors, read in place."""
    path = Path(__file__).resolve().parents[2] / "shared" / "vectors"
    if not path.is_dir():
        pytest.skip(
            "../shared/vectors is absent: the external test vectors live there (present in CI)"
        )
    return path


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real default model's GGUF file, where ``make model`` (run by ``make test``) put it."""
    from inference.pull import KNOWN_MODELS, model_path

    path = model_path("smollm2-135m")
    if not path.is_file():
        pytest.skip(
            f"SmolLM2-135M-Instruct is not in the model cache ({path}); `make test` pulls it "
            "first (`affidavit engine pull smollm2-135m`)"
        )
    assert path.stat().st_size == KNOWN_MODELS["smollm2-135m"].size
    return path
