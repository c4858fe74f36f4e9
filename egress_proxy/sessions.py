"""Sessions: one record stream, one bearer token, and the pins that apply to its calls.

A session is opened (here in-process; later over the gRPC control plane) with the recipient
keys its stream is sealed to. The stream is named by the session id, a UUIDv7, and the data
plane serves the session under ``/s/{session}/``, so an OpenAI or Anthropic SDK selects a
session by its ``base_url`` and authenticates with the token as its API key.

Pins are set at opening or later (``set_pins``: the plain method the gRPC control plane will
call); each setting is recorded as ``pins.set`` before it takes effect, so every call it
touches comes after it in the stream. ``pins`` explains what a pin means to each upstream.

Only a SHA-256 of each token is kept, compared in constant time; an unknown session and a
wrong token get the same answer, so the data plane is no oracle for which sessions exist.
Sessions live in memory: after a restart their streams stay in the record, but their tokens
are gone and clients must open new sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import uuid6
from pydantic import JsonValue

from egress_proxy.clock import Clock
from egress_proxy.errors import Unauthorized
from egress_proxy.pins import PINNABLE, pins_entry, validate_pins
from egress_proxy.tool_ids import ToolIdTable
from record.log import Appended, Log
from record.seal import KeyPair, RecipientKey

if TYPE_CHECKING:
    from egress_proxy.replay_plan import ReplayPlan

__all__ = [
    "PINNABLE",
    "REPLAYS_LABEL",
    "OpenedSession",
    "Session",
    "SessionRegistry",
    "token_from_headers",
]


#: The label that names, in ``stream.opened``, the recorded stream a session replays.
REPLAYS_LABEL = "affidavit/replays"


class OpenedSession(NamedTuple):
    """What the opener hands to the client: ``base_url`` is the session's root."""

    session_id: str
    token: str
    base_url: str

    @property
    def openai_base_url(self) -> str:
        """For ``openai.OpenAI(base_url=…)``, which appends ``/chat/completions``."""
        return self.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """For ``anthropic.Anthropic(base_url=…)``, which appends ``/v1/messages``."""
        return self.base_url


@dataclass
class Session:
    id: str
    token_digest: bytes
    labels: dict[str, str]
    pins: dict[str, JsonValue] | None = None  # replaced whole, never changed in place
    latest_checkpoint: bytes | None = None  # the newest signed note of this stream
    clock: Clock | None = None  # overrides the proxy's clock (a replay plan pins it here)
    tool_ids: ToolIdTable = field(default_factory=ToolIdTable, repr=False)
    replay: ReplayPlan | None = field(default=None, repr=False)  # armed: re-execute
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def noted(self, appended: Appended) -> None:
        """Keep the newest checkpoint an append produced (the annotation hands it out)."""
        if appended.checkpoint is not None:
            with self._lock:
                self.latest_checkpoint = appended.checkpoint


def _token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


_NO_SESSION = _token_digest(secrets.token_urlsafe(32))  # compared against when none matches


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """The client's token: ``Authorization: Bearer …`` (OpenAI SDK) or ``x-api-key`` (Anthropic)."""
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


class SessionRegistry:
    """Open sessions and authenticate data-plane requests against them (thread-safe)."""

    def __init__(self, log: Log, base_url: str = "") -> None:
        self.log = log
        self.base_url = base_url.rstrip("/")  # the data plane's root, set once it listens
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._pins_lock = threading.Lock()  # one pins.set at a time: record order = effect order

    def open_session(
        self,
        recipients: Sequence[RecipientKey],
        labels: Mapping[str, str] | None = None,
        pins: Mapping[str, JsonValue] | None = None,
    ) -> OpenedSession:
        """Open a stream sealed to ``recipients`` (and the appliance key) and issue a token.

        Blocks until ``stream.opened`` (and ``pins.set``, when pinned) are durable. Bad pins
        are a ``ValueError`` naming the pin, raised before anything is recorded.
        """
        checked = validate_pins(pins) if pins else None
        session_id = str(uuid6.uuid7())
        keys = list(_with_appliance(recipients, self.log))
        session = Session(session_id, b"", dict(labels or {}), checked)
        session.noted(self.log.open_stream(session_id, keys, session.labels))
        if checked:
            session.noted(self.log.append(session_id, pins_entry(checked)))
        token = secrets.token_urlsafe(32)
        session.token_digest = _token_digest(token)
        with self._lock:
            self._sessions[session_id] = session
        return OpenedSession(session_id, token, f"{self.base_url}/s/{session_id}")

    def authenticate(self, session_id: str, token: str | None) -> Session:
        """The session, if ``token`` is its token; otherwise ``Unauthorized``."""
        with self._lock:
            session = self._sessions.get(session_id)
        expected = session.token_digest if session is not None else _NO_SESSION
        presented = _token_digest(token) if token is not None else b""
        if session is None or not hmac.compare_digest(presented, expected):
            raise Unauthorized("no session at this path accepts this token")
        return session

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def set_pins(self, session: str | Session, pins: Mapping[str, JsonValue] | None) -> Appended:
        """Replace a session's pins (None or empty: unpin); returns the ``pins.set`` entry.

        The entry is durable before the new pins apply: a call whose ``pins`` stage has
        already run keeps the pins it was sent with, and its ``model.request`` says which.
        """
        target = self.get(session) if isinstance(session, str) else session
        if target is None:
            raise KeyError(f"no open session {session!r}")
        checked = validate_pins(pins) if pins else {}
        with self._pins_lock:
            appended = self.log.append(target.id, pins_entry(checked))
            target.noted(appended)
            target.pins = checked or None
        return appended

    def arm_replay(
        self,
        session: str | Session | None,
        replays: str,
        key: KeyPair | None = None,
        recipients: Sequence[RecipientKey] = (),
        turn: int | None = None,
        pins_override: Mapping[str, JsonValue] | None = None,
    ) -> tuple[Session, OpenedSession | None]:
        """Arm a replay plan of the recorded stream ``replays`` on a session.

        ``session`` None opens a new one (sealed to ``recipients`` and the appliance key)
        whose ``stream.opened`` names ``replays`` under ``REPLAYS_LABEL``; an open session
        must have been opened with that label. ``key`` opens the old stream (default: the
        appliance key). The plan is read before anything is armed; a session already armed is
        refused (``ValueError``). ``turn`` narrows the plan to that turn of ``replays``;
        ``pins_override`` replaces the recorded pins of every step (a negative control).
        """
        from egress_proxy.replay_plan import load_plan

        opener = key if key is not None else self.log.appliance_key
        if opener is None:
            raise ValueError("arming a replay needs a key that opens the replayed stream")
        plan = load_plan(self.log, replays, opener, turn)
        if pins_override:
            plan.pins_override = validate_pins(pins_override)
        opened = None
        if session is None:
            opened = self.open_session(recipients, {REPLAYS_LABEL: replays})
            session = opened.session_id
        target = self.get(session) if isinstance(session, str) else session
        if target is None:
            raise KeyError(f"no open session {session!r}")
        if target.labels.get(REPLAYS_LABEL) != replays:
            raise ValueError(
                f"session {target.id} was not opened with label {REPLAYS_LABEL}={replays}"
            )
        with self._pins_lock:
            if target.replay is not None:
                raise ValueError(f"session {target.id} is already armed")
            target.replay = plan
        return target, opened


def _with_appliance(recipients: Iterable[RecipientKey], log: Log) -> Iterable[RecipientKey]:
    """The given recipients plus the appliance's own key, so recovery can open the stream."""
    seen: set[str] = set()
    extra = [log.appliance_key.recipient] if log.appliance_key is not None else []
    for key in [*recipients, *extra]:
        if key.text() not in seen:
            seen.add(key.text())
            yield key
