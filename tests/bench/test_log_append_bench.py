"""The benchmark script runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table and the closing JSON
line, never a speed.
"""

from __future__ import annotations

from bench_run import run_quick


def test_log_append_quick_prints_one_table_and_a_json_line() -> None:
    lines, figures = run_quick("log_append.py")
    assert set(figures) == {"figures", "targets", "met"}
    for size in ("2048", "16384"):
        measured = figures["figures"][size]
        for name in ("full_path_1_appender", "full_path_16_appenders", "audit", "raw_sha256"):
            assert measured[name]["entries_per_s"] > 0, (size, name)
        assert measured["audit"]["ratio_vs_raw_sha256"] > 0
    assert set(figures["met"]) == set(figures["targets"])
    header = [line for line in lines if line.startswith("body")]
    assert len(header) == 1, "one table"
