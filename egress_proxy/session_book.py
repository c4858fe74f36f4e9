"""The proxy's note of its open sessions: what a restart needs that the record does not hold.

A session is mostly record facts: its labels (the turn policy among them) are in its clear
``stream.opened``, its pins in ``pins.set``, its tool-call id mapping in each pinned
``model.response``; ``SessionRegistry.restore`` reads them back from there. Two things are
not record facts, and this small SQLite file keeps them:

- the SHA-256 of the session's token (never the token). The record is handed to users and
  auditors; a data-plane credential is no fact of the session, so it stays out of it;
- the replay plan armed on the session: the stream it replays, its turn and its pins
  override (what ``arm_replay`` was asked; the plan itself is read again from the record).

Rows are written when a session opens and when it is armed, each in one durable
transaction before the opener is answered, never on a model or tool call: the per-call path
costs no extra fsync. Nothing is ever deleted. The file is made 0600. This module never
reads the record.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pydantic import JsonValue

__all__ = ["Armed", "BookedSession", "SessionBook"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id           TEXT PRIMARY KEY,
    token_digest BLOB NOT NULL,
    armed        TEXT
)
"""


@dataclass(frozen=True)
class Armed:
    """What a replay plan was armed with (``SessionRegistry.arm_replay``)."""

    source: str
    turn: int | None = None
    pins_override: dict[str, JsonValue] | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"source": self.source, "turn": self.turn, "pins_override": self.pins_override},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Armed:
        value = json.loads(text)
        override = value.get("pins_override")
        return cls(
            str(value["source"]),
            value.get("turn"),
            cast(dict[str, JsonValue], override) if override else None,
        )


@dataclass(frozen=True)
class BookedSession:
    id: str
    token_digest: bytes
    armed: Armed | None


class SessionBook:
    """The sessions table at ``path`` (created 0600 when missing). Thread-safe."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")  # a row is on disk before its answer
        self._conn.execute(_SCHEMA)
        self._lock = threading.Lock()

    def add(self, session_id: str, token_digest: bytes) -> None:
        """Note a newly opened session (durable on return)."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO sessions (id, token_digest) VALUES (?, ?)", (session_id, token_digest)
            )

    def arm(self, session_id: str, armed: Armed) -> None:
        """Note the replay plan armed on a session (durable on return)."""
        with self._lock:
            done = self._conn.execute(
                "UPDATE sessions SET armed = ? WHERE id = ?", (armed.to_json(), session_id)
            )
        if done.rowcount != 1:
            raise KeyError(f"the session book holds no session {session_id!r}")

    def sessions(self) -> list[BookedSession]:
        """Every session noted, in the order they were opened (ids are UUIDv7)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, token_digest, armed FROM sessions ORDER BY id"
            ).fetchall()
        return [
            BookedSession(row[0], bytes(row[1]), Armed.from_json(row[2]) if row[2] else None)
            for row in rows
        ]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
