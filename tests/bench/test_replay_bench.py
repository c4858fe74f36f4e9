"""The replay benchmark runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the two tables and the closing
JSON line, never a speed (nor whether the 10-step goal was met: quick mode has no 10-step
turn, so it says so with ``goal_met`` null).
"""

from __future__ import annotations

import pytest
from bench_run import run_quick

pytest.importorskip("torch", reason="the benchmark runs the embedded engine: `engine` extra")

PER_LENGTH = (
    "reconstruct_ms",
    "reconstruct_ms_min",
    "reconstruct_ms_per_step",
    "original_turn_ms",
    "reexecute_ms",
    "reexecute_ratio",
)


def test_replay_quick_prints_two_tables_and_a_json_line() -> None:
    lines, report = run_quick("replay.py")
    assert set(report) == {
        *PER_LENGTH,
        "goal_10_step_ms",
        "goal_met",
        "steps_made",
        "outcomes",
        "tool_calls",
        "stream_entries",
        "breakdown_ms",
        "run",
        "summary",
    }
    assert [r["target"] for r in report["summary"]] == ["reconstruct_10_step_ms"]
    assert report["summary"][0]["met"] is None  # --quick runs no 10-step turn
    for name in PER_LENGTH:
        assert set(report[name]) == {"1", "2", "4"}, name
        assert all(isinstance(v, float) and v > 0 for v in report[name].values()), name
    assert report["goal_10_step_ms"] == 10 and report["goal_met"] is None
    assert report["run"]["mode"] == "quick"
    for n, made in report["steps_made"].items():
        assert made and all(1 <= m <= int(n) for m in made), (n, made)
    for n, parts in report["breakdown_ms"].items():
        assert parts["whole"] > 0 and parts["read_bodies (all)"] > 0, n
    assert len([line for line in lines if line.startswith("steps |")]) == 1, "one table"
    assert len([line for line in lines if line.startswith("where reconstruct time")]) == 1
    rows = [line.split("|")[0].strip() for line in lines if line.split("|")[0].strip().isdigit()]
    assert rows == ["1", "2", "4"]
    assert any(line.startswith("goal (10-step turn reconstructed): not measured") for line in lines)
    # every probe still finds what it times: a rename would quietly zero a row otherwise
    for parts in report["breakdown_ms"].values():
        assert parts["sdk: stream parsing"] > 0 and parts["model steps (pipeline)"] > 0
