"""Read a store's bytes with the ``sqlite3`` module alone, never through ``record``.

Tests that check what ``record`` wrote must not trust ``record`` to read it back.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def stored_lines(store: Path, stream: str) -> list[bytes]:
    """The stored lines of ``stream`` in ``seq`` order, from a read-only connection."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT line FROM entries WHERE stream = ? ORDER BY seq", (stream,)
        ).fetchall()
    finally:
        conn.close()
    return [bytes(r[0]) for r in rows]
