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
