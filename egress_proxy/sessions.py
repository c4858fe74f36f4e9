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

Sessions survive a restart. With a ``SessionBook`` (``session_book``) the registry notes each
session's token digest when it opens and its replay plan when it is armed; everything else
a session is, the record already says. ``restore`` rebuilds every noted session before the
proxy serves: labels from ``stream.opened``, pins from the last ``pins.set``, the tool-call
id mapping from the ``model.response`` entries, the newest checkpoint from the store, and an
armed plan read again and moved on past the steps the stream shows it served. The same
``base_url`` and token then keep working.
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
from egress_proxy.errors import ConfigError, Unauthorized
from egress_proxy.pins import PINNABLE, pins_entry, validate_pins
from egress_proxy.session_book import Armed, BookedSession, SessionBook
from egress_proxy.tool_ids import RECORD_KEY, ToolIdTable
from record.continuation import LinkBroken, check_link_in
from record.errors import CannotOpen, RecordError
from record.log import Appended, Log
from record.reader import StreamKeys
from record.schema import Continuation, ModelResponse, PinsSet, StreamOpened, parse_entry
from record.seal import KeyPair, RecipientKey

if TYPE_CHECKING:
    from egress_proxy.replay_plan import ReplayPlan

__all__ = [
    "PINNABLE",
    "REPLAYS_LABEL",
    "OpenedSession",
    "Restored",
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


@dataclass(frozen=True)
class Restored:
    """What ``SessionRegistry.restore`` did: the sessions back, and each one left out, why."""

    sessions: list[str]
    left_out: dict[str, str]


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

    def __init__(self, log: Log, base_url: str = "", book: SessionBook | None = None) -> None:
        self.log = log
        self.base_url = base_url.rstrip("/")  # the data plane's root, set once it listens
        self.book = book  # where sessions are noted to survive a restart (None: memory only)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._pins_lock = threading.Lock()  # one pins.set at a time: record order = effect order

    def open_session(
        self,
        recipients: Sequence[RecipientKey],
        labels: Mapping[str, str] | None = None,
        pins: Mapping[str, JsonValue] | None = None,
        continues: Continuation | None = None,
    ) -> OpenedSession:
        """Open a stream sealed to ``recipients`` (and the appliance key) and issue a token.

        Blocks until ``stream.opened`` (and ``pins.set``, when pinned) are durable, and the
        token's digest is in the session book. Bad pins are a ``ValueError`` naming the pin,
        raised before anything is recorded. ``continues``: the stream carries on another
        appliance's (``record.continuation``); a link that does not hold against the store,
        or names a stream this appliance writes itself, is a ``ValueError`` saying why.
        """
        checked = validate_pins(pins) if pins else None
        if continues is not None:
            self._may_continue(continues)
        session_id = str(uuid6.uuid7())
        keys = list(_with_appliance(recipients, self.log))
        session = Session(session_id, b"", dict(labels or {}), checked)
        session.noted(self.log.open_stream(session_id, keys, session.labels, continues=continues))
        if checked:
            session.noted(self.log.append(session_id, pins_entry(checked)))
        token = secrets.token_urlsafe(32)
        session.token_digest = _token_digest(token)
        if self.book is not None:
            self.book.add(session_id, session.token_digest)
        with self._lock:
            self._sessions[session_id] = session
        return OpenedSession(session_id, token, f"{self.base_url}/s/{session_id}")

    def _may_continue(self, link: Continuation) -> None:
        """The link holds against the named stream as the store has it, and that stream is
        another appliance's: one this appliance opened it writes on, and resumes, itself."""
        opened = check_link_in(self.log.store, link)
        if opened.log_key == self.log.signer.vkey():
            raise LinkBroken(
                f"stream {link.stream!r} is this appliance's own: resume it, do not continue it"
            )

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
            if self.book is not None:
                self.book.arm(target.id, Armed(replays, turn, plan.pins_override))
            target.replay = plan
        return target, opened

    def restore(self) -> Restored:
        """Rebuild every session the book notes, from the book and the record; run before
        serving. A session whose stream is gone or cannot be opened with the appliance key is
        left out (named, with why), never half restored."""
        if self.book is None:
            return Restored([], {})
        if self.log.appliance_key is None:
            raise ConfigError("restoring sessions needs the log opened with the appliance key")
        back: list[str] = []
        left_out: dict[str, str] = {}
        for booked in self.book.sessions():
            try:
                session = self._rebuilt(booked, self.log.appliance_key)
            except (CannotOpen, RecordError, KeyError, ValueError) as exc:
                left_out[booked.id] = f"{type(exc).__name__}: {exc}"
                continue
            with self._lock:
                self._sessions[session.id] = session
            back.append(session.id)
        return Restored(back, left_out)

    def _rebuilt(self, booked: BookedSession, key: KeyPair) -> Session:
        """One session as its record and its book row say it was."""
        from egress_proxy.replay_plan import load_plan

        store = self.log.store
        entries = [parse_entry(stored.line) for stored in store.entries(booked.id)]
        if not entries or entries[0].kind != "stream.opened":
            raise KeyError(f"the record holds no stream {booked.id!r}")
        keys = StreamKeys.collect(booked.id, entries, key)
        opened = keys.open(entries[0])
        assert isinstance(opened, StreamOpened)
        session = Session(booked.id, booked.token_digest, dict(opened.labels))
        wanted = {"pins.set", "model.response"}
        if booked.armed is not None:  # the plan's place: steps asked, results served
            wanted |= {"model.request", "tool.result", "fetch.response"}
        bodies = [(e.seq, keys.open(e)) for e in entries if e.kind in wanted]
        for _, body in bodies:
            if isinstance(body, PinsSet):
                session.pins = dict(body.pins) or None
            elif isinstance(body, ModelResponse):
                pairs = (body.reproducibility or {}).get(RECORD_KEY)
                for pair in pairs if isinstance(pairs, list) else []:
                    if isinstance(pair, dict):
                        session.tool_ids.add(str(pair["derived"]), str(pair["upstream"]))
        checkpoints = store.checkpoints(booked.id)
        session.latest_checkpoint = checkpoints[-1].note if checkpoints else None
        if booked.armed is not None:
            armed = booked.armed
            plan = load_plan(self.log, armed.source, key, armed.turn)
            plan.pins_override = armed.pins_override
            plan.catch_up(bodies)
            session.replay = plan
        return session


def _with_appliance(recipients: Iterable[RecipientKey], log: Log) -> Iterable[RecipientKey]:
    """The given recipients plus the appliance's own key, so recovery can open the stream."""
    seen: set[str] = set()
    extra = [log.appliance_key.recipient] if log.appliance_key is not None else []
    for key in [*recipients, *extra]:
        if key.text() not in seen:
            seen.add(key.text())
            yield key
