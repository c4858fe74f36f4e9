"""One parser under atheris (libFuzzer), in a process of its own: ``atheris.Fuzz`` never
returns, so ``fuzz.run`` starts this once per parser.

``python -m fuzz._atheris PARSER [libFuzzer flags and corpus folders]`` (PARSER: a name of
``fuzz.common.PARSERS``, or a dotted module name with the same ``target``). The project's own
packages are instrumented for coverage; libraries are not.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import atheris

from fuzz._mutate import mutate_json
from fuzz._signature import IGNORE_ENV, SEEDS_ENV, signature

#: The packages whose branches guide the fuzzer.
INSTRUMENTED = ["fuzz", "record", "egress_proxy", "inference", "attestation"]


def main() -> None:
    parser, *flags = sys.argv[1:]
    with atheris.instrument_imports(include=INSTRUMENTED):
        module = importlib.import_module(parser if "." in parser else f"fuzz.{parser}")
    corpus = os.environ.get(SEEDS_ENV)
    if corpus and not any(Path(corpus).iterdir()):  # the first round: the seeds, once
        for seed in module.seeds():
            (Path(corpus) / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    if not any(flag.startswith("-max_len=") for flag in flags):
        flags.append(f"-max_len={getattr(module, 'MAX_LEN', 4096)}")
    ignored = set(filter(None, os.environ.get(IGNORE_ENV, "").split("\n")))
    target = _ignoring(module.target, ignored) if ignored else module.target
    atheris.Setup([sys.argv[0], *flags], target, custom_mutator=_mutator(module))
    atheris.Fuzz()


def _ignoring(target: Callable[[bytes], None], ignored: set[str]) -> Callable[[bytes], None]:
    """``target``, with the crashes of known, not yet fixed bugs let through (a campaign
    goes on past them; ``make fuzz`` ignores none)."""

    def run(data: bytes) -> None:
        try:
            target(data)
        except Exception as exc:
            if signature(exc) not in ignored:
                raise

    return run


def _mutator(module: ModuleType) -> object:
    """For a target whose input carries JSON (``JSON_PREFIX`` set: the bytes before it), half
    of the mutations change one JSON value (``fuzz._mutate``); the rest are libFuzzer's."""
    prefix = getattr(module, "JSON_PREFIX", None)
    if prefix is None:
        return None

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        if random.Random(seed).randrange(2):
            try:
                mutated = mutate_json(data, seed, prefix)
            except (ValueError, RecursionError):  # a value JSON cannot write: mutate bytes
                mutated = None
            if mutated is not None and len(mutated) <= max_size:
                return mutated
        out: bytes = atheris.Mutate(data, max_size)
        return out

    return mutate


if __name__ == "__main__":
    main()
