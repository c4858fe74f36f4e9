"""The control plane: gRPC over a Unix socket, for the harness (``proto/control.proto``).

The harness has no other way to write the record: it opens sessions, sets pins and appends
its own events (``turn.started``, ``turn.ended``) here, and the proxy's ``Log`` stays the
single writer. ``StreamEntries`` hands out a stream's stored lines, exact bytes, for the panel
and for mirroring; each line travels in chunks of at most 1 MiB, so no line is too big for a
message limit. ``ArmReplay`` arms a replay plan (``SessionRegistry.arm_replay``, with the
appliance key) and ``GetVerdicts`` hands out its per-step verdicts. ``FetchCollateral`` has
the proxy GET one KDS document and record it (``egress_proxy.collateral``), for the appliance's
boot evidence; it runs on the data plane's event loop, where the network transport lives,
through the ``FetchCollateral`` callable the server hands in (none: the RPC is refused).
``StoreInfo``, ``ListStreams``, ``StreamState``, ``StreamCheckpoints``, ``StreamEvidence`` and
``GetMeta`` (with ``StreamEntries``) call the store's read methods and nothing else, for a
reader with no route to the store (``egress_proxy.control_store``, ``control:`` locations).

Access is the socket's: it is made 0600 once bound, and callers present no token (the
session tokens are for the data plane). ``ControlClient`` is the typed client the harness and
the tests use; the handlers are registered by hand, so no generated service stubs are needed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message
from pydantic import JsonValue, TypeAdapter, ValidationError

from egress_proxy.collateral import Collateral
from egress_proxy.errors import MalformedFetch, ProxyError, ReplayMiss
from egress_proxy.proto import control_pb2 as pb
from egress_proxy.sessions import Session, SessionRegistry
from egress_proxy.tee_status import REFUSAL, TeeStatusError, pins_refusal, read_tee_status
from record.digest import Domain, digest
from record.errors import SchemaError
from record.limits import JsonRefused, load_json
from record.schema import Continuation, StreamName, describe, parse_body
from record.seal import RecipientKey
from record.sqlite_store import SQLiteStore
from record.store import Lease, LogStore, StoredCheckpoint

__all__ = [
    "CHUNK",
    "HARNESS_KINDS",
    "META_KEY",
    "SERVICE",
    "ControlClient",
    "ControlPlane",
    "ControlServicer",
    "FetchCollateral",
]

SERVICE = "affidavit.control.v1.Control"
CHUNK = 1 << 20  # the most line bytes one EntryChunk carries
MAX_MESSAGE = 64 << 20  # a request (an AppendEvent body) may be this big
POLL = 0.05  # seconds between looks at a followed stream
MAX_SEQ = (1 << 63) - 1  # a seq past every store's (a signed 64-bit column)
WRITERS_KEPT = 3  # worker threads streamed reads never take: a turn's writes still run
EVIDENCE_WAIT_S = 5.0  # how long an evidence read waits for the one before it
NAMES = 1024  # stream names per ListStreams message

#: A store-wide value's key (the record's is ``log_key``): a short plain name.
META_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_STREAM_NAME: TypeAdapter[str] = TypeAdapter(StreamName)

#: The kinds a harness may append, with the bytes field, digest field and domain they pair
#: (None: the kind carries no bytes of its own).
HARNESS_KINDS: dict[str, tuple[str, str, Domain] | None] = {
    "turn.started": ("input_bytes", "input_digest", Domain.INPUT),
    "turn.ended": ("answer_bytes", "answer_digest", Domain.RESPONSE),
    "turn.decided": None,
}

_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]

#: Runs a collateral fetch for a session and path to its end (``ProxyServer`` makes one).
FetchCollateral = Callable[[Session, str], Collateral]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
_T = TypeVar("_T")


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _pins(text: str) -> dict[str, JsonValue] | None:
    if not text.strip():
        return None
    try:
        value = load_json(text)
    except JsonRefused as exc:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"pins_json is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "pins_json must be a JSON object")
    return value


def _continues(text: str) -> Continuation | None:
    if not text.strip():
        return None
    try:
        return Continuation.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise _Abort(
            grpc.StatusCode.INVALID_ARGUMENT, "continues_json: " + describe(exc, "continues")
        ) from None


def _stream(name: str) -> str:
    """``name`` if the record could hold a stream by it (``record.schema.StreamName``)."""
    try:
        return _STREAM_NAME.validate_python(name)
    except ValidationError as exc:
        said = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"stream: {said}") from None


def _unreadable(what: str, exc: Exception) -> _Abort:
    said = str(exc).strip().splitlines()
    return _Abort(
        grpc.StatusCode.INTERNAL,
        f"the store could not be read ({what}): {said[0] if said else type(exc).__name__}",
    )


def _read(what: str, read: Callable[[], _T]) -> _T:
    """A read of the store; a store that fails it (a database gone away) is said in one line,
    never the driver's traceback."""
    try:
        return read()
    except Exception as exc:
        raise _unreadable(what, exc) from None


def _each(what: str, items: Iterator[_T]) -> Iterator[_T]:
    """``items`` as they are read (a stream is never held whole), failures as ``_read``'s."""
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except Exception as exc:
            raise _unreadable(what, exc) from None
        yield item


def store_label(store: LogStore) -> str:
    """How readers name the proxy's store, as ``record.backends.store_label`` names its
    location: a file by its name, a database by its URL without the password."""
    if isinstance(store, SQLiteStore):
        return store.path.name
    name = getattr(store, "name", None)  # ``PostgresStore.name``: ``describe(conninfo)``
    return name if isinstance(name, str) else type(store).__name__


def _chunks(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``data`` in pieces of at most ``CHUNK`` bytes, with their offsets (empty: one piece),
    so no message limit bounds what a stream carries."""
    for offset in range(0, max(len(data), 1), CHUNK):
        yield offset, data[offset : offset + CHUNK]


class _Chunk(Protocol):
    offset: int
    size: int
    data: bytes


_C = TypeVar("_C", bound=_Chunk)


def _whole(chunks: Iterable[_C], name: Callable[[_C], str]) -> Iterator[tuple[_C, bytes]]:
    """What ``_chunks`` cut, put back together: each item's bytes, with its last chunk (its
    ``seq`` or ``name``); ``name`` says which item a missing chunk belongs to."""
    parts: list[bytes] = []
    last: _C | None = None
    for chunk in chunks:
        if chunk.offset != sum(map(len, parts)):
            raise RuntimeError(f"{name(chunk)}: a chunk is missing")
        parts.append(chunk.data)
        last = chunk
        if chunk.offset + len(chunk.data) == chunk.size:
            yield chunk, b"".join(parts)
            parts = []
    if parts and last is not None:
        raise RuntimeError(f"{name(last)}: the stream ended inside it")


def _lease(lease: Lease) -> pb.Lease:
    return pb.Lease(holder=lease.holder, since=lease.since, released=lease.released)


class ControlServicer:
    """The handlers, each a plain method over the registry and its log.

    ``readers``: how many streamed reads (entries, streams, checkpoints, evidence) may run at
    once. Each holds a worker thread while its client reads, so the rest of the pool stays
    for the writes a turn cannot do without (``AppendEvent``, ``OpenSession``); a read past
    the cap is refused at once (``RESOURCE_EXHAUSTED``), which ``ControlStore`` retries. One
    stream's evidence is read whole from the store, so only one such read runs at a time."""

    def __init__(
        self,
        registry: SessionRegistry,
        collateral: FetchCollateral | None = None,
        tee_status: Path | None = None,
        readers: int = 5,
    ) -> None:
        self.registry = registry
        self.log = registry.log
        self.collateral = collateral
        self.tee_status = tee_status
        self.readers = threading.BoundedSemaphore(readers)
        self.evidence_reader = threading.Lock()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A streamed read's turn: refused at once past ``readers``."""
        if not self.readers.acquire(blocking=False):
            raise _Abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many store reads at once on the control plane; try again",
            )
        try:
            yield
        finally:
            self.readers.release()

    def _may_pin(self, pins: Mapping[str, JsonValue] | None) -> None:
        """Refuse pins (``FAILED_PRECONDITION``) on an appliance whose check of its own
        evidence failed or has not run; the status file is read at each call (PID 1 writes
        it after the proxy started). No pins, or no status file configured: nothing to
        check."""
        if not pins or self.tee_status is None:
            return
        try:
            refusal = pins_refusal(read_tee_status(self.tee_status))
        except TeeStatusError as exc:
            refusal = f"the appliance's self-check status cannot be read ({exc})"
        if refusal is not None:
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, REFUSAL + refusal)

    def _session(self, session_id: str) -> Session:
        session = self.registry.get(session_id)
        if session is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no open session {session_id!r}")
        return session

    def open_session(self, request: pb.OpenSessionRequest) -> pb.OpenSessionResponse:
        try:
            recipients = [RecipientKey.from_text(text) for text in request.recipients]
        except Exception as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad recipient key: {exc}") from None
        if not recipients and self.log.appliance_key is None:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "a session needs a recipient key")
        pins = _pins(request.pins_json)
        continues = _continues(request.continues_json)
        self._may_pin(pins)
        try:
            opened = self.registry.open_session(
                recipients, dict(request.labels), pins, continues=continues
            )
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return pb.OpenSessionResponse(
            session_id=opened.session_id,
            token=opened.token,
            path=f"/s/{opened.session_id}",
            base_url=opened.base_url,
        )

    def set_pins(self, request: pb.SetPinsRequest) -> pb.SetPinsResponse:
        session = self._session(request.session_id)
        pins = _pins(request.pins_json)
        self._may_pin(pins)
        try:
            appended = self.registry.set_pins(session, pins)
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return pb.SetPinsResponse(seq=appended.seq)

    def append_event(self, request: pb.AppendEventRequest) -> pb.AppendEventResponse:
        if request.kind not in HARNESS_KINDS:
            allowed = ", ".join(sorted(HARNESS_KINDS))
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{request.kind!r} is not a harness event (allowed: {allowed})",
            )
        session = self._session(request.session_id)
        try:
            body = parse_body(request.kind, request.body_json)
        except SchemaError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        pair = HARNESS_KINDS[request.kind]
        if pair is not None:
            data_field, digest_field, domain = pair
            data: bytes | None = getattr(body, data_field)
            stated: str | None = getattr(body, digest_field)
            if (data is None) != (stated is None) or (
                data is not None and digest(domain, data) != stated
            ):
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{digest_field} is not the digest of {data_field}",
                )
        appended = self.log.append(session.id, body)
        session.noted(appended)
        response = pb.AppendEventResponse(seq=appended.seq, event_id=appended.event_id)
        if appended.checkpoint is not None:
            response.checkpoint = appended.checkpoint
        return response

    def arm_replay(self, request: pb.ArmReplayRequest) -> pb.ArmReplayResponse:
        session = self._session(request.session_id)
        try:
            turn = request.turn if request.HasField("turn") else None
            override = _pins(request.pins_json)
            armed, _ = self.registry.arm_replay(
                session, request.source_stream, turn=turn, pins_override=override
            )
        except KeyError as exc:
            raise _Abort(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        plan = armed.replay
        assert plan is not None
        index = plan.transport.index
        tools = len(index.of_kind("tool")) + len(index.of_kind("fetch"))
        return pb.ArmReplayResponse(model_steps=len(plan.steps), tool_calls=tools)

    def get_verdicts(self, request: pb.GetVerdictsRequest) -> pb.GetVerdictsResponse:
        plan = self._session(request.session_id).replay
        if plan is None:
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, "the session is not armed")
        summary = plan.summary()
        return pb.GetVerdictsResponse(
            source_stream=plan.source,
            verdicts_json=[json.dumps(v, sort_keys=True) for v in summary["verdicts"]],
            tools_replayed=summary["tools_replayed"],
            live_calls=summary["live_calls"],
        )

    def archive_evidence(self, request: pb.ArchiveEvidenceRequest) -> pb.ArchiveEvidenceResponse:
        if not self.log.store.size(request.stream):
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no stream {request.stream!r}")
        try:
            appended = self.log.archive_evidence(
                request.stream, request.evidence_kind, request.name, request.data
            )
        except (ValueError, SchemaError) as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        session = self.registry.get(request.stream)
        if session is not None:
            session.noted(appended)
        return pb.ArchiveEvidenceResponse(seq=appended.seq, occurred_at=appended.occurred_at)

    def fetch_collateral(self, request: pb.FetchCollateralRequest) -> pb.FetchCollateralResponse:
        session = self._session(request.session_id)
        if self.collateral is None:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this proxy fetches no collateral ([collateral] enabled = false, or it has no"
                " network transport)",
            )
        try:
            got = self.collateral(session, request.path)
        except (MalformedFetch, ReplayMiss) as exc:  # refused before anything was recorded
            code = grpc.StatusCode.INVALID_ARGUMENT
            if isinstance(exc, ReplayMiss):
                code = grpc.StatusCode.FAILED_PRECONDITION
            raise _Abort(code, str(exc)) from None
        except ProxyError as exc:  # recorded: the fetch's outcome names it
            raise _Abort(grpc.StatusCode.UNAVAILABLE, f"{exc.code}: {exc}") from None
        except TimeoutError:  # still running: it is recorded to its end all the same
            raise _Abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"collateral: {request.path}: no answer in time"
            ) from None
        return pb.FetchCollateralResponse(
            status=got.status,
            body=got.body,
            request_seq=got.request_seq,
            response_seq=got.response_seq,
        )

    def stream_entries(
        self, request: pb.StreamEntriesRequest, active: Callable[[], bool]
    ) -> Iterator[pb.EntryChunk]:
        store = self.log.store
        stream = _stream(request.stream)
        if not _read("size", lambda: store.size(stream)):
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no stream {stream!r}")
        seq = min(request.from_seq, MAX_SEQ)  # past any seq a store holds: reads as none
        stop = min(request.stop_seq, MAX_SEQ) if request.HasField("stop_seq") else None
        while active():
            sent = False
            for entry in _each("entries", store.entries(stream, seq, stop)):
                line = entry.line
                for offset, data in _chunks(line):
                    yield pb.EntryChunk(seq=entry.seq, size=len(line), offset=offset, data=data)
                seq = entry.seq + 1
                sent = True
            if not request.follow or (stop is not None and seq >= stop):
                return
            if not sent:
                time.sleep(POLL)

    # -- reading the store (``egress_proxy.control_store.ControlStore``) -----------------------

    def store_info(self, request: pb.StoreInfoRequest) -> pb.StoreInfoResponse:
        store = self.log.store
        return pb.StoreInfoResponse(shared=store.shared, label=store_label(store))

    def list_streams(self, request: pb.ListStreamsRequest) -> Iterator[pb.StreamNames]:
        names = _read("streams", self.log.store.streams)
        for start in range(0, len(names), NAMES):
            yield pb.StreamNames(streams=names[start : start + NAMES])

    def stream_state(self, request: pb.StreamStateRequest) -> pb.StreamStateResponse:
        store, stream = self.log.store, _stream(request.stream)
        response = pb.StreamStateResponse(size=_read("size", lambda: store.size(stream)))
        lease = _read("lease", lambda: store.lease(stream))
        if lease is not None:
            response.lease.CopyFrom(_lease(lease))
        if request.check_writer:
            response.writer_alive = _read("writer", lambda: store.writer_alive(stream))
        return response

    def stream_checkpoints(
        self, request: pb.StreamCheckpointsRequest
    ) -> Iterator[pb.CheckpointNote]:
        store, stream = self.log.store, _stream(request.stream)
        found: list[StoredCheckpoint] = _read("checkpoints", lambda: store.checkpoints(stream))
        for checkpoint in found:
            yield pb.CheckpointNote(size=checkpoint.size, note=checkpoint.note)

    def stream_evidence(self, request: pb.StreamEvidenceRequest) -> Iterator[pb.EvidenceChunk]:
        store, stream = self.log.store, _stream(request.stream)
        if not self.evidence_reader.acquire(timeout=EVIDENCE_WAIT_S):
            raise _Abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "another stream's evidence is being read; try again",
            )
        try:  # held until sent: one stream's evidence in the proxy's memory at a time
            files = _read("evidence", lambda: store.evidence(stream))
            while files:  # each file let go once sent
                name, whole = files.pop(0)
                for offset, data in _chunks(whole):
                    yield pb.EvidenceChunk(name=name, size=len(whole), offset=offset, data=data)
        finally:
            self.evidence_reader.release()

    def get_meta(self, request: pb.GetMetaRequest) -> pb.GetMetaResponse:
        if not META_KEY.fullmatch(request.key):
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"key: not a meta key ([A-Za-z0-9._-], ≤64): {request.key!r}",
            )
        value = _read("meta", lambda: self.log.store.get_meta(request.key))
        return pb.GetMetaResponse() if value is None else pb.GetMetaResponse(value=value)


def _unary(
    call: Callable[[Req], Resp], request_type: type[Req]
) -> grpc.RpcMethodHandler[Req, Resp]:
    def behaviour(request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return call(request)
        except _Abort as exc:
            context.abort(exc.code, exc.details)

    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=request_type.FromString,
        response_serializer=lambda message: message.SerializeToString(),
    )


def _streaming(
    servicer: ControlServicer, call: Callable[[Req], Iterator[Resp]], request_type: type[Req]
) -> grpc.RpcMethodHandler[Req, Resp]:
    def behaviour(request: Req, context: grpc.ServicerContext) -> Iterator[Resp]:
        try:
            with servicer.reading():
                yield from call(request)
        except _Abort as exc:
            context.abort(exc.code, exc.details)

    return grpc.unary_stream_rpc_method_handler(
        behaviour,
        request_deserializer=request_type.FromString,
        response_serializer=lambda message: message.SerializeToString(),
    )


def _handler(servicer: ControlServicer) -> grpc.GenericRpcHandler:
    def entries(
        request: pb.StreamEntriesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EntryChunk]:
        try:
            with servicer.reading():
                yield from servicer.stream_entries(request, context.is_active)
        except _Abort as exc:
            context.abort(exc.code, exc.details)

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "OpenSession": _unary(servicer.open_session, pb.OpenSessionRequest),
        "SetPins": _unary(servicer.set_pins, pb.SetPinsRequest),
        "AppendEvent": _unary(servicer.append_event, pb.AppendEventRequest),
        "ArmReplay": _unary(servicer.arm_replay, pb.ArmReplayRequest),
        "GetVerdicts": _unary(servicer.get_verdicts, pb.GetVerdictsRequest),
        "ArchiveEvidence": _unary(servicer.archive_evidence, pb.ArchiveEvidenceRequest),
        "FetchCollateral": _unary(servicer.fetch_collateral, pb.FetchCollateralRequest),
        "StreamEntries": grpc.unary_stream_rpc_method_handler(
            entries,
            request_deserializer=pb.StreamEntriesRequest.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        ),
        "StoreInfo": _unary(servicer.store_info, pb.StoreInfoRequest),
        "ListStreams": _streaming(servicer, servicer.list_streams, pb.ListStreamsRequest),
        "StreamState": _unary(servicer.stream_state, pb.StreamStateRequest),
        "StreamCheckpoints": _streaming(
            servicer, servicer.stream_checkpoints, pb.StreamCheckpointsRequest
        ),
        "StreamEvidence": _streaming(servicer, servicer.stream_evidence, pb.StreamEvidenceRequest),
        "GetMeta": _unary(servicer.get_meta, pb.GetMetaRequest),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class ControlPlane:
    """The control plane's gRPC server on the Unix socket at ``path`` (made 0600)."""

    def __init__(
        self,
        registry: SessionRegistry,
        path: Path | str,
        *,
        workers: int = 8,
        collateral: FetchCollateral | None = None,
        tee_status: Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.servicer = ControlServicer(
            registry, collateral, tee_status, readers=max(1, workers - WRITERS_KEPT)
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers), options=_OPTIONS
        )
        self._server.add_generic_rpc_handlers((_handler(self.servicer),))
        self._lock = threading.Lock()
        self._started = False

    @property
    def target(self) -> str:
        return f"unix:{self.path}"

    def start(self) -> ControlPlane:
        with self._lock:
            if self.path.exists() and stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()  # a socket a previous run left behind
            if not self._server.add_insecure_port(self.target):
                raise RuntimeError(f"the control plane could not bind {self.target}")
            self._server.start()
            os.chmod(self.path, 0o600)
            self._started = True
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        with self._lock:
            if self._started:
                self._server.stop(grace).wait()
                self._started = False
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ControlClient:
    """A typed client of the control plane at ``path`` (a Unix socket)."""

    def __init__(self, path: Path | str) -> None:
        self.channel = grpc.insecure_channel(f"unix:{path}", options=_OPTIONS)

    def _call(self, name: str, request: Req, response_type: type[Resp], timeout: float) -> Resp:
        method: grpc.UnaryUnaryMultiCallable[Req, Resp] = self.channel.unary_unary(
            f"/{SERVICE}/{name}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        response: Resp = method(request, timeout=timeout)
        return response

    def open_session(
        self,
        recipients: list[RecipientKey],
        labels: Mapping[str, str] | None = None,
        pins: Mapping[str, JsonValue] | None = None,
        *,
        continues: Continuation | None = None,
        timeout: float = 30.0,
    ) -> pb.OpenSessionResponse:
        request = pb.OpenSessionRequest(
            recipients=[key.text() for key in recipients],
            labels=dict(labels or {}),
            pins_json=json.dumps(pins) if pins else "",
            continues_json=continues.model_dump_json() if continues is not None else "",
        )
        return self._call("OpenSession", request, pb.OpenSessionResponse, timeout)

    def set_pins(
        self, session_id: str, pins: Mapping[str, JsonValue] | None, *, timeout: float = 30.0
    ) -> pb.SetPinsResponse:
        request = pb.SetPinsRequest(session_id=session_id, pins_json=json.dumps(pins or {}))
        return self._call("SetPins", request, pb.SetPinsResponse, timeout)

    def append_event(
        self, session_id: str, kind: str, body: Mapping[str, Any] | bytes, *, timeout: float = 30.0
    ) -> pb.AppendEventResponse:
        data = body if isinstance(body, bytes) else json.dumps(dict(body)).encode()
        request = pb.AppendEventRequest(session_id=session_id, kind=kind, body_json=data)
        return self._call("AppendEvent", request, pb.AppendEventResponse, timeout)

    def arm_replay(
        self,
        session_id: str,
        source_stream: str,
        *,
        turn: int | None = None,
        pins: Mapping[str, JsonValue] | None = None,
        timeout: float = 30.0,
    ) -> pb.ArmReplayResponse:
        request = pb.ArmReplayRequest(session_id=session_id, source_stream=source_stream)
        if turn is not None:
            request.turn = turn
        if pins:
            request.pins_json = json.dumps(dict(pins))
        return self._call("ArmReplay", request, pb.ArmReplayResponse, timeout)

    def get_verdicts(self, session_id: str, *, timeout: float = 30.0) -> pb.GetVerdictsResponse:
        request = pb.GetVerdictsRequest(session_id=session_id)
        return self._call("GetVerdicts", request, pb.GetVerdictsResponse, timeout)

    def archive_evidence(
        self, stream: str, evidence_kind: str, name: str, data: bytes, *, timeout: float = 30.0
    ) -> pb.ArchiveEvidenceResponse:
        request = pb.ArchiveEvidenceRequest(
            stream=stream, evidence_kind=evidence_kind, name=name, data=data
        )
        return self._call("ArchiveEvidence", request, pb.ArchiveEvidenceResponse, timeout)

    def fetch_collateral(
        self, session_id: str, path: str, *, timeout: float = 120.0
    ) -> pb.FetchCollateralResponse:
        request = pb.FetchCollateralRequest(session_id=session_id, path=path)
        return self._call("FetchCollateral", request, pb.FetchCollateralResponse, timeout)

    def _stream(
        self, name: str, request: Req, response_type: type[Resp], timeout: float | None
    ) -> Generator[Resp, None, None]:
        """A server-streaming call's messages as they come; closing the iterator cancels."""
        method: grpc.UnaryStreamMultiCallable[Req, Resp] = self.channel.unary_stream(
            f"/{SERVICE}/{name}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        call = method(request, timeout=timeout)
        try:
            yield from call
        finally:
            call.cancel()

    def entries(
        self,
        stream: str,
        from_seq: int = 0,
        *,
        stop: int | None = None,
        follow: bool = False,
        timeout: float | None = None,
    ) -> Generator[tuple[int, bytes], None, None]:
        """``(seq, line)`` of each stored line from ``from_seq`` up to (not incl.) ``stop``,
        reassembled; closing the iterator cancels."""
        request = pb.StreamEntriesRequest(
            stream=stream, from_seq=min(from_seq, MAX_SEQ), follow=follow
        )
        if stop is not None:
            request.stop_seq = min(stop, MAX_SEQ)
        chunks = self._stream("StreamEntries", request, pb.EntryChunk, timeout)
        for last, line in _whole(chunks, lambda chunk: f"entry {chunk.seq}"):
            yield last.seq, line

    def store_info(self, *, timeout: float = 30.0) -> pb.StoreInfoResponse:
        """Whether the proxy's store is shared, and its name (no password)."""
        return self._call("StoreInfo", pb.StoreInfoRequest(), pb.StoreInfoResponse, timeout)

    def list_streams(self, *, timeout: float | None = None) -> list[str]:
        """Every stream of the proxy's store, in name order."""
        names: list[str] = []
        for batch in self._stream("ListStreams", pb.ListStreamsRequest(), pb.StreamNames, timeout):
            names += batch.streams
        return names

    def stream_state(
        self, stream: str, *, check_writer: bool = False, timeout: float = 30.0
    ) -> pb.StreamStateResponse:
        """A stream's size and lease row (``HasField("lease")``), and with ``check_writer``
        whether a live process holds its lease."""
        request = pb.StreamStateRequest(stream=stream, check_writer=check_writer)
        return self._call("StreamState", request, pb.StreamStateResponse, timeout)

    def checkpoints(self, stream: str, *, timeout: float | None = None) -> list[tuple[int, bytes]]:
        """``(size, note)`` of each checkpoint of ``stream``, in the order written."""
        request = pb.StreamCheckpointsRequest(stream=stream)
        return [
            (cp.size, cp.note)
            for cp in self._stream("StreamCheckpoints", request, pb.CheckpointNote, timeout)
        ]

    def evidence(self, stream: str, *, timeout: float | None = None) -> list[tuple[str, bytes]]:
        """``(name, data)`` of each evidence file of ``stream``, by name, reassembled."""
        request = pb.StreamEvidenceRequest(stream=stream)
        chunks = self._stream("StreamEvidence", request, pb.EvidenceChunk, timeout)
        return [
            (last.name, data)
            for last, data in _whole(chunks, lambda chunk: f"evidence {chunk.name!r}")
        ]

    def get_meta(self, key: str, *, timeout: float = 30.0) -> str | None:
        """A store-wide value (``log_key``), or None when it is not set."""
        got = self._call("GetMeta", pb.GetMetaRequest(key=key), pb.GetMetaResponse, timeout)
        return got.value if got.HasField("value") else None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
