"""Fixtures for the engine tests: the shipped tiny model, made once per session.

The fixtures import the engine lazily, so that collecting these tests on a base install
(no torch) reaches each module's ``importorskip`` and skips with its reason instead of
failing in this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from inference.model import DecoderModel


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the model ``affidavit engine make-model`` writes."""
    from inference.make_model import make_model

    path = tmp_path_factory.mktemp("tiny") / "model"
    make_model(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> DecoderModel:
    """The tiny model loaded, on the fixed-chunk path (the model's default; the self-test
    picks ``padded-8`` here, which gives the same bits on this build)."""
    from inference.model import DecoderModel

    return DecoderModel.load(tiny_model_dir)
