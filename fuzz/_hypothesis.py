"""The fallback engine where atheris does not install: hypothesis, drawing byte strings
freely and as small edits of the seeds (not coverage-guided), in rounds until the input
count or the time is reached."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

_ROUND = 2_000  # examples per hypothesis run; the count and the clock are checked between


@dataclass
class Outcome:
    inputs: int
    crash: bytes | None  # the smallest failing input hypothesis found, if any
    error: BaseException | None


def _edit(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(seed)
    for op, where, value in edits:
        at = where % (len(data) + 1)
        if op == 0 and at < len(data):
            data[at] = value
        elif op == 1:
            data.insert(at, value)
        elif at < len(data):
            del data[at]
    return bytes(data)


def fuzz(
    target: Callable[[bytes], None], seeds: list[bytes], inputs: int, seconds: float | None
) -> Outcome:
    """Run ``target`` on up to ``inputs`` generated inputs, for at most ``seconds``."""
    edit = st.tuples(st.integers(0, 2), st.integers(0, 1 << 20), st.integers(0, 255))
    strategy = st.one_of(
        st.binary(max_size=4096),
        st.builds(_edit, st.sampled_from(seeds or [b""]), st.lists(edit, max_size=16)),
    )
    outcome = Outcome(0, None, None)
    deadline = None if seconds is None else time.monotonic() + seconds

    def once(data: bytes) -> None:
        outcome.inputs += 1
        try:
            target(data)
        except Exception as exc:
            outcome.crash, outcome.error = data, exc  # the last one is the shrunk one
            raise

    while outcome.inputs < inputs and (deadline is None or time.monotonic() < deadline):
        examples = min(_ROUND, inputs - outcome.inputs)
        run = settings(
            max_examples=examples,
            database=None,
            deadline=None,
            derandomize=False,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )(given(strategy)(once))  # a fresh test each round: settings apply once per test
        try:
            run()
        except Exception:
            if outcome.crash is not None:
                break  # the target crashed: hypothesis has shrunk it
            raise
    return outcome
