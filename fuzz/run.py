"""Fuzz the parsers: ``python -m fuzz.run [--inputs N] [--seconds S] [PARSER...]``.

Each parser (all of ``fuzz.common.PARSERS`` by default) gets up to ``--inputs`` inputs
(100,000 by default) and at most ``--seconds`` seconds: coverage-guided with atheris where
it is installed (one process per parser, libFuzzer's mutator over the seeds), otherwise with
hypothesis (``--engine`` chooses). An exception other than the parser's own typed errors is
a crash: its input is kept under ``fuzz/regressions/<parser>/`` (``make test`` replays every
file there) and fuzzing of that parser goes on with what is left of its budget, so one run
finds several. Prints the inputs run per parser.

Exit status: 0 no crash, 1 a crash found, 2 usage, 3 no fuzzing engine installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz._signature import IGNORE_ENV, SEEDS_ENV, signature
from fuzz.common import PARSERS, REGRESSIONS

ROOT = Path(__file__).resolve().parents[1]
_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")
_STATUS = re.compile(rb"^#(\d+)\s", re.MULTILINE)
_DONE = re.compile(rb"Done (\d+) runs")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_MAX_ROUNDS = 20  # restarts after crashes, per parser: a fuzzer that only crashes stops here
_MAX_REPEATS = 3  # crashes at an already kept place, per parser, before it stops


@dataclass
class Result:
    parser: str
    engine: str
    inputs: int = 0
    seconds: float = 0.0
    crashes: list[tuple[Path, str]] = field(default_factory=list)  # (kept input, what)
    repeats: int = 0  # crashes found again at a place already kept in this run
    signatures: list[str] = field(default_factory=list)  # where each kept crash was raised


def available_engine() -> str | None:
    for name in ("atheris", "hypothesis"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def module_name(parser: str) -> str:
    """The module of a parser's target: ``fuzz.<parser>``, or a dotted name as it is."""
    return parser if "." in parser else f"fuzz.{parser}"


def _keep(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    return path


def _what(log: bytes) -> str:
    """The exception line of a crash's traceback, from atheris' report."""
    text = log.decode("utf-8", "replace")
    marker = text.rfind("=== Uncaught Python exception: ===")
    if marker < 0:
        tail = [line for line in text.splitlines() if "ERROR: libFuzzer" in line]
        return tail[-1].strip() if tail else "the fuzzer ended abnormally"
    lines = [line for line in text[marker:].splitlines()[1:] if line.strip()]
    for line in lines:
        if not line.startswith((" ", "Traceback")):
            return line.strip()
    return lines[-1].strip() if lines else "an uncaught exception"


def _signature(log: bytes) -> str:
    """Which bug a crash is: its exception type and the innermost line it was raised at."""
    text = log.decode("utf-8", "replace")
    report = text[text.rfind("=== Uncaught Python exception: ===") :]
    frames = _FRAME.findall(report)
    kind = _what(log).split(":", 1)[0]
    return f"{kind} at {frames[-1][0]}:{frames[-1][1]}" if frames else kind


def _executed(log: bytes) -> int:
    for pattern in (_EXECUTED, _DONE):
        found = pattern.findall(log)
        if found:
            return int(found[-1])
    found = _STATUS.findall(log)
    return int(found[-1]) if found else 0


def fuzz_atheris(
    parser: str,
    inputs: int,
    seconds: float | None,
    verbose: bool = False,
    regressions: Path = REGRESSIONS,
    ignore: tuple[str, ...] = (),
) -> Result:
    """Fuzz one parser with atheris; crashing inputs are kept under ``regressions/<parser>``."""
    result = Result(parser, "atheris")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"affidavit-fuzz-{parser}-") as tmp:
        corpus, artifacts = Path(tmp) / "corpus", Path(tmp) / "artifacts"
        corpus.mkdir()  # the fuzzing process writes the seeds in (importing the parser once)
        artifacts.mkdir()
        seen: set[str] = set()
        for _ in range(_MAX_ROUNDS):
            left = inputs - result.inputs
            spent = time.monotonic() - started
            if left <= 0 or (seconds is not None and spent >= seconds):
                break
            flags = [
                str(corpus),
                f"-runs={left}",
                f"-artifact_prefix={artifacts}/",
                "-timeout=60",
                "-rss_limit_mb=4096",
                "-print_final_stats=1",
                "-print_pcs=0",
            ]
            if seconds is not None:
                flags.append(f"-max_total_time={max(1, int(seconds - spent))}")
            command = [sys.executable, "-m", "fuzz._atheris", parser, *flags]
            env = {**os.environ, IGNORE_ENV: "\n".join(ignore), SEEDS_ENV: str(corpus)}
            env["TMPDIR"] = tmp  # libFuzzer ends the process without Python's atexit: its
            # temporary files (the mcp and bundle targets') go with this folder
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, check=False)
            log = proc.stdout + proc.stderr
            if verbose:
                sys.stderr.buffer.write(log)
            result.inputs += _executed(log)
            found = sorted(artifacts.iterdir())
            for artifact in found:
                where = _signature(log)
                if where in seen:
                    result.repeats += 1
                else:
                    seen.add(where)
                    result.signatures.append(where)
                    kept = _keep(regressions / parser, artifact.read_bytes())
                    result.crashes.append((kept, _what(log)[:300]))
                artifact.unlink()
            if result.repeats >= _MAX_REPEATS:
                break  # the same bug again and again: its budget is better spent after the fix
            if proc.returncode != 0 and not found:
                result.crashes.append((Path("-"), _what(log)))
                result.signatures.append("the fuzzer itself ended abnormally")
                break
            if proc.returncode == 0:
                break
    result.seconds = time.monotonic() - started
    return result


def fuzz_hypothesis(
    parser: str, inputs: int, seconds: float | None, regressions: Path = REGRESSIONS
) -> Result:
    """Fuzz one parser with hypothesis; the smallest crashing input found is kept."""
    from fuzz import _hypothesis

    module = importlib.import_module(module_name(parser))
    started = time.monotonic()
    outcome = _hypothesis.fuzz(module.target, module.seeds(), inputs, seconds)
    result = Result(parser, "hypothesis", outcome.inputs, time.monotonic() - started)
    if outcome.crash is not None:
        error = outcome.error
        kept = _keep(regressions / parser, outcome.crash)
        result.crashes.append((kept, f"{type(error).__name__}: {error}"[:300]))
        result.signatures.append(signature(error) if error is not None else "unknown")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n")[0])
    ap.add_argument("parsers", nargs="*", metavar="PARSER", help=f"of {', '.join(PARSERS)}")
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per parser (100000)")
    ap.add_argument("--seconds", type=float, default=None, help="time limit per parser")
    ap.add_argument("--engine", choices=("atheris", "hypothesis"), default=None)
    ap.add_argument("--verbose", action="store_true", help="show the fuzzer's own output")
    ap.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="SIGNATURE",
        help="a crash to let pass, as reported ('Type at file:line'): a campaign past a known, "
        "not yet fixed bug (atheris only; make fuzz ignores none)",
    )
    ap.add_argument(
        "--regressions",
        type=Path,
        default=REGRESSIONS,
        help="where crashing inputs are kept, one folder per parser (fuzz/regressions)",
    )
    args = ap.parse_args(argv)
    unknown = [p for p in args.parsers if p not in PARSERS]
    if unknown:
        ap.error(f"unknown parser(s) {', '.join(unknown)}; known: {', '.join(PARSERS)}")
    if args.inputs < 1 or (args.seconds is not None and args.seconds <= 0):
        ap.error("--inputs and --seconds must be positive")
    engine = args.engine or available_engine()
    if engine is None or importlib.util.find_spec(engine) is None:
        print("fuzz: neither atheris nor hypothesis is installed (pip install -e '.[dev]')")
        return 3
    os.environ.setdefault("PYTHONHASHSEED", "0")
    crashed = False
    total = 0
    for parser in args.parsers or PARSERS:
        if engine == "atheris":
            ignore = tuple(args.ignore)
            result = fuzz_atheris(
                parser, args.inputs, args.seconds, args.verbose, args.regressions, ignore
            )
        else:
            result = fuzz_hypothesis(parser, args.inputs, args.seconds, args.regressions)
        total += result.inputs
        verdict = f"{len(result.crashes)} crash(es)" if result.crashes else "no crash"
        if result.repeats:
            verdict += f" ({result.repeats} found again)"
        print(
            f"{parser:18} {result.inputs:>9,} inputs in {result.seconds:7.1f} s "
            f"({result.engine}): {verdict}",
            flush=True,
        )
        for kept, what in result.crashes:
            shown = kept.relative_to(ROOT) if kept.is_relative_to(ROOT) else kept
            print(f"    {what}\n    input kept as {shown}")
        for place in result.signatures:
            print(f"    at: {place}")
        crashed |= bool(result.crashes)
    print(f"total: {total:,} inputs")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
