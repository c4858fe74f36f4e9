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
SLICE_SECONDS = 2  # per parser: 15 parsers, with start-up, is about a minute

#: Crashes found in files this work does not own, still to be fixed there: the kept input
#: (``<parser>/<file>``), the exception type and the file that raises it, and why. Replaying
#: the input is an expected failure (``xfail(strict=True)``: once fixed, the test fails until
#: the entry goes), and the slice passes when it finds only these again (in any parser: the
#: reply parsers share code; by file, not line, since those files are being edited).
KNOWN_CRASHES: dict[str, tuple[str, str, str]] = {}


def _regressions() -> list[Path]:
    return sorted(p for p in REGRESSIONS.glob("*/*") if p.is_file() and p.name != "README.md")


def _replay_params() -> list[object]:
    params: list[object] = []
    for path in _regressions():
        key = f"{path.parent.name}/{path.name}"
        known = KNOWN_CRASHES.get(key)
        marks = [pytest.mark.xfail(strict=True, reason=known[2])] if known else []
        params.append(pytest.param(path, id=key, marks=marks))
    return params


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


def test_known_crashes_name_kept_inputs() -> None:
    kept = {f"{p.parent.name}/{p.name}" for p in _regressions()}
    assert set(KNOWN_CRASHES) <= kept


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
    if proc.returncode == 0:
        return
    after = proc.stdout.split(line, 1)[1].splitlines()
    places = [x.strip().removeprefix("at: ") for x in after if x.strip().startswith("at: ")]
    new = [
        place
        for place in places
        if not any(
            place.startswith(f"{kind} at ") and f"/{file}:" in place
            for kind, file, _ in KNOWN_CRASHES.values()
        )
    ]
    kept = sorted(tmp_path.glob(f"{parser}/*"))
    inputs = "\n".join(f"{p.name}: {p.read_bytes()[:400]!r}" for p in kept)
    assert not new, (
        f"fuzzing {parser} found a crash: keep its input in fuzz/regressions:\n{out}\n{inputs}"
    )
