"""Sessions: one record stream, one bearer token, and the pins that apply to its calls.

A session is opened (here in-process; later over the gRPC control plane) with the recipient
keys its stream is sealed to. The stream is named by the session id, a UUIDv7, and the data
plane serves the session under ``/s/{session}/``, so an OpenAI or Anthropic SDK selects a
session by its ``base_url`` and authenticates with the token as its API key.

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
from typing import NamedTuple

import uuid6
from pydantic import JsonValue

from egress_proxy.errors import Unauthorized
from record.log import Appended, Log
from record.schema import PinsSet
from record.seal import RecipientKey

#: Request members a session may pin; each dialect applies the ones its API has.
PINNABLE = frozenset({"seed", "temperature", "top_p", "top_k", "max_tokens"})


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
    pins: dict[str, JsonValue] | None = None
    latest_checkpoint: bytes | None = None  # the newest signed note of this stream
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

    def open_session(
        self,
        recipients: Sequence[RecipientKey],
        labels: Mapping[str, str] | None = None,
        pins: Mapping[str, JsonValue] | None = None,
    ) -> OpenedSession:
        """Open a stream sealed to ``recipients`` (and the appliance key) and issue a token.

        Blocks until ``stream.opened`` (and ``pins.set``, when pinned) are durable.
        """
        if pins is not None:
            unknown = sorted(set(pins) - PINNABLE)
            if unknown:
                raise ValueError(f"cannot pin {unknown}: pinnable members are {sorted(PINNABLE)}")
        session_id = str(uuid6.uuid7())
        keys = list(_with_appliance(recipients, self.log))
        session = Session(session_id, b"", dict(labels or {}), dict(pins) if pins else None)
        session.noted(self.log.open_stream(session_id, keys, session.labels))
        if session.pins:
            session.noted(self.log.append(session_id, PinsSet(pins=session.pins)))
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


def _with_appliance(recipients: Iterable[RecipientKey], log: Log) -> Iterable[RecipientKey]:
    """The given recipients plus the appliance's own key, so recovery can open the stream."""
    seen: set[str] = set()
    extra = [log.appliance_key.recipient] if log.appliance_key is not None else []
    for key in [*recipients, *extra]:
        if key.text() not in seen:
            seen.add(key.text())
            yield key
