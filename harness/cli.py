"""``affidavit``: the command line, assembled from each part's commands.

Exit codes everywhere: 0 fine, 1 a problem was found, 2 usage error, 3 something it needs
is missing (a store, bundle, key file or an extra).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from inference import cli as engine_cli
from record import cli as record_cli


def cmd_demo(args: argparse.Namespace) -> int:
    from harness.demo import run_demo

    return run_demo(Path(args.workdir) if args.workdir else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="affidavit", description="A recorded, sealed, replayable agent harness."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="a pinned tool-using turn through the proxy, recorded, replayed with verdicts"
    )
    demo.add_argument("--workdir", help="where to write the demo's store and keys")
    demo.set_defaults(func=cmd_demo)
    record_cli.add_commands(sub)
    # The CLI is the one place that assembles every part's commands; each part's `cli`
    # module imports nothing heavy until its command runs (no torch for `log verify`).
    engine_cli.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return record_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
