"""The grammar-mask benchmark runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table and the closing JSON
line, never a speed (the time per mask moved here from ``tests/inference/test_constrained``).
"""

from __future__ import annotations

import pytest
from bench_run import run_quick

pytest.importorskip("llguidance", reason="the benchmark drives the grammar: `engine` extra")


def test_grammar_mask_quick_prints_one_table_and_a_json_line() -> None:
    lines, report = run_quick("grammar_mask.py")
    assert set(report) == {"figures", "targets", "met", "summary"}
    assert [r["target"] for r in report["summary"]] == list(report["targets"])
    figures = report["figures"]
    assert figures["tokens"] > 0 and figures["mask_ms"] > 0 and figures["decode_step_ms"] > 0
    assert figures["ratio_vs_decode_step"] > 0
    assert report["targets"] == {"mask_vs_decode_step": 0.5}
    assert set(report["met"]) == set(report["targets"])
    assert len([line for line in lines if line.split()[:1] == ["tokens"]]) == 1, "one table"
