"""Append and audit throughput of the record log, against bare SQLite and raw SHA-256.

Run from the repository root::

    .venv/bin/python bench/log_append.py            # full run, about 1-2 minutes on 2 cores
    .venv/bin/python bench/log_append.py --quick    # smoke run, a few seconds

For each body size (2 KiB and 16 KiB of random ``result_bytes`` in a ``tool.result`` body)
it measures, in one process:

- ``sqlite 1 row/txn``: the durable baseline. The exact stored lines the full path wrote,
  inserted into a bare table of a WAL + ``synchronous=FULL`` database, one row per
  ``BEGIN IMMEDIATE … COMMIT`` (so one WAL fsync per row).
- ``sqlite 16 rows/txn``: the same, 16 rows per transaction (what group commit can reach).
- ``full path x1`` / ``full path x16``: ``Log.append`` (seal + Merkle + durable group
  commit), from 1 thread and from 16 threads appending concurrently to one stream (a start
  barrier, then a fixed count each). Bodies are built before the clock starts.
- ``raw sha256``: ``hashlib.sha256(line).digest()`` over each stored line separately.
- ``audit``: ``record.audit.verify_store(path)`` (no key: lines, seq, Merkle tree,
  checkpoints) over the store the 16 appenders wrote; ``audit + key`` also opens and checks
  every body (shown for information, no target).

MB/s counts stored line bytes (1 MB = 10**6 bytes). Each figure is the median of the
repeats (5 in a full run). A ratio against the SQLite baseline is paired: each run against
the baseline run of the same repeat (they run back to back), then the median, because fsync
latency on a shared disk drifts. The audit ratio is audit MB/s over raw SHA-256 MB/s; the
audit reads its lines from SQLite itself, the raw baseline hashes them from memory.

Targets (2 cores): full path x16 >= 5,000 entries/s at 2 KiB; audit >= 0.5x raw SHA-256 at
16 KiB. It prints one table and, last, one line of JSON holding every figure
(``{"figures": …, "targets": …, "met": …}``). It exits 0 whenever it ran: it is a
measurement, not a test, and says in words whether the targets were met.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from record.audit import verify_store
from record.digest import Domain, digest
from record.log import Log
from record.schema import ToolResult
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

STREAM = "bench"
SIZES = (2048, 16384)
APPENDERS = 16
TARGET_FULL_16_AT_2K = 5000.0  # entries/s, 16 appenders, 2 KiB bodies, 2 cores
TARGET_AUDIT_RATIO_AT_16K = 0.5  # audit MB/s over raw sha256 MB/s, 16 KiB bodies
BODY_POOL = 32  # distinct bodies per size, reused round-robin
WARMUP = 8  # untimed appends after opening the stream


@dataclass(frozen=True)
class Counts:
    full_1: int  # appends by the single appender
    full_each: int  # appends by each of the 16 appenders
    sqlite_rows: int  # rows per baseline run
    repeats: int  # runs of each measurement; the median is reported
    audit_repeats: int


FULL = {
    2048: Counts(full_1=5000, full_each=500, sqlite_rows=5000, repeats=5, audit_repeats=5),
    16384: Counts(full_1=2500, full_each=250, sqlite_rows=2500, repeats=5, audit_repeats=5),
}
QUICK = {
    2048: Counts(full_1=800, full_each=80, sqlite_rows=800, repeats=1, audit_repeats=2),
    16384: Counts(full_1=400, full_each=40, sqlite_rows=400, repeats=1, audit_repeats=2),
}


# -- bodies and stores ---------------------------------------------------------------------------


def make_bodies(size: int, n: int) -> list[ToolResult]:
    bodies = []
    for i in range(n):
        data = os.urandom(size)
        bodies.append(
            ToolResult(
                call_seq=i,
                outcome="COMMITTED",
                result_bytes=data,
                result_digest=digest(Domain.TOOL_RESULT, data),
            )
        )
    return bodies


class CommitCounter:
    """Counts the store transactions a log makes (one per group commit)."""

    def __init__(self, log: Log) -> None:
        self.commits = 0
        inner = log.store.append

        def append(*args: Any, **kwargs: Any) -> Any:
            self.commits += 1  # only the writer thread calls this
            return inner(*args, **kwargs)

        log.store.append = append  # type: ignore[method-assign]


def open_log(path: Path, key: KeyPair) -> Log:
    log = Log.open(path, appliance_key=key)
    log.open_stream(STREAM, [key.recipient])
    return log


def stored_lines(path: Path) -> list[bytes]:
    store = SQLiteStore(path, readonly=True)
    try:
        return [e.line for e in store.entries(STREAM)]
    finally:
        store.close()


# -- measurements --------------------------------------------------------------------------------


def run_full_1(path: Path, key: KeyPair, bodies: Sequence[ToolResult], n: int) -> dict[str, Any]:
    with open_log(path, key) as log:
        for body in bodies[:WARMUP]:  # warm-up, untimed
            log.append(STREAM, body)
        counter = CommitCounter(log)
        pool = len(bodies)
        t0 = time.perf_counter()
        for i in range(n):
            log.append(STREAM, bodies[i % pool])
        elapsed = time.perf_counter() - t0
    return {"n": n, "seconds": elapsed, "commits": counter.commits}


def run_full_many(
    path: Path, key: KeyPair, bodies: Sequence[ToolResult], appenders: int, each: int
) -> dict[str, Any]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(appenders + 1)
    with open_log(path, key) as log:
        for body in bodies[:WARMUP]:
            log.append(STREAM, body)
        counter = CommitCounter(log)
        pool = len(bodies)

        def appender(k: int) -> None:
            barrier.wait()
            try:
                for i in range(each):
                    log.append(STREAM, bodies[(k * each + i) % pool])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=appender, args=(k,)) for k in range(appenders)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        log.checkpoint(STREAM)  # untimed: gives the audit a root over every entry to check
    n = appenders * each
    return {"n": n, "seconds": elapsed, "commits": counter.commits}


def run_sqlite(path: Path, lines: Sequence[bytes], n: int, per_txn: int) -> dict[str, Any]:
    """Bare durable inserts of ``lines`` (cycled to ``n`` rows), ``per_txn`` rows a commit."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, line BLOB NOT NULL)")
        rows = [lines[i % len(lines)] for i in range(n)]
        t0 = time.perf_counter()
        for start in range(0, n, per_txn):
            conn.execute("BEGIN IMMEDIATE")
            for line in rows[start : start + per_txn]:
                conn.execute("INSERT INTO t (line) VALUES (?)", (line,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    return {"n": n, "seconds": elapsed, "bytes": sum(len(r) for r in rows)}


def run_raw_sha256(lines: Sequence[bytes]) -> float:
    sha256 = hashlib.sha256
    t0 = time.perf_counter()
    for line in lines:
        sha256(line).digest()
    return time.perf_counter() - t0


def run_audit(path: Path, expected: int, key: KeyPair | None) -> float:
    t0 = time.perf_counter()
    report = verify_store(path, key=key)
    elapsed = time.perf_counter() - t0
    if not report.ok or report.entries != expected:
        raise RuntimeError(f"audit of {path} failed: {report.dumps()[:500]}")
    return elapsed


# -- one body size -------------------------------------------------------------------------------


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def figure(runs: Sequence[dict[str, Any]], line_bytes: float) -> dict[str, Any]:
    rates = [rate(r["n"], r["seconds"]) for r in runs]
    eps = statistics.median(rates)
    out: dict[str, Any] = {
        "entries_per_s": eps,
        "mb_per_s": eps * line_bytes / 1e6,
        "samples_entries_per_s": rates,
        "n": runs[0]["n"],
    }
    if "commits" in runs[0]:
        out["mean_entries_per_commit"] = statistics.median(r["n"] / r["commits"] for r in runs)
    return out


def bench_size(size: int, counts: Counts, key: KeyPair, scratch: Path) -> dict[str, Any]:
    bodies = make_bodies(size, BODY_POOL)
    full_1: list[dict[str, Any]] = []
    full_n: list[dict[str, Any]] = []
    sql_1: list[dict[str, Any]] = []
    sql_16: list[dict[str, Any]] = []
    last_store = scratch
    for rep in range(counts.repeats):
        # One repeat runs everything back to back, so that each ratio pairs runs close in time.
        full_1.append(run_full_1(scratch / f"x1-{size}-{rep}.db", key, bodies, counts.full_1))
        last_store = scratch / f"x{APPENDERS}-{size}-{rep}.db"
        full_n.append(run_full_many(last_store, key, bodies, APPENDERS, counts.full_each))
        body_lines = stored_lines(last_store)[1:]  # the tool.result lines, not stream.opened
        sql_1.append(
            run_sqlite(scratch / f"sql1-{size}-{rep}.db", body_lines, counts.sqlite_rows, 1)
        )
        sql_16.append(
            run_sqlite(scratch / f"sql16-{size}-{rep}.db", body_lines, counts.sqlite_rows, 16)
        )
        del body_lines

    # The audit runs while this process holds no copy of the lines (it reads them itself);
    # the raw baseline then hashes the same lines from memory.
    runs = counts.audit_repeats
    expected = 1 + WARMUP + counts.full_each * APPENDERS  # stream.opened, warm-up, timed
    audit = [run_audit(last_store, expected, None) for _ in range(runs)]
    audit_key = [run_audit(last_store, expected, key) for _ in range(runs)]
    lines = stored_lines(last_store)
    raw = [run_raw_sha256(lines) for _ in range(max(3, runs))]
    line_bytes = statistics.mean(len(x) for x in lines[1:])
    total_bytes = sum(len(x) for x in lines)
    n = len(lines)
    del lines

    def speed(samples: list[float]) -> dict[str, Any]:
        seconds = statistics.median(samples)
        return {
            "entries_per_s": n / seconds,
            "mb_per_s": total_bytes / seconds / 1e6,
            "n": n,
            "bytes": total_bytes,
            "samples_seconds": samples,
        }

    out: dict[str, Any] = {
        "body_bytes": size,
        "mean_line_bytes": line_bytes,
        "sqlite_1_row_per_txn": figure(sql_1, line_bytes),
        "sqlite_16_rows_per_txn": figure(sql_16, line_bytes),
        "full_path_1_appender": figure(full_1, line_bytes),
        f"full_path_{APPENDERS}_appenders": figure(full_n, line_bytes),
        "raw_sha256": speed(raw),
        "audit": speed(audit),
        "audit_with_key": speed(audit_key),
    }
    raw_mbps = out["raw_sha256"]["mb_per_s"]
    for name in ("audit", "audit_with_key"):
        out[name]["ratio_vs_raw_sha256"] = out[name]["mb_per_s"] / raw_mbps
    for name, runs_ in (
        ("sqlite_16_rows_per_txn", sql_16),
        ("full_path_1_appender", full_1),
        (f"full_path_{APPENDERS}_appenders", full_n),
    ):
        # Paired: each run against the baseline run of the same repeat, then the median.
        for base_name, base in (
            ("sqlite_1_row_per_txn", sql_1),
            ("sqlite_16_rows_per_txn", sql_16),
        ):
            if runs_ is base:
                continue
            out[name][f"ratio_vs_{base_name}"] = statistics.median(
                rate(r["n"], r["seconds"]) / rate(b["n"], b["seconds"])
                for r, b in zip(runs_, base, strict=True)
            )
    return out


# -- report --------------------------------------------------------------------------------------


def table(figures: dict[str, Any], met: dict[str, bool]) -> str:
    head = ("body", "measurement", "entries/s", "MB/s", "ratio", "vs", "target", "met?")
    rows: list[tuple[str, ...]] = [head]
    many = f"full_path_{APPENDERS}_appenders"
    for size in SIZES:
        f = figures.get(str(size))
        if f is None:
            continue
        label = f"{size // 1024} KiB"

        def row(
            name: str,
            key: str,
            ratio_key: str | None,
            vs: str,
            target: str = "-",
            ok: bool | None = None,
            *,
            f: dict[str, Any] = f,
            label: str = label,
        ) -> None:
            m = f[key]
            ratio = f"{m[ratio_key]:.2f}x" if ratio_key else "-"
            verdict = "-" if ok is None else ("yes" if ok else "NO")
            rows.append(
                (
                    label,
                    name,
                    f"{m['entries_per_s']:,.0f}",
                    f"{m['mb_per_s']:,.1f}",
                    ratio,
                    vs,
                    target,
                    verdict,
                )
            )

        row("sqlite 1 row/txn (baseline)", "sqlite_1_row_per_txn", None, "-")
        row(
            "sqlite 16 rows/txn",
            "sqlite_16_rows_per_txn",
            "ratio_vs_sqlite_1_row_per_txn",
            "sqlite 1/txn",
        )
        row("full path x1", "full_path_1_appender", "ratio_vs_sqlite_1_row_per_txn", "sqlite 1/txn")
        if size == 2048:
            row(
                f"full path x{APPENDERS}",
                many,
                "ratio_vs_sqlite_1_row_per_txn",
                "sqlite 1/txn",
                f">= {TARGET_FULL_16_AT_2K:,.0f}/s",
                met[TARGET_KEYS[0]],
            )
        else:
            row(f"full path x{APPENDERS}", many, "ratio_vs_sqlite_1_row_per_txn", "sqlite 1/txn")
        row("raw sha256 per line (baseline)", "raw_sha256", None, "-")
        if size == 16384:
            row(
                "audit (verify_store)",
                "audit",
                "ratio_vs_raw_sha256",
                "raw sha256",
                f">= {TARGET_AUDIT_RATIO_AT_16K}x",
                met[TARGET_KEYS[1]],
            )
        else:
            row("audit (verify_store)", "audit", "ratio_vs_raw_sha256", "raw sha256")
        row("audit + key (info)", "audit_with_key", "ratio_vs_raw_sha256", "raw sha256")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {2, 3, 4}
    lines = []
    for i, r in enumerate(rows):
        cells = [
            c.rjust(w) if j in right else c.ljust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append(" | ".join(cells).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


TARGET_KEYS = (
    f"full_path_{APPENDERS}_appenders_2048_entries_per_s",
    "audit_vs_raw_sha256_16384",
)


def evaluate(figures: dict[str, Any]) -> tuple[dict[str, float], dict[str, bool | None]]:
    targets = {TARGET_KEYS[0]: TARGET_FULL_16_AT_2K, TARGET_KEYS[1]: TARGET_AUDIT_RATIO_AT_16K}
    met: dict[str, bool | None] = {k: None for k in targets}
    if "2048" in figures:
        value = figures["2048"][f"full_path_{APPENDERS}_appenders"]["entries_per_s"]
        met[TARGET_KEYS[0]] = value >= TARGET_FULL_16_AT_2K
    if "16384" in figures:
        value = figures["16384"]["audit"]["ratio_vs_raw_sha256"]
        met[TARGET_KEYS[1]] = value >= TARGET_AUDIT_RATIO_AT_16K
    return targets, met


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few seconds (few entries, one repeat)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    key = KeyPair.generate()
    scratch = Path(tempfile.mkdtemp(prefix="bench-log-append-"))
    started = time.perf_counter()
    figures: dict[str, Any] = {}
    try:
        for size in SIZES:
            progress(f"body {size} bytes ...")
            figures[str(size)] = bench_size(size, plan[size], key, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures["run"] = {
        "mode": "quick" if args.quick else "full",
        "cores": cores,
        "appenders": APPENDERS,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "seconds": time.perf_counter() - started,
        "stream": "one stream shared by every appender",
        "raw_sha256": "hashlib.sha256(line).digest() over each stored line separately",
    }
    targets, met = evaluate(figures)

    print(table(figures, {k: bool(v) for k, v in met.items()}))
    print()
    print(f"cores: {cores}; mode: {figures['run']['mode']}; {figures['run']['seconds']:.1f} s")
    if args.quick:
        print("note: --quick runs one short repeat; its verdicts are indicative only")
    if cores != 2:
        print(f"note: targets are stated for 2 cores; this machine gives {cores}")
    print(
        "ratio: paired with the baseline run of the same repeat, median over repeats; "
        "raw sha256: hashlib.sha256(line).digest() over each stored line separately, in memory"
    )
    values = {
        TARGET_KEYS[0]: ("2048", f"full_path_{APPENDERS}_appenders", "entries_per_s"),
        TARGET_KEYS[1]: ("16384", "audit", "ratio_vs_raw_sha256"),
    }
    for name, ok in met.items():
        where, what, field = values[name]
        got = figures[where][what][field] if where in figures else float("nan")
        verdict = "not measured" if ok is None else ("met" if ok else "MISSED")
        print(f"target {name}: {got:,.2f} against >= {targets[name]:,}: {verdict}")
    print("all targets met" if all(met.values()) else "NOT all targets met")
    print(json.dumps({"figures": figures, "targets": targets, "met": met}, sort_keys=True))
    return 0


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
