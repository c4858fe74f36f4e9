"""The benchmark script runs end to end and keeps its promised output shape.

Its figures are measurements, not assertions: this checks the table, the durability settings
and the closing JSON line, never a speed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from bench_run import run_quick

from tests.pg_cluster import find_bin_dir

SIZES = ("2048", "16384")
SQLITE_ROWS = (
    "sqlite_1_row_per_txn",
    "sqlite_16_rows_per_txn",
    "full_path_1_appender",
    "full_path_16_appenders",
)
PG_ROWS = (
    "postgres_1_row_per_txn",
    "postgres_16_rows_per_txn",
    "full_path_1_appender_pg",
    "full_path_16_appenders_pg",
)
PG_TARGET = "full_path_16_appenders_pg_2048_entries_per_s"


@pytest.fixture(scope="module")
def quick() -> tuple[list[str], dict[str, Any]]:
    return run_quick("log_append.py")


def durability_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("durability in force:")]


def test_log_append_quick_prints_one_table_and_a_json_line(
    quick: tuple[list[str], dict[str, Any]],
) -> None:
    lines, figures = quick
    assert set(figures) == {"figures", "targets", "met", "summary"}
    assert {r["target"]: r["met"] for r in figures["summary"]} == figures["met"]
    for size in SIZES:
        measured = figures["figures"][size]
        for name in (*SQLITE_ROWS, "audit", "raw_sha256"):
            assert measured[name]["entries_per_s"] > 0, (size, name)
        for name in SQLITE_ROWS[1:]:
            assert measured[name]["ratio_vs_sqlite_1_row_per_txn"] > 0, (size, name)
        assert measured["audit"]["ratio_vs_raw_sha256"] > 0
    assert set(figures["met"]) == set(figures["targets"])
    assert PG_TARGET in figures["targets"]
    header = [line for line in lines if line.startswith("body")]
    assert len(header) == 1, "one table"
    # The settings the SQLite runs wrote under, read back from their connections.
    assert figures["figures"]["run"]["durability"]["sqlite"] == {
        "journal_mode": "wal",
        "synchronous": 2,
    }
    (settings,) = durability_lines(lines)
    assert "sqlite journal_mode=wal synchronous=2" in settings
    assert lines.index(settings) + 1 == lines.index(header[0]), "the settings head the table"


def test_log_append_quick_measures_postgres_beside_sqlite(
    quick: tuple[list[str], dict[str, Any]],
) -> None:
    if find_bin_dir() is None:
        pytest.skip("PostgreSQL is not installed: `make test` installs it (make system-deps)")
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is missing: install the `postgres` extra")
    lines, figures = quick
    run = figures["figures"]["run"]
    assert run["postgres"]["measured"] is True, run["postgres"]
    assert run["durability"]["postgres"] == {"fsync": "on", "synchronous_commit": "on"}
    assert "postgres fsync=on synchronous_commit=on" in durability_lines(lines)[0]
    for size in SIZES:
        measured = figures["figures"][size]
        for name in PG_ROWS:
            assert measured[name]["entries_per_s"] > 0, (size, name)
            assert measured[name]["mb_per_s"] > 0, (size, name)
        for name in PG_ROWS[1:]:
            assert measured[name]["ratio_vs_postgres_1_row_per_txn"] > 0, (size, name)
        for name in PG_ROWS[2:]:
            assert measured[name]["ratio_vs_postgres_16_rows_per_txn"] > 0, (size, name)
            assert measured[name]["mean_entries_per_commit"] > 0, (size, name)
    assert figures["met"][PG_TARGET] in (True, False)
    rows = {line.split("|")[1].strip() for line in lines if line.count("|") >= 7}
    assert {"postgres 1 row/txn (baseline)", "postgres 16 rows/txn"} <= rows
    assert {"full path x1 (pg)", "full path x16 (pg)"} <= rows
    assert any(line.startswith("audit of the PostgreSQL store: not measured") for line in lines)


def test_log_append_no_postgres_measures_sqlite_alone() -> None:
    lines, figures = run_quick("log_append.py", "--no-postgres")
    assert lines[0] == "postgres: not measured: --no-postgres; measuring SQLite only"
    assert figures["met"][PG_TARGET] is None
    assert figures["figures"]["run"]["postgres"]["measured"] is False
    assert set(figures["figures"]["run"]["durability"]) == {"sqlite"}
    for size in SIZES:
        assert not set(PG_ROWS) & set(figures["figures"][size]), size
        assert figures["figures"][size]["full_path_16_appenders"]["entries_per_s"] > 0
    assert not any("(pg)" in line for line in lines[:-1])
