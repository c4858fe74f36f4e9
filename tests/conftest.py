"""Shared fixtures for the test suite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vectors() -> Path:
    """``../shared/vectors`` beside the repository: external test vectors, read in place."""
    path = Path(__file__).resolve().parents[2] / "shared" / "vectors"
    if not path.is_dir():
        pytest.skip(
            "../shared/vectors is absent: the external test vectors live there (present in CI)"
        )
    return path
