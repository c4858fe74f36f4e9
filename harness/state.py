"""The user's state folder: where the harness finds the appliance and keeps what it must not lose.

Layout (``$AFFIDAVIT_HOME``, else ``.affidavit`` in the working directory)::

    appliance.json            written by ``affidavit up``: proxy URL, control socket, store, model
    up.lock                   held (``flock``) by the running ``affidavit up``; holds its pid
    user.key                  the user's X25519 key (0600): a recipient of every session
    sessions/<id>.json        one per session: token, base URL, pins, turns, status
    checkpoints/<id>/<n>.note every checkpoint an annotation handed back (tree size ``n``)

Files are written whole to a temporary name and renamed, so a crash never leaves half a file.
A session's token is a secret: session files are 0600, like the key.

One ``affidavit up`` per home: it holds ``up.lock`` with an advisory ``flock`` for its whole
life, and the kernel lets go of it when the process dies, SIGKILL included, so a pid that was
reused can never make a dead appliance look alive. ``appliance.json`` beside a free lock was
left by a stopped ``up``: :meth:`Home.appliance` says so instead of handing out a dead socket.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue

# A home's store may be ``control:/…/control.sock`` (the appliance's readers have no route to
# its database): the proxy's reader registers that scheme with ``record.backends``.
import egress_proxy.control_store  # noqa: F401

__all__ = [
    "Appliance",
    "ApplianceGone",
    "Home",
    "HomeError",
    "HomeInUse",
    "HomeLock",
    "HomeMissing",
    "KeyFileInvalid",
    "PinsRefused",
    "SessionState",
    "SessionUnknown",
    "TurnUnknown",
    "default_home",
]

SessionStatus = Literal["idle", "running", "needs_decision", "stopped"]


class HomeError(Exception):
    """An expected condition of the state folder: one line for people, and its exit code."""

    exit_code = 1
    prefix = "error"


class HomeMissing(HomeError):
    """Something the command needs is not in the state folder (exit 3)."""

    exit_code = 3
    prefix = "missing"


class ApplianceGone(HomeMissing):
    """``appliance.json`` names an appliance that is not running (its ``up`` stopped or was
    killed), or its control socket does not answer."""


class SessionUnknown(HomeMissing):
    """No such session in the state folder or the record (a mistyped id: never tampering)."""


class TurnUnknown(HomeMissing):
    """The session has no such turn."""


class PinsRefused(HomeError):
    """The appliance refuses pinned sessions: its check of its own evidence failed, or has
    not run yet (``egress_proxy.tee_status``); the message is the proxy's (exit 1)."""


class KeyFileInvalid(HomeError):
    """A key file that is there but is not a usable key (exit 2: the file given is wrong)."""

    exit_code = 2


class HomeInUse(HomeError):
    """Another ``affidavit up`` holds the state folder (exit 2: choose another ``--home``)."""

    exit_code = 2


class Appliance(BaseModel):
    """Where the running appliance is (``affidavit up`` writes it; every command reads it)."""

    model_config = ConfigDict(extra="forbid")

    proxy_url: str
    control_socket: str
    store: str
    model: str
    api: Literal["openai", "anthropic"] = "openai"  # the model API its provider speaks
    engine_url: str | None = None
    external_url: str | None = None  # the TLS address outside users reach (``up --external``)
    search_url: str | None = None  # web_search's endpoint, ``{query}`` replaced (through fetch)
    mcp_servers: dict[str, list[str]] = {}  # server -> its idempotent tools
    pid: int | None = None
    #: The appliance's log key (C2SP verifier key of its checkpoints): on a store several
    #: appliances share, the one this home's streams must be signed by.
    log_key: str | None = None


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

    @property
    def lock_file(self) -> Path:
        return self.root / "up.lock"

    def appliance(self) -> Appliance:
        """The running appliance; ``ApplianceGone`` when its ``up`` has stopped (the lock is
        free) although ``appliance.json`` is still there."""
        if not self.appliance_file.is_file():
            raise HomeMissing(
                f"no appliance is running on {self.root}: start one with `affidavit up`"
                f" (looked for {self.appliance_file})"
            )
        appliance = self.recorded_appliance()
        if appliance is None:
            raise ApplianceGone(
                f"{self.appliance_file} is not an appliance file: run `affidavit up`"
            )
        if self.lock_file.is_file() and not HomeLock.held(self.lock_file):
            raise ApplianceGone(self._stopped_line(appliance.pid))
        return appliance

    def recorded_appliance(self) -> Appliance | None:
        """What ``appliance.json`` says, running or not (None: no file, or not one)."""
        try:
            return Appliance.model_validate_json(self.appliance_file.read_bytes())
        except (OSError, ValueError):
            return None

    def _stopped_line(self, pid: int | None) -> str:
        by = f", pid {pid}" if pid is not None else ""
        return (
            f"no appliance is running on {self.root} (left by a stopped `affidavit up`{by}):"
            " run `affidavit up`"
        )

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
            raise SessionUnknown(f"no session {session_id!r} in {self.root} (no {path})")
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


_TAKE_ATTEMPTS = 10


@dataclass
class HomeLock:
    """``up.lock``, held with ``flock`` by the one ``affidavit up`` of a home for its life.

    The lock is the truth about who runs, not a pid (pids get reused): the kernel drops it
    when its holder dies however it dies. The file stays (unlinking a lock file races with
    the next taker); it holds the holder's pid, for the refusal to name."""

    path: Path
    fd: int

    @classmethod
    def take(cls, home: Home) -> HomeLock:
        """Hold ``home``; ``HomeInUse`` naming the running ``up``'s pid and URL otherwise."""
        home.root.mkdir(parents=True, exist_ok=True)
        path = home.lock_file
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        for attempt in range(_TAKE_ATTEMPTS):  # a reader's probe holds it for an instant
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if attempt + 1 == _TAKE_ATTEMPTS:
                    os.close(fd)
                    raise HomeInUse(_in_use_line(home)) from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        os.close(self.fd)  # closing the last descriptor drops the flock

    @staticmethod
    def held(path: Path) -> bool:
        """Whether some process holds ``path`` now (a probe: taken and dropped at once)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        finally:
            os.close(fd)
        return False


def _in_use_line(home: Home) -> str:
    try:
        pid = home.lock_file.read_text().strip() or "unknown"
    except OSError:
        pid = "unknown"
    recorded = home.recorded_appliance()
    url = recorded.proxy_url if recorded is not None else "still starting"
    return (
        f"{home.root} is in use by `affidavit up` pid {pid} (proxy {url}):"
        " stop it first, or give another --home"
    )
