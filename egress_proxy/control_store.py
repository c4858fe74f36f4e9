"""The proxy's store, read through its control plane: ``control:/path/to/control.sock``.

In the appliance only the proxy's uid may open network connections, so a reader under
another uid (the harness: the panel, ``affidavit log verify``, ``session show``, reconstruct,
diverge) cannot reach a PostgreSQL store; it reads the store through the control socket
instead. ``ControlStore`` is a read-only ``record.store.LogStore`` over
``egress_proxy.control.ControlClient``: every read method asks the proxy (which reads its own
store's read methods, nothing else), every write method is refused as a read-only store
refuses it (``PermissionError``, "was opened read-only"). Each entry's leaf hash is computed
here from its line (``record.merkle.hash_leaf``), never taken from the wire.

Importing this module registers the ``control:`` scheme with ``record.backends`` (the record
imports nothing of ours), so ``open_store("control:/…", readonly=True)``, ``--store`` and a
home whose ``appliance.json`` names such a store all reach it; ``affidavit.cli`` and
``harness.state`` import it. gRPC and the client are imported only when a store is opened.

A socket that is not there or does not answer is a store that is missing (``StoreMissing``,
exit 3: "cannot reach store control:…: why"); the proxy's refusals become the record's typed
errors with its message (a name that is no stream name, an unknown stream:
``UnknownStream``; a store the proxy could not read: ``RecordError``), never a gRPC
traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from record.backends import register_scheme
from record.errors import BadStoreLocation, RecordError, StoreMissing, UnknownStream
from record.merkle import hash_leaf
from record.store import (
    LEASE_WAIT_S,
    Lease,
    LogStore,
    PendingCheckpoint,
    PendingEntry,
    StoredCheckpoint,
    StoredEntry,
)

if TYPE_CHECKING:
    import grpc

    from egress_proxy.control import ControlClient

__all__ = ["SCHEME", "ControlStore", "control_location", "socket_of"]

#: The scheme of a store read through a proxy's control socket: ``control:`` and the
#: socket's absolute path.
SCHEME = "control:"

#: How long opening waits for the proxy's first answer (a socket nobody serves fails at once).
OPEN_TIMEOUT_S = 10.0
#: How long one read that ends by itself may take (every one but ``entries``, which a slow
#: reader may take its time over). The proxy ends the call at this deadline too, so a
#: reader that stops reading (a suspended process) lets go of what it held there.
CALL_TIMEOUT_S = 60.0
#: The pauses before each retry of a read the proxy refused as one too many at once.
BUSY_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)

_T = TypeVar("_T")


def control_location(socket: Path | str) -> str:
    """The store location of the proxy whose control socket is ``socket``."""
    return f"{SCHEME}{Path(socket).absolute()}"


def socket_of(location: str) -> Path:
    """The control socket a ``control:`` location names; it must be an absolute path."""
    if not location.startswith(SCHEME):
        raise BadStoreLocation(f"{location!r} is not a {SCHEME} store location")
    path = location.removeprefix(SCHEME)
    if not path.startswith("/") or path.startswith("//"):  # ``control://…``: a URL's habit
        raise BadStoreLocation(
            f"a {SCHEME} store names the proxy's control socket by its absolute path "
            f"({SCHEME}/path/to/control.sock), not {path!r}"
        )
    return Path(path)


class ControlStore(LogStore):
    """The store of the proxy serving the control socket at ``socket``, read-only.

    ``shared`` and ``label`` (the proxy's name for its store: a file's name, a database's URL
    without its password) are the proxy's answer when opened; ``name`` is the location.
    """

    readonly = True

    def __init__(self, socket: Path | str, *, timeout: float = OPEN_TIMEOUT_S) -> None:
        import grpc

        from egress_proxy.control import ControlClient

        self.socket = Path(socket)
        self.name = f"{SCHEME}{self.socket}"
        self.label = str(self.socket)  # until the proxy names its store
        self._grpc = grpc
        if not self.socket.exists():
            raise StoreMissing(
                f"cannot reach store {self.name}: no socket there (is the proxy running?)"
            )
        self._client: ControlClient = ControlClient(self.socket)
        try:
            info = self._call(lambda: self._client.store_info(timeout=timeout))
        except BaseException:
            self._client.close()
            raise
        self.shared = info.shared
        self.label = info.label

    # -- errors --------------------------------------------------------------------------------

    def _error(self, exc: grpc.RpcError, missing: type[RecordError] | None) -> RecordError:
        """The record's error for a gRPC one, with the proxy's message. ``missing``: what an
        input the proxy refused (a bad or unknown stream name) is for this call."""
        codes = self._grpc.StatusCode
        call = exc if isinstance(exc, self._grpc.Call) else None
        code = call.code() if call is not None else codes.UNKNOWN
        lines = ((call.details() if call is not None else None) or code.name).splitlines()
        said = lines[0] if lines else code.name
        if code in (codes.UNAVAILABLE, codes.DEADLINE_EXCEEDED, codes.CANCELLED):
            return StoreMissing(f"cannot reach store {self.name}: {said}")
        if code == codes.UNIMPLEMENTED:
            return StoreMissing(
                f"cannot reach store {self.name}: the proxy there serves no store reads ({said})"
            )
        if code in (codes.INVALID_ARGUMENT, codes.NOT_FOUND) and missing is not None:
            return missing(f"store {self.name}: {said}")
        return RecordError(f"store {self.name} ({self.label}): {said}")

    def _busy(self, exc: BaseException) -> bool:
        """Whether the proxy refused a read because too many run at once (try again)."""
        grpc = self._grpc
        return isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    def _call(
        self, call: Callable[[], _T], missing: type[RecordError] | None = UnknownStream
    ) -> _T:
        for pause in (*BUSY_PAUSES_S, None):
            try:
                return call()
            except self._grpc.RpcError as exc:
                if pause is None or not self._busy(exc):
                    raise self._error(exc, missing) from None
            except RuntimeError as exc:  # the client's reassembly: a file or line arrived cut
                raise RecordError(f"store {self.name}: {exc}") from None
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _refuse(self) -> NoReturn:
        raise PermissionError(
            f"store {self.name} was opened read-only: it reads {self.label} through "
            "the proxy's control plane, and the proxy alone writes it"
        )

    # -- writing: refused ----------------------------------------------------------------------

    def append(
        self,
        entries: Sequence[PendingEntry],
        checkpoints: Sequence[PendingCheckpoint] = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        self._refuse()

    def take_lease(self, stream: str, holder: str, *, wait: float = LEASE_WAIT_S) -> Lease | None:
        self._refuse()

    def release_leases(self, holder: str) -> None:
        self._refuse()

    def archive_evidence(self, stream: str, name: str, data: bytes) -> None:
        self._refuse()

    def set_meta(self, key: str, value: str) -> None:
        self._refuse()

    # -- reading -------------------------------------------------------------------------------

    def entries(
        self, stream: str, start: int = 0, stop: int | None = None
    ) -> Iterator[StoredEntry]:
        start = max(start, 0)  # as a query's ``seq >= start`` reads it
        if stop is not None and stop <= start:
            return
        for pause in (*BUSY_PAUSES_S, None):
            lines = self._client.entries(stream, start, stop=stop)
            sent = False
            try:
                for seq, line in lines:
                    sent = True
                    yield StoredEntry(stream, seq, line, hash_leaf(line))
                return
            except self._grpc.RpcError as exc:
                grpc = self._grpc
                if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.NOT_FOUND:
                    return  # a stream with no entries: none, as every store reads it
                if sent or pause is None or not self._busy(exc):
                    raise self._error(exc, UnknownStream) from None
            except RuntimeError as exc:  # the client's reassembly: a line arrived cut
                raise RecordError(f"store {self.name}: {exc}") from None
            finally:
                lines.close()
            time.sleep(pause)

    def streams(self) -> list[str]:
        return self._call(lambda: self._client.list_streams(timeout=CALL_TIMEOUT_S), None)

    def size(self, stream: str) -> int:
        state = self._call(lambda: self._client.stream_state(stream, timeout=CALL_TIMEOUT_S))
        return state.size

    def leaf_hashes(self, stream: str, stop: int | None = None) -> list[bytes]:
        return [entry.leaf_hash for entry in self.entries(stream, 0, stop)]

    def checkpoints(self, stream: str) -> list[StoredCheckpoint]:
        notes = self._call(lambda: self._client.checkpoints(stream, timeout=CALL_TIMEOUT_S))
        return [StoredCheckpoint(stream, size, note) for size, note in notes]

    def evidence(self, stream: str) -> list[tuple[str, bytes]]:
        return self._call(lambda: self._client.evidence(stream, timeout=CALL_TIMEOUT_S))

    def get_meta(self, key: str) -> str | None:
        return self._call(lambda: self._client.get_meta(key, timeout=CALL_TIMEOUT_S), None)

    def lease(self, stream: str) -> Lease | None:
        state = self._call(lambda: self._client.stream_state(stream, timeout=CALL_TIMEOUT_S))
        if not state.HasField("lease"):
            return None
        row = state.lease
        return Lease(stream, row.holder, row.since, row.released)

    def writer_alive(self, stream: str) -> bool:
        state = self._call(
            lambda: self._client.stream_state(stream, check_writer=True, timeout=CALL_TIMEOUT_S)
        )
        return state.writer_alive

    def close(self) -> None:
        self._client.close()


def _open(location: str, readonly: bool) -> LogStore:
    socket = socket_of(location)
    if not readonly:
        raise BadStoreLocation(
            f"store {location} is read-only: it reads the proxy's store through its control "
            "plane, and only the proxy writes it"
        )
    return ControlStore(socket)


register_scheme(SCHEME, _open)
