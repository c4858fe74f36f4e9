"""The control plane's side of #21 line 2: ``OpenSession`` with ``continues_json``.

A real record (SQLite here, PostgreSQL in ``tests/record/test_continuation.py`` and the
harness's two-appliance test) and the real gRPC control plane on a Unix socket. The proxy
checks the link against the store before it opens anything: a link that does not hold, a
stream this appliance writes itself, a stream the store does not have, and a malformed
``continues_json`` are each refused with ``INVALID_ARGUMENT`` and a line saying why, and no
stream is opened. A link that holds opens a stream whose ``stream.opened`` carries it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egress_proxy.control import ControlClient, ControlPlane
from egress_proxy.proto import control_pb2 as pb
from egress_proxy.sessions import SessionRegistry
from record.checkpoint import Signer
from record.continuation import link_to, root_digest
from record.log import LOG_KEY_NAME, Log
from record.postgres_store import PostgresStore
from record.schema import Continuation, StreamOpened, parse_entry
from record.seal import KeyPair
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

OLD = "old-session"


@pytest.fixture
def fleet(postgres_server: Any, tmp_path: Path) -> Iterator[tuple[Log, Log, ControlClient]]:  # noqa: F811
    """Appliance A has written ``OLD`` and stopped; appliance B's control plane is up."""
    url = postgres_server.fresh_database()
    user = KeyPair.generate()
    try:
        with Log(
            PostgresStore(url), Signer.generate(LOG_KEY_NAME), appliance_key=KeyPair.generate()
        ) as a:
            a.open_stream(OLD, [user.recipient])
        b = Log(PostgresStore(url), Signer.generate(LOG_KEY_NAME), appliance_key=KeyPair.generate())
        socket_path = tmp_path / "c.sock"
        with b, ControlPlane(SessionRegistry(b), socket_path), ControlClient(socket_path) as c:
            yield a, b, c
    finally:
        postgres_server.drop_database(url)


def _refused(client: ControlClient, continues_json: str) -> str:
    request = pb.OpenSessionRequest(
        recipients=[KeyPair.generate().recipient.text()], continues_json=continues_json
    )
    with pytest.raises(grpc.RpcError) as info:
        client._call("OpenSession", request, pb.OpenSessionResponse, 30)
    error: Any = info.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details: str = error.details()
    return details


def test_a_link_that_holds_opens_a_stream_that_carries_it(
    fleet: tuple[Log, Log, ControlClient],
) -> None:
    _, b, client = fleet
    link = link_to(b.store, OLD)
    opened = client.open_session([KeyPair.generate().recipient], continues=link)
    first = next(iter(b.store.entries(opened.session_id, 0, 1)))
    body = parse_entry(first.line).body
    assert StreamOpened.model_validate(body).continues == link


def test_what_does_not_hold_is_refused_and_nothing_is_opened(
    fleet: tuple[Log, Log, ControlClient],
) -> None:
    _, b, client = fleet
    before = set(b.store.streams())
    good = link_to(b.store, OLD)
    mine = "b-own"
    b.open_stream(mine, [KeyPair.generate().recipient])
    cases = {
        good.model_copy(update={"root": root_digest([])}).model_dump_json(): "another root",
        good.model_copy(update={"size": 9}).model_dump_json(): "it has 1",
        good.model_copy(update={"stream": "nowhere"}).model_dump_json(): "not in this store",
        link_to(b.store, mine).model_dump_json(): "this appliance's own",
        '{"stream": "x"}': "continues",
        "not json": "continues",
    }
    for text, said in cases.items():
        assert said in _refused(client, text), text
    assert set(b.store.streams()) == before | {mine}


def test_a_link_is_a_closed_object(fleet: tuple[Log, Log, ControlClient]) -> None:
    _, b, client = fleet
    extra = {**json.loads(link_to(b.store, OLD).model_dump_json()), "more": 1}
    assert "more" in _refused(client, json.dumps(extra))
    assert Continuation.model_fields.keys() == {"stream", "checkpoint", "size", "root"}


def test_a_session_that_continues_nothing_has_no_link(
    fleet: tuple[Log, Log, ControlClient],
) -> None:
    _, b, client = fleet
    opened = client.open_session([KeyPair.generate().recipient])
    first = next(iter(b.store.entries(opened.session_id, 0, 1)))
    body = parse_entry(first.line).body
    assert isinstance(body, dict) and "continues" not in body
