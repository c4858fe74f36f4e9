"""The benchmark script runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table and the closing JSON
line, never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_log_append_quick_prints_one_table_and_a_json_line() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "log_append.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert set(figures) == {"figures", "targets", "met"}
    for size in ("2048", "16384"):
        measured = figures["figures"][size]
        for name in ("full_path_1_appender", "full_path_16_appenders", "audit", "raw_sha256"):
            assert measured[name]["entries_per_s"] > 0, (size, name)
        assert measured["audit"]["ratio_vs_raw_sha256"] > 0
    assert set(figures["met"]) == set(figures["targets"])
    header = [line for line in lines if line.startswith("body")]
    assert len(header) == 1, "one table"
