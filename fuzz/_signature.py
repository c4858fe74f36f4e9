"""Which bug a crash is, named the same way by both engines, and what ``fuzz.run`` hands its
atheris processes (kept apart from ``fuzz._atheris``, which imports atheris)."""

from __future__ import annotations

import traceback

#: Crash signatures (``Type at file:line``, one a line) to let pass: ``fuzz.run --ignore``.
IGNORE_ENV = "AFFIDAVIT_FUZZ_IGNORE"
#: The corpus folder an atheris process writes its parser's seeds into when it is empty.
SEEDS_ENV = "AFFIDAVIT_FUZZ_SEEDS"


def signature(exc: BaseException) -> str:
    """Which bug an exception is: its type and the innermost line that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return type(exc).__name__ + where
