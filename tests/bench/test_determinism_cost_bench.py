"""The determinism-cost benchmark runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table, the published
references beside it and the closing JSON line, never a speed.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench_run import ROOT, run_quick

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
        "versus_transformers",
    }
    names = [
        "cost_at_16",
        "cost_at_4",
        "cost_at_1",
        "forward_thread",
        "decode_vs_transformers_at_16",
        "prefill_512_vs_transformers",
    ]
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
        "decode_vs_transformers_at_16": 1.0,
        "prefill_512_vs_transformers": 1.2,
    }
    assert set(report["met"]) == set(names)
    # --quick leaves the real model out, and says so rather than passing or failing it
    assert report["versus_transformers"] == {"not_measured": "--quick measures the tiny model only"}
    rows = {r["target"]: r for r in report["summary"]}
    assert rows["decode_vs_transformers_at_16"]["met"] is None
    assert any(
        line.endswith("not measured: --quick measures the tiny model only") for line in lines
    )
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


@pytest.mark.slow
def test_the_real_model_against_transformers_measures_both_sides(smollm2_gguf: Any) -> None:
    """The full run's comparison, shortened: both engines decode the same 16 prompts and
    prefill the same 512 tokens; figures only, never a speed asserted."""
    pytest.importorskip("transformers", reason="the comparison's reference: `dev` extra")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with it")
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from determinism_cost import PREFILL_TOKENS, versus_transformers

    found = versus_transformers(smollm2_gguf, tokens=4, repeats=1)
    assert found["model"] == smollm2_gguf.name and found["invariance_path"] != "stock"
    for side in ("ours", "transformers"):
        assert found[side]["decode_tokens_per_s"] > 0 and found[side]["prefill_s"] > 0, side
    assert found["decode_ratio"] > 0 and found["prefill_ratio"] > 0
    assert (found["batch"], found["prefill_tokens"]) == (16, PREFILL_TOKENS)
