"""``make bench``: every bench, then one table of every target across them, and one JSON line.

Run from the repository root::

    .venv/bin/python bench/summary.py            # every bench, full runs (tens of minutes)
    .venv/bin/python bench/summary.py --quick    # every bench's smoke run
    .venv/bin/python bench/summary.py --only determinism_cost,grammar_mask

Each bench runs as its own process, as a user would run it, its output passed through as it
comes (its progress included), so a long run shows where it is. Each ends with one JSON line
whose ``summary`` holds its targets (``bench/target.py``): figure, goal, met. This script
gathers them into one table (bench, target, figure, goal, met / MISSED / not measured) and
one closing JSON line (``{"targets": [...], "benches": {name: exit code}, "met": {...}}``).
A bench that fails to run is listed as such, with its exit code; the others still run. It
exits 0 whenever it ran: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: Every bench, in the order ``make bench`` runs them.
BENCHES = ("log_append", "proxy_overhead", "determinism_cost", "grammar_mask", "replay")


def run_bench(name: str, quick: bool) -> tuple[int, list[dict[str, Any]]]:
    """Run one bench, passing its output through; its exit code and its summary rows."""
    argv = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if quick else [])]
    last = ""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                last = line  # the closing JSON line: kept, not echoed (it is long)
            else:
                print(line, end="", flush=True)
    if process.returncode != 0 or not last:
        return process.returncode or 1, []
    try:
        rows: list[dict[str, Any]] = json.loads(last).get("summary", [])
    except ValueError:
        return 1, []
    return 0, rows


def table(rows: list[dict[str, Any]]) -> str:
    """One line per target: bench, target, figure, goal, verdict."""
    head = ("bench", "target", "figure", "goal", "verdict")
    cells = [head]
    for row in rows:
        figure = row["figure"]
        shown = "-" if figure is None else f"{figure:,.3f}{row.get('unit', '')}"
        verdict = {True: "met", False: "MISSED", None: "not measured"}[row["met"]]
        cells.append((row["bench"], row["target"], shown, row["goal"], verdict))
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="each bench's smoke run")
    parser.add_argument("--only", help="comma-separated benches (default: all)")
    args = parser.parse_args(argv)
    chosen = tuple(args.only.split(",")) if args.only else BENCHES
    unknown = [name for name in chosen if name not in BENCHES]
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(unknown)} (known: {', '.join(BENCHES)})")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    codes: dict[str, int] = {}
    for name in chosen:
        print(f"== bench/{name}.py{' --quick' if args.quick else ''}", flush=True)
        code, found = run_bench(name, args.quick)
        codes[name] = code
        if code != 0:
            rows.append(
                {"target": "(the bench did not run)", "figure": None, "goal": f"exit {code}"}
                | {"bench": name, "met": False, "unit": ""}
            )
        rows.extend({**row, "bench": name} for row in found)
    print()
    print(f"every target ({time.perf_counter() - started:.0f} s)")
    print(table(rows))
    verdicts = [row["met"] for row in rows]
    missed = sum(v is False for v in verdicts)
    unmeasured = sum(v is None for v in verdicts)
    print(
        f"{len(rows) - missed - unmeasured} met, {missed} missed, {unmeasured} not measured"
        + (" (--quick: indicative only)" if args.quick else "")
    )
    met = {f"{row['bench']}.{row['target']}": row["met"] for row in rows}
    print(json.dumps({"targets": rows, "benches": codes, "met": met}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
