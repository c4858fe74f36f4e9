"""A real SQLite store whose commits wait at a gate, for the writer's group-commit tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from record.sqlite_store import SQLiteStore
from record.store import PendingCheckpoint, PendingEntry, StoredCheckpoint, StoredEntry


class GatedStore(SQLiteStore):
    """A real SQLite store whose commits wait for the test to open a gate, so requests queue
    up behind one commit deterministically; it records each commit's batch shape."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[tuple[int, int]] = []  # (entries, checkpoints) per commit

    def append(
        self,
        entries: Sequence[PendingEntry],
        checkpoints: Sequence[PendingCheckpoint] = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        self.batches.append((len(entries), len(checkpoints)))
        self.entered.set()
        assert self.gate.wait(30)
        return super().append(entries, checkpoints, on_built, holder)

    def hold(self) -> None:
        """Hold the next commit at the gate."""
        self.gate.clear()
        self.entered.clear()
