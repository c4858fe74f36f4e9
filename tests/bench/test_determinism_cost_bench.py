"""The determinism-cost benchmark runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table, the published
references beside it and the closing JSON line, never a speed.
"""

from __future__ import annotations

import pytest
from bench_run import run_quick

pytest.importorskip("torch", reason="the benchmark drives the engine: `engine` extra")


def test_determinism_cost_quick_prints_one_table_and_a_json_line() -> None:
    lines, report = run_quick("determinism_cost.py")
    assert set(report) == {
        "figures",
        "forward_thread",
        "run",
        "targets",
        "references",
        "met",
        "summary",
    }
    names = ["cost_at_16", "cost_at_4", "cost_at_1", "forward_thread"]
    assert [r["target"] for r in report["summary"]] == names
    assert report["summary"][0]["figure"] == report["figures"]["16"]["cost"]
    assert report["summary"][0]["met"] == report["met"]["cost_at_16"]
    assert set(report["figures"]) == {"1", "4", "16"}
    for batch, row in report["figures"].items():
        for mode in ("on", "off"):
            assert row[mode]["tokens_per_s"] > 0 and row[mode]["tpot_ms"] > 0, (batch, mode)
        assert row["cost"] > 0 and row["throughput_ratio"] > 0, batch
    assert report["references"] == {"vllm_h100": 1.45, "sglang": 1.34}
    assert report["targets"] == {
        "cost_at_16": 1.1,
        "cost_at_4": 1.05,
        "cost_at_1": 1.5,
        "forward_thread": 1.1,
    }
    assert set(report["met"]) == set(names)
    forward = report["forward_thread"]
    assert forward["batch"] == 16 and forward["scheduler_ms"] > 0 and forward["main_ms"] > 0
    assert any(
        line.startswith("forward pass at batch 16 (tiny): scheduler thread") for line in lines
    )
    assert report["run"]["mode"] == "quick" and report["run"]["self_test_passed"] is True
    header = [line for line in lines if line.startswith("batch")]
    assert len(header) == 1, "one table"
    rows = [line.split() for line in lines if line.split()[:1] in (["1"], ["4"], ["16"])]
    assert [r[0] for r in rows] == ["1", "4", "16"]
    assert "vLLM 1.45x" in next(line for line in lines if line.lstrip().startswith("16 "))
