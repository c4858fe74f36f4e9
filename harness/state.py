"""The user's state folder: where the harness finds the appliance and keeps what it must not lose.

Layout (``$AFFIDAVIT_HOME``, else ``.affidavit`` in the working directory)::

    appliance.json            written by ``affidavit up``: proxy URL, control socket, store, model
    user.key                  the user's X25519 key (0600): a recipient of every session
    sessions/<id>.json        one per session: token, base URL, pins, turns, status
    checkpoints/<id>/<n>.note every checkpoint an annotation handed back (tree size ``n``)

Files are written whole to a temporary name and renamed, so a crash never leaves half a file.
A session's token is a secret: session files are 0600, like the key.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = ["Appliance", "Home", "HomeMissing", "SessionState", "default_home"]

SessionStatus = Literal["idle", "running", "needs_decision", "stopped"]


class HomeMissing(Exception):
    """Something the command needs is not in the state folder (exit 3)."""


class Appliance(BaseModel):
    """Where the running appliance is (``affidavit up`` writes it; every command reads it)."""

    model_config = ConfigDict(extra="forbid")

    proxy_url: str
    control_socket: str
    store: str
    model: str
    api: Literal["openai", "anthropic"] = "openai"  # the model API its provider speaks
    engine_url: str | None = None
    search_url: str | None = None  # web_search's endpoint, ``{query}`` replaced (through fetch)
    mcp_servers: dict[str, list[str]] = {}  # server -> its idempotent tools
    pid: int | None = None


@dataclass
class SessionState:
    """What the harness keeps about one session between commands."""

    session_id: str
    token: str
    base_url: str
    pins: dict[str, JsonValue] | None = None
    turns: int = 0  # turns started so far (the next turn's number)
    status: SessionStatus = "idle"
    pending: dict[str, Any] | None = None  # needs_decision: the tool call waiting on a person
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        return bool(self.pins)


def default_home() -> Path:
    return Path(os.environ.get("AFFIDAVIT_HOME") or ".affidavit")


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def at(cls, root: Path | str | None = None) -> Home:
        return cls(Path(root) if root is not None else default_home())

    # -- the appliance ----------------------------------------------------------------------

    @property
    def appliance_file(self) -> Path:
        return self.root / "appliance.json"

    def appliance(self) -> Appliance:
        if not self.appliance_file.is_file():
            raise HomeMissing(
                f"no appliance is running for {self.root}: start one with `affidavit up`"
                f" (looked for {self.appliance_file})"
            )
        return Appliance.model_validate_json(self.appliance_file.read_bytes())

    def write_appliance(self, appliance: Appliance) -> None:
        write_atomic(self.appliance_file, appliance.model_dump_json(indent=2).encode(), 0o644)

    # -- keys -------------------------------------------------------------------------------

    @property
    def user_key_file(self) -> Path:
        return self.root / "user.key"

    # -- sessions ---------------------------------------------------------------------------

    def session_file(self, session_id: str) -> Path:
        return self.root / "sessions" / f"{session_id}.json"

    def session(self, session_id: str) -> SessionState:
        path = self.session_file(session_id)
        if not path.is_file():
            raise HomeMissing(f"no session {session_id} in {self.root} (no {path})")
        return SessionState(**json.loads(path.read_bytes()))

    def save_session(self, state: SessionState) -> None:
        data = json.dumps(asdict(state), indent=2, sort_keys=True).encode()
        write_atomic(self.session_file(state.session_id), data)

    def sessions(self) -> list[SessionState]:
        folder = self.root / "sessions"
        if not folder.is_dir():
            return []
        return [self.session(path.stem) for path in sorted(folder.glob("*.json"))]

    # -- checkpoints --------------------------------------------------------------------------

    def keep_checkpoint(self, stream: str, note: str | bytes) -> Path | None:
        """Keep a checkpoint an annotation handed back; returns its path (None: not a note)."""
        data = note.encode() if isinstance(note, str) else note
        lines = data.split(b"\n")
        if len(lines) < 3 or not lines[1].isdigit():
            return None
        path = self.root / "checkpoints" / stream / f"{int(lines[1])}.note"
        if not path.exists():
            write_atomic(path, data, 0o644)
        return path

    def checkpoints(self, stream: str) -> list[Path]:
        folder = self.root / "checkpoints" / stream
        if not folder.is_dir():
            return []
        return sorted(folder.glob("*.note"), key=lambda p: int(p.stem))
