"""``FetchCollateral``: the proxy GETs a KDS document for the appliance and records it.

A real proxy (``ProxyServer`` with its network transport and control socket), a real gRPC
client, and a stand-in for AMD's KDS on loopback (``tests.attestation.kds_double``: no KDS
is reachable here). What is proven:

- the answer is the document's bytes as served; the stream holds ``fetch.request`` (the
  exact GET, before the dial) and ``fetch.response`` (status line, headers and body);
- a non-200 answer is recorded and handed back with its status;
- a path that is not a KDS document's, an unknown session, or a proxy without collateral
  (turned off, or with no network transport: replay) is refused before anything is recorded;
- a KDS that takes no connection is ``UNAVAILABLE`` with the fetch recorded ``FAILED``; an
  answer over the limit is cut, ``UNAVAILABLE``, recorded ``FAILED``;
- the entries read back with the record's own reader and the independent one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from egress_proxy.control import ControlClient
from egress_proxy.server import ProxyServer
from egress_proxy.transports.mock import MockTransport
from record.digest import Domain, digest
from record.log import Log
from record.schema import FetchRequest, FetchResponse
from record.seal import KeyPair
from tests.attestation.kds_double import StandInKds, stand_in_kds
from tests.egress_proxy.loopback import ENV, proxy_config, read_bodies

VCEK = "/vcek/v1/Turin/a0a1a2a3a4a5a6a7?fmcSPL=01&blSPL=02&teeSPL=03&snpSPL=04&ucodeSPL=85"
CHAIN = "/vcek/v1/Turin/cert_chain"


@dataclass
class Kit:
    kds: StandInKds
    proxy: ProxyServer
    client: ControlClient
    store: Path
    key: KeyPair


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running(tmp: Path, kds_url: str, *, transport: Any = None, **collateral: Any) -> Iterator[Kit]:
    """A proxy whose collateral base is ``kds_url``, its control socket, and a client."""
    key = KeyPair.generate()
    tmp.mkdir(exist_ok=True)
    log = Log.open(tmp / "record.db", appliance_key=key)
    config = proxy_config("http://127.0.0.1:9", collateral={"base_url": kds_url, **collateral})
    path = tmp / "ctl.sock"
    proxy = ProxyServer(config, log, env=ENV, control_socket=path, transport=transport)
    try:
        with proxy, ControlClient(path) as client:
            yield Kit(StandInKds(), proxy, client, tmp / "record.db", key)
    finally:
        log.close()


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[Kit]:
    with stand_in_kds() as kds, running(tmp_path, kds.url) as kit:
        kit.kds = kds
        yield kit


def _code(info: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    error: Any = info.value
    code: grpc.StatusCode = error.code()
    return code


def _details(info: pytest.ExceptionInfo[grpc.RpcError]) -> str:
    error: Any = info.value
    details: str = error.details()
    return details


def _fetches(kit: Kit, stream: str) -> list[Any]:
    bodies = read_bodies(kit.store, stream, kit.key)
    return [b for _, b in bodies.values() if isinstance(b, FetchRequest | FetchResponse)]


def test_a_kds_document_is_fetched_and_recorded_both_ways(kit: Kit) -> None:
    vcek = bytes(range(256)) * 5
    kit.kds.documents[VCEK] = vcek
    stream = kit.client.open_session([], {"affidavit/boot-evidence": "t"}).session_id
    got = kit.client.fetch_collateral(stream, VCEK)
    assert (got.status, got.body) == (200, vcek)
    assert kit.kds.asked == [VCEK]
    request, response = _fetches(kit, stream)
    assert isinstance(request, FetchRequest) and isinstance(response, FetchResponse)
    assert (request.method, request.url) == ("GET", kit.kds.url + VCEK)
    assert request.request_bytes.startswith(f"GET {VCEK} HTTP/1.1\r\nhost: 127.0.0.1:".encode())
    assert request.content_key == digest(Domain.FETCH_REQUEST, request.request_bytes)
    assert (request.reply_seq, request.call_id) == (None, None)  # no model call admitted it
    assert (response.request_seq, response.outcome, response.status) == (
        got.request_seq,
        "COMMITTED",
        200,
    )
    assert response.response_bytes is not None
    assert response.response_bytes.startswith(b"HTTP/1.")
    assert response.response_bytes.endswith(b"\r\n\r\n" + vcek)
    assert response.response_digest == digest(Domain.FETCH_RESPONSE, response.response_bytes)
    assert got.response_seq == got.request_seq + 1


def test_a_missing_document_is_recorded_and_answered_with_its_status(kit: Kit) -> None:
    stream = kit.client.open_session([], {}).session_id
    got = kit.client.fetch_collateral(stream, CHAIN)
    assert got.status == 404
    _, response = _fetches(kit, stream)
    assert (response.outcome, response.status) == ("COMMITTED", 404)


@pytest.mark.parametrize(
    "path",
    [
        "/anything/else",
        "vcek/v1/Turin/cert_chain",
        "/vcek/v1/Turin/../../admin",
        "/vcek/v1/Turin/cert_chain#x",
        "/vcek/v1/Turin/cert chain",
        "/vcek/v1/Turin/cert_chain?x=1;y",
        "/vcek/v1/Turin/" + "a" * 300,
        "//evil.example/vcek/v1/Turin/cert_chain",
        "@evil.example/vcek/v1/Turin/cert_chain",
    ],
)
def test_a_path_that_is_no_kds_document_is_refused_unrecorded(kit: Kit, path: str) -> None:
    stream = kit.client.open_session([], {}).session_id
    size = kit.proxy.log.store.size(stream)
    with pytest.raises(grpc.RpcError) as info:
        kit.client.fetch_collateral(stream, path)
    assert _code(info) == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a KDS document path" in _details(info)
    assert kit.proxy.log.store.size(stream) == size
    assert kit.kds.asked == []


def test_an_unknown_session_is_not_found(kit: Kit) -> None:
    with pytest.raises(grpc.RpcError) as info:
        kit.client.fetch_collateral("no-such-session", CHAIN)
    assert _code(info) == grpc.StatusCode.NOT_FOUND


def test_a_kds_that_takes_no_connection_is_unavailable_and_recorded_failed(
    tmp_path: Path,
) -> None:
    with running(tmp_path, f"http://127.0.0.1:{_free_port()}", connect_timeout_s=5) as kit:
        stream = kit.client.open_session([], {}).session_id
        with pytest.raises(grpc.RpcError) as info:
            kit.client.fetch_collateral(stream, CHAIN)
        assert _code(info) == grpc.StatusCode.UNAVAILABLE
        assert "upstream_unreachable" in _details(info) and CHAIN in _details(info)
        _, response = _fetches(kit, stream)
        assert (response.request_seq, response.outcome) == (1, "FAILED")
        assert response.error_bytes is not None and CHAIN.encode() in response.error_bytes


def test_an_answer_over_the_limit_is_cut_and_recorded_failed(tmp_path: Path) -> None:
    with stand_in_kds() as kds, running(tmp_path, kds.url, max_response_bytes=1024) as kit:
        kds.documents[CHAIN] = b"-----BEGIN" + b"x" * 4096
        stream = kit.client.open_session([], {}).session_id
        with pytest.raises(grpc.RpcError) as info:
            kit.client.fetch_collateral(stream, CHAIN)
        assert _code(info) == grpc.StatusCode.UNAVAILABLE
        assert "response_too_large" in _details(info)
        _, response = _fetches(kit, stream)
        assert (response.outcome, response.status) == ("FAILED", 200)
        assert response.error_bytes is not None and b"exceeds 1024 bytes" in response.error_bytes


def test_a_proxy_without_collateral_refuses_before_recording(tmp_path: Path) -> None:
    with stand_in_kds() as kds:
        with running(tmp_path / "off", kds.url, enabled=False) as kit:
            stream = kit.client.open_session([], {}).session_id
            with pytest.raises(grpc.RpcError) as info:
                kit.client.fetch_collateral(stream, CHAIN)
            assert _code(info) == grpc.StatusCode.FAILED_PRECONDITION
            assert _fetches(kit, stream) == []
        # a transport that cannot send exact bytes (a replay's, a test double's): no path out
        with running(tmp_path / "double", kds.url, transport=MockTransport(None)) as kit:  # type: ignore[arg-type]
            stream = kit.client.open_session([], {}).session_id
            with pytest.raises(grpc.RpcError) as info:
                kit.client.fetch_collateral(stream, CHAIN)
            assert _code(info) == grpc.StatusCode.FAILED_PRECONDITION
        assert kds.asked == []


def test_the_fetches_read_back_with_the_independent_reader(kit: Kit, tmp_path: Path) -> None:
    from record.bundle import export_stream, verify_bundle
    from tests.record import independent_reader

    kit.kds.documents[CHAIN] = b"-----BEGIN CERTIFICATE-----\n"
    stream = kit.client.open_session([], {}).session_id
    kit.client.fetch_collateral(stream, CHAIN)
    kit.client.fetch_collateral(stream, VCEK)  # a 404
    out = tmp_path / "bundle"
    export_stream(kit.store, stream, out)
    assert verify_bundle(out).ok
    assert independent_reader.verify_bundle(out).ok
