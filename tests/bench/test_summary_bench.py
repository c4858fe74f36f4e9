"""``make bench``'s summary: every bench's targets gathered into one table and one JSON line.

Run as ``make bench`` runs it, on two of the benches in their smoke runs (the others' own
tests run them): each bench's rows arrive with its name, and a bench that does not run is
listed, never silently left out. Figures are measurements, not assertions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_run import ROOT

pytest.importorskip("torch", reason="the benches drive the engine: `engine` extra")


def _summary(*extra: str) -> tuple[list[str], dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "summary.py"), "--quick", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_the_summary_lists_every_target_of_the_benches_it_ran() -> None:
    lines, doc = _summary("--only", "determinism_cost,grammar_mask")
    assert doc["benches"] == {"determinism_cost": 0, "grammar_mask": 0}
    targets = [(row["bench"], row["target"]) for row in doc["targets"]]  # type: ignore[index]
    assert targets == [
        ("determinism_cost", "cost_at_16"),
        ("determinism_cost", "cost_at_4"),
        ("determinism_cost", "cost_at_1"),
        ("determinism_cost", "forward_thread"),
        ("determinism_cost", "decode_vs_transformers_at_16"),
        ("determinism_cost", "prefill_512_vs_transformers"),
        ("grammar_mask", "mask_vs_decode_step"),
    ]
    assert set(doc["met"]) == {f"{b}.{t}" for b, t in targets}  # type: ignore[arg-type]
    # each bench's own output came through, then one table with a row per target
    assert "== bench/determinism_cost.py --quick" in lines
    header = lines.index(next(line for line in lines if line.startswith("bench  ")))
    assert [line.split()[1] for line in lines[header + 2 : header + 9]] == [
        "cost_at_16",
        "cost_at_4",
        "cost_at_1",
        "forward_thread",
        "decode_vs_transformers_at_16",
        "prefill_512_vs_transformers",
        "mask_vs_decode_step",
    ]
    # --quick leaves the real model out: its rows say "not measured", never met or missed
    assert lines[header + 6].split()[-1] == "measured" and "not measured" in lines[header + 6]
    assert lines[header + 9].endswith("(--quick: indicative only)")


def test_an_unknown_bench_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "summary.py"), "--only", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown bench(es): nope" in done.stderr
