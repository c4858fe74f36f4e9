"""The proxy overhead bench runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table and the closing JSON
line, never a speed.
"""

from __future__ import annotations

from bench_run import run_quick


def test_proxy_overhead_quick_prints_one_table_and_a_json_line() -> None:
    lines, figures = run_quick("proxy_overhead.py")
    assert set(figures) == {"figures", "targets", "met", "summary"}
    assert {r["target"]: r["met"] for r in figures["summary"]} == figures["met"]
    # no call died on either side (#20 line 6): each failure would be listed, by side
    rows = {r["target"]: r for r in figures["summary"]}
    assert rows["failed_calls"]["figure"] == 0 and rows["failed_calls"]["met"] is True
    assert figures["figures"]["json_c32"]["proxy"]["failures"] == []
    measured = figures["figures"]
    for mode in ("json", "stream"):
        for clients in (1, 32):
            f = measured[f"{mode}_c{clients}"]
            for side in ("direct", "proxy"):
                assert f[side]["calls_per_s"] > 0 and f[side]["p50_ms"] > 0, (mode, side)
            for name in ("added_p50_ms", "added_p99_ms", "added_ttfb_ms", "throughput_ratio"):
                assert isinstance(f[name], float), (mode, clients, name)
    assert measured["durable_commit"]["p50_ms"] > 0
    floor = measured["forwarder_no_record"]  # the same parts, recording nothing: context
    assert set(floor) == {f"{m}_c{c}" for m in ("json", "stream") for c in (1, 32)}, floor
    assert all(f["throughput_ratio"] > 0 and f["failures"] == 0 for f in floor.values())
    assert any(line.startswith("for context, a forwarder of the same parts") for line in lines)
    assert measured["proxy_metrics"]["mean_added_ms"] > 0  # the proxy's own /metrics saw calls
    assert set(measured["published_added_ms_no_durable_record"]) == {
        "LiteLLM",
        "Portkey (local mock)",
        "Bifrost (local mock)",
    }
    for mode in ("json", "stream"):  # the proxy's /metrics over the very calls at 1 client
        c1 = measured[f"{mode}_c1"]
        assert c1["metrics_added_mean_ms"] > 0 and c1["added_mean_ms"] > 0, mode
        assert rows[f"{mode}_c1_metrics_disagreement"]["figure"] == round(
            c1["metrics_disagreement"], 4
        )
    # where the time goes: py-spy's samples by part, or why they could not be taken
    breakdown = measured["breakdown"]
    if "not_measured" in breakdown:
        assert any(line.startswith("where the proxy's time goes: not measured") for line in lines)
    else:
        parts = breakdown["parts"]
        assert breakdown["samples"] > 0 and breakdown["calls"] > 0
        assert "durable commit (SQLite)" in parts, parts  # the design's floor is seen
        assert abs(sum(p["share"] for p in parts.values()) - 1) < 1e-6
        assert any(line.startswith("part of the proxy") for line in lines)
    assert set(figures["met"]) == set(figures["targets"])
    header = [line for line in lines if line.startswith("mode")]
    assert len(header) == 1, "one table"
