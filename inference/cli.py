"""``affidavit engine …``: the embedded engine's commands.

``harness.cli`` builds the top-level parser and calls :func:`add_commands`. Importing this
module must work on the base install (no torch: an auditor's machine), so everything of the
engine is imported inside the command, and a missing engine dependency becomes exit code 3
with the install hint rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["EXIT_MISSING", "EXIT_PROBLEM", "EXIT_USAGE", "add_commands", "run_make_model"]

EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_MISSING = 3

#: Third-party modules the ``engine`` extra provides.
_ENGINE_MODULES = frozenset({"torch", "tokenizers", "safetensors", "numpy", "jinja2"})
_INSTALL_HINT = "pip install 'affidavit[engine]'"


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``engine make-model DIR`` on the top-level subparsers."""
    engine = sub.add_parser("engine", help="the embedded CPU inference engine")
    commands = engine.add_subparsers(dest="engine", required=True)
    make = commands.add_parser(
        "make-model",
        help="write the small model that ships with the product (deterministic)",
        description=(
            "Write a tiny Qwen3-architecture checkpoint (config, safetensors weights from a "
            "fixed seed, a byte-level BPE tokenizer, a chat template with tool calls) into "
            "DIR, and check its digests against the committed known answers."
        ),
    )
    make.add_argument("dir", metavar="DIR", help="directory to create (absent or empty)")
    make.set_defaults(func=run_make_model)


def run_make_model(args: argparse.Namespace) -> int:
    """Make the model in ``args.dir``: 0 made and matching, 1 digests differ, 2 DIR not empty, 3 no extra."""
    try:
        from inference.make_model import KNOWN_ANSWERS, known_answers, make_model
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in _ENGINE_MODULES:
            raise
        print(
            f"affidavit: missing: the engine needs the `engine` extra ({exc.name} is not "
            f"installed): {_INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_MISSING
    try:
        made = make_model(args.dir)
    except FileExistsError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {made.path}")
    print(f"weights_digest {made.weights_digest}")
    expected, got = known_answers(), made.answers()
    differing = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    if differing:
        print(
            f"affidavit: the model differs from the known answers in {KNOWN_ANSWERS.name}: "
            f"{', '.join(differing)}",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    print(f"matches the known answers ({KNOWN_ANSWERS.name})")
    return 0
