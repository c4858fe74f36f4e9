"""Append and audit throughput of the record log, against bare SQLite, PostgreSQL, SHA-256.

Run from the repository root::

    .venv/bin/python bench/log_append.py                 # full run, a few minutes on 2 cores
    .venv/bin/python bench/log_append.py --quick         # smoke run, some seconds
    .venv/bin/python bench/log_append.py --no-postgres   # the SQLite part only

For each body size (2 KiB and 16 KiB of random ``result_bytes`` in a ``tool.result`` body)
it measures, in one process:

- ``sqlite 1 row/txn``: the durable baseline. The exact stored lines the full path wrote,
  inserted into a bare table of a WAL + ``synchronous=FULL`` database, one row per
  ``BEGIN IMMEDIATE … COMMIT`` (so one WAL fsync per row).
- ``sqlite 16 rows/txn``: the same, 16 rows per transaction (what group commit can reach).
- ``full path x1`` / ``full path x16``: ``Log.append`` (seal + Merkle + durable group
  commit), from 1 thread and from 16 threads appending concurrently to one stream (a start
  barrier, then a fixed count each). Bodies are built before the clock starts.
- ``postgres 1 row/txn`` / ``postgres 16 rows/txn``: the PostgreSQL baseline. The same
  stored lines (byte for byte those the SQLite baseline inserts) into a bare table of the same
  shape (``id`` identity key, ``line BYTEA``) on a private local cluster, one row (or 16) per
  transaction, each ``COMMIT`` durable (``fsync=on``, ``synchronous_commit=on``).
- ``full path x1 (pg)`` / ``full path x16 (pg)``: the full path with ``Log`` on a
  ``record.postgres_store.PostgresStore``, same bodies, 1 and 16 appenders, each run in a
  fresh database of that cluster.
- ``raw sha256``: ``hashlib.sha256(line).digest()`` over each stored line separately.
- ``audit``: ``record.audit.verify_store(path)`` (no key: lines, seq, Merkle tree,
  checkpoints) over the store the 16 appenders wrote; ``audit + key`` also opens and checks
  every body. The PostgreSQL store is not audited here
  yet (the output says so): each run's database is dropped when the run ends.

The PostgreSQL cluster is the tests' own (``tests/pg_cluster.py``): ``initdb`` into a
temporary folder (as the system user ``affidavit-pg`` when run as root), 127.0.0.1 only,
``fsync`` and ``synchronous_commit`` on, stopped and removed at the end. Without Debian's
PostgreSQL binaries or ``psycopg`` (the ``postgres`` extra), or with ``--no-postgres``, the
bench says so in one line and measures SQLite alone. The durability settings in force (read
back from the connections that wrote: SQLite's ``journal_mode``/``synchronous``,
PostgreSQL's ``fsync``/``synchronous_commit``) head the table and are in the JSON line.

MB/s counts stored line bytes (1 MB = 10**6 bytes). Each figure is the median of the
repeats (5 in a full run). A ratio against a baseline (SQLite's for the SQLite rows,
PostgreSQL's for the ``(pg)`` rows) is paired: each run against the baseline run of the same
repeat (they run back to back), then the median, because fsync latency on a shared disk
drifts. The audit ratio is audit MB/s over raw SHA-256 MB/s; the audit reads its lines from
SQLite itself, the raw baseline hashes them from memory.

Targets (2 cores): full path x16 >= 10,000 entries/s at 2 KiB on SQLite (#20 line 4) and
>= 5,000 on the local PostgreSQL (#21 line 6); audit >= 0.5x raw SHA-256 at 16 KiB, and
>= 0.25x with a key (#20 line 4). It prints one table and, last, one line of
JSON holding every figure (``{"figures": …, "targets": …, "met": …}``). It exits 0 whenever
it ran: it is a measurement, not a test, and says in words whether the targets were met.
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from target import Target

from record.audit import verify_store
from record.checkpoint import Signer
from record.digest import Domain, digest
from record.log import LOG_KEY_NAME, Log
from record.schema import ToolResult
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from record.store import LogStore

if TYPE_CHECKING:
    from tests.pg_cluster import PostgresServer

ROOT = Path(__file__).resolve().parents[1]

STREAM = "bench"
SIZES = (2048, 16384)
APPENDERS = 16
TARGET_FULL_16_AT_2K = 10000.0  # entries/s, 16 appenders, 2 KiB bodies, 2 cores (#20 line 4)
TARGET_FULL_16_PG_AT_2K = 5000.0  # the same, on the local PostgreSQL (#21 line 6)
TARGET_AUDIT_RATIO_AT_16K = 0.5  # audit MB/s over raw sha256 MB/s, 16 KiB bodies
TARGET_AUDIT_KEY_RATIO_AT_16K = 0.25  # the same, with a key: every body opened (#20 line 4)
BODY_POOL = 32  # distinct bodies per size, reused round-robin
WARMUP = 8  # untimed appends after opening the stream
PG_SETTINGS = ("fsync", "synchronous_commit")  # the durability pair read back from the server
PG_AUDIT_NOTE = (
    "not measured yet: record.audit.verify_store takes the store's URL, but each run's "
    "database is dropped when it ends"
)


@dataclass(frozen=True)
class Counts:
    full_1: int  # appends by the single appender
    full_each: int  # appends by each of the 16 appenders
    baseline_rows: int  # rows per bare-insert baseline run (SQLite and PostgreSQL)
    repeats: int  # runs of each measurement; the median is reported
    audit_repeats: int


FULL = {
    2048: Counts(full_1=5000, full_each=500, baseline_rows=5000, repeats=5, audit_repeats=5),
    16384: Counts(full_1=2500, full_each=250, baseline_rows=2500, repeats=5, audit_repeats=5),
}
QUICK = {
    2048: Counts(full_1=800, full_each=80, baseline_rows=800, repeats=1, audit_repeats=2),
    16384: Counts(full_1=400, full_each=40, baseline_rows=400, repeats=1, audit_repeats=2),
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


Opener = Callable[[], Log]


def sqlite_log(path: Path, key: KeyPair) -> Opener:
    def opener() -> Log:
        log = Log.open(path, appliance_key=key)
        log.open_stream(STREAM, [key.recipient])
        return log

    return opener


def postgres_log(url: str, key: KeyPair) -> Opener:
    def opener() -> Log:
        from record.postgres_store import PostgresStore

        log = Log(PostgresStore(url), Signer.generate(LOG_KEY_NAME), appliance_key=key)
        log.open_stream(STREAM, [key.recipient])
        return log

    return opener


def durability(store: LogStore) -> dict[str, Any]:
    """The durability settings in force on the store's writer connection."""
    pragmas = getattr(store, "writer_pragmas", None)
    return dict(pragmas()) if pragmas is not None else {}


def stored_lines(path: Path) -> list[bytes]:
    store = SQLiteStore(path, readonly=True)
    try:
        return [e.line for e in store.entries(STREAM)]
    finally:
        store.close()


# -- measurements --------------------------------------------------------------------------------


def run_full_1(opener: Opener, bodies: Sequence[ToolResult], n: int) -> dict[str, Any]:
    with opener() as log:
        for body in bodies[:WARMUP]:  # warm-up, untimed
            log.append(STREAM, body)
        counter = CommitCounter(log)
        pool = len(bodies)
        t0 = time.perf_counter()
        for i in range(n):
            log.append(STREAM, bodies[i % pool])
        elapsed = time.perf_counter() - t0
        settings = durability(log.store)
    return {"n": n, "seconds": elapsed, "commits": counter.commits, "settings": settings}


def run_full_many(
    opener: Opener, bodies: Sequence[ToolResult], appenders: int, each: int
) -> dict[str, Any]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(appenders + 1)
    with opener() as log:
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
        settings = durability(log.store)
    n = appenders * each
    return {"n": n, "seconds": elapsed, "commits": counter.commits, "settings": settings}


def run_sqlite(path: Path, lines: Sequence[bytes], n: int, per_txn: int) -> dict[str, Any]:
    """Bare durable inserts of ``lines`` (cycled to ``n`` rows), ``per_txn`` rows a commit."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, line BLOB NOT NULL)")
        settings = {
            name: conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "synchronous")
        }
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
    return {"n": n, "seconds": elapsed, "bytes": sum(len(r) for r in rows), "settings": settings}


def run_postgres(url: str, lines: Sequence[bytes], n: int, per_txn: int) -> dict[str, Any]:
    """Bare durable inserts into PostgreSQL, as ``run_sqlite`` does into SQLite."""
    import psycopg

    with psycopg.connect(url, autocommit=True, options="-c synchronous_commit=on") as conn:
        conn.execute(
            "CREATE TABLE t (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " line BYTEA NOT NULL)"
        )
        settings = {}
        for name in PG_SETTINGS:
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            assert row is not None
            settings[name] = row[0]
        rows = [lines[i % len(lines)] for i in range(n)]
        t0 = time.perf_counter()
        for start in range(0, n, per_txn):
            with conn.transaction():  # BEGIN ... COMMIT: one durable WAL flush
                for line in rows[start : start + per_txn]:
                    conn.execute("INSERT INTO t (line) VALUES (%s)", (line,))
        elapsed = time.perf_counter() - t0
    return {"n": n, "seconds": elapsed, "bytes": sum(len(r) for r in rows), "settings": settings}


@contextmanager
def scratch_database(server: PostgresServer) -> Iterator[str]:
    """A fresh database for one run, dropped after it (untimed)."""
    url = server.fresh_database()
    try:
        yield url
    finally:
        server.drop_database(url)


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


def settings_of(engine: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The durability settings every run of ``engine`` wrote under, the same for all of them
    (a baseline and the full path under different settings would not compare)."""
    found = {json.dumps(r["settings"], sort_keys=True) for r in runs}
    if len(found) != 1:
        raise RuntimeError(f"{engine} runs disagree on their durability settings: {found}")
    settings: dict[str, Any] = json.loads(found.pop())
    return settings


def paired(
    out: dict[str, Any],
    measured: Sequence[tuple[str, list[dict[str, Any]]]],
    baselines: Sequence[tuple[str, list[dict[str, Any]]]],
) -> None:
    """Each run against the baseline run of the same repeat, then the median."""
    for name, runs in measured:
        for base_name, base in baselines:
            if runs is base:
                continue
            out[name][f"ratio_vs_{base_name}"] = statistics.median(
                rate(r["n"], r["seconds"]) / rate(b["n"], b["seconds"])
                for r, b in zip(runs, base, strict=True)
            )


def bench_size(
    size: int, counts: Counts, key: KeyPair, scratch: Path, pg: PostgresServer | None
) -> dict[str, Any]:
    bodies = make_bodies(size, BODY_POOL)
    full_1: list[dict[str, Any]] = []
    full_n: list[dict[str, Any]] = []
    sql_1: list[dict[str, Any]] = []
    sql_16: list[dict[str, Any]] = []
    pg_full_1: list[dict[str, Any]] = []
    pg_full_n: list[dict[str, Any]] = []
    pg_1: list[dict[str, Any]] = []
    pg_16: list[dict[str, Any]] = []
    last_store = scratch
    rows = counts.baseline_rows
    for rep in range(counts.repeats):
        # One repeat runs everything back to back, so that each ratio pairs runs close in time.
        full_1.append(
            run_full_1(sqlite_log(scratch / f"x1-{size}-{rep}.db", key), bodies, counts.full_1)
        )
        last_store = scratch / f"x{APPENDERS}-{size}-{rep}.db"
        full_n.append(
            run_full_many(sqlite_log(last_store, key), bodies, APPENDERS, counts.full_each)
        )
        body_lines = stored_lines(last_store)[1:]  # the tool.result lines, not stream.opened
        sql_1.append(run_sqlite(scratch / f"sql1-{size}-{rep}.db", body_lines, rows, 1))
        sql_16.append(run_sqlite(scratch / f"sql16-{size}-{rep}.db", body_lines, rows, 16))
        if pg is not None:
            # The same bodies through PostgresStore, and the same stored lines, byte for
            # byte, into PostgreSQL's bare table: each run in a database of its own.
            with scratch_database(pg) as url:
                pg_full_1.append(run_full_1(postgres_log(url, key), bodies, counts.full_1))
            with scratch_database(pg) as url:
                pg_full_n.append(
                    run_full_many(postgres_log(url, key), bodies, APPENDERS, counts.full_each)
                )
            with scratch_database(pg) as url:
                pg_1.append(run_postgres(url, body_lines, rows, 1))
            with scratch_database(pg) as url:
                pg_16.append(run_postgres(url, body_lines, rows, 16))
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

    many = f"full_path_{APPENDERS}_appenders"
    out: dict[str, Any] = {
        "body_bytes": size,
        "mean_line_bytes": line_bytes,
        "sqlite_1_row_per_txn": figure(sql_1, line_bytes),
        "sqlite_16_rows_per_txn": figure(sql_16, line_bytes),
        "full_path_1_appender": figure(full_1, line_bytes),
        many: figure(full_n, line_bytes),
        "raw_sha256": speed(raw),
        "audit": speed(audit),
        "audit_with_key": speed(audit_key),
        "durability": {"sqlite": settings_of("sqlite", [*full_1, *full_n, *sql_1, *sql_16])},
    }
    raw_mbps = out["raw_sha256"]["mb_per_s"]
    for name in ("audit", "audit_with_key"):
        out[name]["ratio_vs_raw_sha256"] = out[name]["mb_per_s"] / raw_mbps
    paired(
        out,
        [("sqlite_16_rows_per_txn", sql_16), ("full_path_1_appender", full_1), (many, full_n)],
        [("sqlite_1_row_per_txn", sql_1), ("sqlite_16_rows_per_txn", sql_16)],
    )
    if pg is not None:
        out["postgres_1_row_per_txn"] = figure(pg_1, line_bytes)
        out["postgres_16_rows_per_txn"] = figure(pg_16, line_bytes)
        out["full_path_1_appender_pg"] = figure(pg_full_1, line_bytes)
        out[f"{many}_pg"] = figure(pg_full_n, line_bytes)
        out["durability"]["postgres"] = settings_of(
            "postgres", [*pg_full_1, *pg_full_n, *pg_1, *pg_16]
        )
        paired(
            out,
            [
                ("postgres_16_rows_per_txn", pg_16),
                ("full_path_1_appender_pg", pg_full_1),
                (f"{many}_pg", pg_full_n),
            ],
            [("postgres_1_row_per_txn", pg_1), ("postgres_16_rows_per_txn", pg_16)],
        )
    return out


# -- report --------------------------------------------------------------------------------------

MANY = f"full_path_{APPENDERS}_appenders"
TARGET_KEYS = (
    f"{MANY}_2048_entries_per_s",
    "audit_vs_raw_sha256_16384",
    f"{MANY}_pg_2048_entries_per_s",
    "audit_with_key_vs_raw_sha256_16384",
)
#: Where each target's figure is: (body size, measurement, field).
TARGET_VALUES = {
    TARGET_KEYS[0]: ("2048", MANY, "entries_per_s"),
    TARGET_KEYS[1]: ("16384", "audit", "ratio_vs_raw_sha256"),
    TARGET_KEYS[2]: ("2048", f"{MANY}_pg", "entries_per_s"),
    TARGET_KEYS[3]: ("16384", "audit_with_key", "ratio_vs_raw_sha256"),
}
TARGETS = {
    TARGET_KEYS[0]: TARGET_FULL_16_AT_2K,
    TARGET_KEYS[1]: TARGET_AUDIT_RATIO_AT_16K,
    TARGET_KEYS[2]: TARGET_FULL_16_PG_AT_2K,
    TARGET_KEYS[3]: TARGET_AUDIT_KEY_RATIO_AT_16K,
}


def settings_line(durability: dict[str, Any]) -> str:
    """``durability: sqlite journal_mode=wal synchronous=2 | postgres fsync=on ...``."""
    parts = [
        f"{engine} " + " ".join(f"{k}={v}" for k, v in settings.items())
        for engine, settings in durability.items()
    ]
    return "durability in force: " + (" | ".join(parts) if parts else "none read")


def table(figures: dict[str, Any], met: dict[str, bool | None]) -> str:
    head = ("body", "measurement", "entries/s", "MB/s", "ratio", "vs", "target", "met?")
    rows: list[tuple[str, ...]] = [head]
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
            target_key: str | None = None,
            *,
            f: dict[str, Any] = f,
            label: str = label,
        ) -> None:
            m = f[key]
            ratio = f"{m[ratio_key]:.2f}x" if ratio_key else "-"
            target, verdict = "-", "-"
            if target_key is not None:
                goal = TARGETS[target_key]
                target = f">= {goal:,.0f}/s" if goal >= 100 else f">= {goal}x"
                ok = met[target_key]
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

        at_2k = size == 2048
        row("sqlite 1 row/txn (baseline)", "sqlite_1_row_per_txn", None, "-")
        vs_sqlite = ("ratio_vs_sqlite_1_row_per_txn", "sqlite 1/txn")
        row("sqlite 16 rows/txn", "sqlite_16_rows_per_txn", *vs_sqlite)
        row("full path x1", "full_path_1_appender", *vs_sqlite)
        row(f"full path x{APPENDERS}", MANY, *vs_sqlite, TARGET_KEYS[0] if at_2k else None)
        if "postgres_1_row_per_txn" in f:
            vs_pg = ("ratio_vs_postgres_1_row_per_txn", "postgres 1/txn")
            row("postgres 1 row/txn (baseline)", "postgres_1_row_per_txn", None, "-")
            row("postgres 16 rows/txn", "postgres_16_rows_per_txn", *vs_pg)
            row("full path x1 (pg)", "full_path_1_appender_pg", *vs_pg)
            pg_target = TARGET_KEYS[2] if at_2k else None
            row(f"full path x{APPENDERS} (pg)", f"{MANY}_pg", *vs_pg, pg_target)
        row("raw sha256 per line (baseline)", "raw_sha256", None, "-")
        vs_raw = ("ratio_vs_raw_sha256", "raw sha256")
        row("audit (verify_store)", "audit", *vs_raw, None if at_2k else TARGET_KEYS[1])
        row("audit + key", "audit_with_key", *vs_raw, None if at_2k else TARGET_KEYS[3])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {2, 3, 4}
    lines = [settings_line(figures["run"]["durability"])]
    for i, r in enumerate(rows):
        cells = [
            c.rjust(w) if j in right else c.ljust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append(" | ".join(cells).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def evaluate(figures: dict[str, Any]) -> tuple[dict[str, float], dict[str, bool | None]]:
    """Each target and whether it was met (``None``: not measured in this run)."""
    met: dict[str, bool | None] = {}
    for name, (size, what, field) in TARGET_VALUES.items():
        value = figures.get(size, {}).get(what, {}).get(field)
        met[name] = None if value is None else value >= TARGETS[name]
    return dict(TARGETS), met


# -- the private PostgreSQL cluster --------------------------------------------------------------


@contextmanager
def postgres(wanted: bool) -> Iterator[tuple[PostgresServer | None, str | None]]:
    """The tests' private cluster (``tests/pg_cluster.py``) for the run, or ``None`` and why
    not: not wanted, no binaries, no ``psycopg``, or no account to run it as."""
    if not wanted:
        yield None, "not measured: --no-postgres"
        return
    if str(ROOT) not in sys.path:  # run as a script: the repository's tests package by path
        sys.path.insert(0, str(ROOT))
    from tests.pg_cluster import ClusterUnavailable, find_bin_dir, start_server, stop_server

    bin_dir = find_bin_dir()
    if bin_dir is None:
        yield None, "not measured: PostgreSQL is not installed (no /usr/lib/postgresql/*/bin)"
        return
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as missing:
        yield None, f"not measured: {missing.name} is missing (the `postgres` extra)"
        return
    try:
        server = start_server(bin_dir)
    except ClusterUnavailable as why:
        yield None, f"not measured: {why}"
        return
    try:
        yield server, None
    finally:
        stop_server(server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few seconds (few entries, one repeat)",
    )
    parser.add_argument(
        "--no-postgres",
        action="store_true",
        help="measure SQLite only (no private PostgreSQL cluster)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    key = KeyPair.generate()
    scratch = Path(tempfile.mkdtemp(prefix="bench-log-append-"))
    started = time.perf_counter()
    figures: dict[str, Any] = {}
    durable: dict[str, Any] = {}
    try:
        with postgres(not args.no_postgres) as (pg, pg_note):
            if pg_note is not None:
                print(f"postgres: {pg_note}; measuring SQLite only", flush=True)
            else:
                progress("postgres: a private cluster on 127.0.0.1 started")
            for size in SIZES:
                progress(f"body {size} bytes ...")
                figures[str(size)] = bench_size(size, plan[size], key, scratch, pg)
                for engine, settings in figures[str(size)].pop("durability").items():
                    if durable.setdefault(engine, settings) != settings:
                        raise RuntimeError(f"{engine}: durability settings changed mid-run")
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
        "durability": durable,
        "postgres": {
            "measured": pg_note is None,
            "note": pg_note or "a private local cluster (tests/pg_cluster.py), 127.0.0.1",
            "audit": PG_AUDIT_NOTE,
        },
    }
    targets, met = evaluate(figures)

    print(table(figures, met))
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
    if pg_note is None:
        print(f"audit of the PostgreSQL store: {PG_AUDIT_NOTE}")
    for name, ok in met.items():
        where, what, field = TARGET_VALUES[name]
        got = figures.get(where, {}).get(what, {}).get(field, float("nan"))
        verdict = "not measured" if ok is None else ("met" if ok else "MISSED")
        print(f"target {name}: {got:,.2f} against >= {targets[name]:,}: {verdict}")
    if not all(ok is not False for ok in met.values()):
        print("NOT all targets met")
    elif None in met.values():
        print("all measured targets met (some not measured)")
    else:
        print("all targets met")
    summary = [
        Target(name, figures.get(where, {}).get(what, {}).get(field), targets[name], "higher")
        for name, (where, what, field) in TARGET_VALUES.items()
    ]
    doc = {"figures": figures, "targets": targets, "met": met}
    print(json.dumps({**doc, "summary": [t.row() for t in summary]}, sort_keys=True))
    return 0


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
