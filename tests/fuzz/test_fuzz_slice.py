"""The fuzz targets in ``make test``: every regression input replayed, and every parser
fuzzed for a few seconds (about a minute in all) with the engine ``make fuzz`` uses.

``make fuzz`` runs 100,000 inputs per parser; this slice catches a target that no longer
runs and the shallow crashes a change brings in. Crashes found are kept under
``fuzz/regressions/<parser>/`` and replayed here from then on.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import run
from fuzz.common import PARSERS, REGRESSIONS

ROOT = Path(__file__).resolve().parents[2]
SLICE_SECONDS = 2  # per parser: 18 parsers, with start-up, is about a minute and a half


def _regressions() -> list[Path]:
    return sorted(p for p in REGRESSIONS.glob("*/*") if p.is_file() and p.name != "README.md")


def _replay_params() -> list[object]:
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in _regressions()]


def test_every_parser_has_a_target_whose_seeds_pass() -> None:
    for parser in PARSERS:
        module = importlib.import_module(f"fuzz.{parser}")
        seeds = module.seeds()
        assert seeds, f"{parser} has no seeds"
        assert all(isinstance(e, type) and issubclass(e, BaseException) for e in module.ERRORS)
        for seed in seeds:
            module.target(seed)


@pytest.mark.parametrize("path", _replay_params())
def test_regression_input_no_longer_crashes(path: Path) -> None:
    module = importlib.import_module(f"fuzz.{path.parent.name}")
    module.target(path.read_bytes())


@pytest.mark.parametrize("engine", ["atheris", "hypothesis"])
def test_the_runner_finds_keeps_and_reports_a_planted_crash(engine: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed here (pip install -e '.[dev]')")
    parser = "tests.fuzz._planted_bug"
    if engine == "atheris":
        result = run.fuzz_atheris(parser, 200_000, 30, regressions=tmp_path)
    else:
        result = run.fuzz_hypothesis(parser, 20_000, 30, regressions=tmp_path)
    assert result.crashes, f"{engine} did not find the planted bug in {result.inputs} inputs"
    kept, what = result.crashes[0]
    assert kept.parent == tmp_path / parser
    assert kept.read_bytes()[:1] == b"!"
    assert "PlantedBug" in what
    assert result.inputs > 0


@pytest.mark.slow
@pytest.mark.parametrize("parser", PARSERS)
def test_fuzz_slice(parser: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "fuzz.run", "--seconds", str(SLICE_SECONDS)]
    command += ["--regressions", str(tmp_path), parser]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    print(out)
    line = next(line for line in proc.stdout.splitlines() if line.startswith(parser))
    assert int(line.split()[1].replace(",", "")) > 0, line
    kept = sorted(tmp_path.glob(f"{parser}/*"))
    inputs = "\n".join(f"{p.name}: {p.read_bytes()[:400]!r}" for p in kept)
    assert proc.returncode == 0, (
        f"fuzzing {parser} found a crash: fix it, keep its input in fuzz/regressions:\n"
        f"{out}\n{inputs}"
    )
