"""The gRPC control plane, over a real Unix socket with a real gRPC client channel.

- ``OpenSession`` returns the session's path and a token the data plane accepts; its pins
  are recorded; bad pins and bad keys are ``INVALID_ARGUMENT`` with nothing recorded.
- ``SetPins`` records ``pins.set`` and applies it; an unknown session is ``NOT_FOUND``.
- ``AppendEvent`` validates a harness body (schema and digest), appends it through the
  proxy's log and returns its seq, with the signed note when one was made (``turn.ended``);
  other kinds are refused.
- ``StreamEntries`` hands out the stored lines' exact bytes from a seq, a 16 MiB tool result
  included (chunked), and follows a stream as it grows.
- ``ArmReplay`` arms only a session opened naming the stream; ``GetVerdicts`` reads its plan.
- The socket is 0600; ``ProxyServer(control_socket=…)`` serves it; the generated code is
  what ``control.proto`` generates now.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egress_proxy.control import ControlClient, ControlPlane
from egress_proxy.proto import generate as proto_generate
from egress_proxy.server import ProxyServer
from record.digest import Domain, digest
from record.log import Log
from record.schema import PinsSet, ToolResult, TurnEnded, TurnStarted
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, Rig, proxy_config


@pytest.fixture(scope="module")
def client(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlClient]:
    path = tmp_path_factory.mktemp("ctl") / "c.sock"
    with ControlPlane(rig.proxy.registry, path), ControlClient(path) as c:
        yield c


def code_of(info: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    error: Any = info.value
    code: grpc.StatusCode = error.code()
    return code


def started(turn: int, text: bytes) -> dict[str, Any]:
    body = TurnStarted(turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text))
    return body.model_dump(mode="json")


def test_open_session_returns_path_and_a_token_the_data_plane_accepts(
    rig: Rig, client: ControlClient
) -> None:
    opened = client.open_session([rig.user.recipient], {"who": "grpc"}, {"seed": 7})
    assert opened.path == f"/s/{opened.session_id}"
    assert opened.base_url == rig.proxy.url + opened.path
    session = rig.proxy.registry.authenticate(opened.session_id, opened.token)
    assert session.labels == {"who": "grpc"} and session.pins == {"seed": 7}
    bodies = rig.bodies(opened.session_id)
    assert [e.kind for e, _ in bodies.values()] == ["stream.opened", "pins.set"]
    assert isinstance(bodies[1][1], PinsSet) and bodies[1][1].pins == {"seed": 7}


@pytest.mark.parametrize(
    "recipients, pins",
    [(["not a key"], ""), ([], '{"no_such_pin": 1}'), ([], "[1]"), ([], "{")],
)
def test_bad_open_session_is_invalid_argument(
    rig: Rig, client: ControlClient, recipients: list[str], pins: str
) -> None:
    from egress_proxy.proto import control_pb2 as pb

    before = set(rig.log.store.streams())
    request = pb.OpenSessionRequest(
        recipients=recipients or [rig.user.recipient.text()], pins_json=pins
    )
    with pytest.raises(grpc.RpcError) as info:
        client._call("OpenSession", request, pb.OpenSessionResponse, 10)
    assert code_of(info) == grpc.StatusCode.INVALID_ARGUMENT
    assert set(rig.log.store.streams()) == before


def test_set_pins_records_then_applies(rig: Rig, client: ControlClient) -> None:
    opened = client.open_session([rig.user.recipient])
    response = client.set_pins(opened.session_id, {"seed": 3, "strict_cache": True})
    session = rig.proxy.registry.get(opened.session_id)
    assert session is not None and session.pins == {"seed": 3, "strict_cache": True}
    _, body = rig.bodies(opened.session_id)[response.seq]
    assert isinstance(body, PinsSet) and body.cache_mode == "strict"
    assert client.set_pins(opened.session_id, None).seq == response.seq + 1
    assert session.pins is None
    with pytest.raises(grpc.RpcError) as info:
        client.set_pins(opened.session_id, {"temperature": "hot"})
    assert code_of(info) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        client.set_pins("no-such-session", {"seed": 1})
    assert code_of(info) == grpc.StatusCode.NOT_FOUND


def test_append_event_appends_through_the_log(rig: Rig, client: ControlClient) -> None:
    opened = client.open_session([rig.user.recipient])
    first = client.append_event(opened.session_id, "turn.started", started(0, b"hello"))
    assert first.seq == 1 and first.HasField("checkpoint")  # every commit is signed
    answer = b"hi there"
    ended = TurnEnded(
        turn=0,
        outcome="ANSWERED",
        answer_bytes=answer,
        answer_digest=digest(Domain.RESPONSE, answer),
    ).model_dump(mode="json")
    second = client.append_event(opened.session_id, "turn.ended", json.dumps(ended).encode())
    assert second.seq == 2 and second.HasField("checkpoint")
    assert second.checkpoint == rig.log.store.checkpoints(opened.session_id)[-1].note
    session = rig.proxy.registry.get(opened.session_id)
    assert session is not None and session.latest_checkpoint == second.checkpoint
    bodies = rig.bodies(opened.session_id)
    assert bodies[1][1] == TurnStarted.model_validate(started(0, b"hello"))
    assert bodies[2][0].event_id == second.event_id


@pytest.mark.parametrize(
    "kind, body, code",
    [
        ("model.request", {}, grpc.StatusCode.INVALID_ARGUMENT),
        ("stream.opened", {}, grpc.StatusCode.INVALID_ARGUMENT),
        ("turn.started", {"turn": 0}, grpc.StatusCode.INVALID_ARGUMENT),
        ("turn.started", {**started(0, b"a"), "input_digest": digest(Domain.INPUT, b"b")}, None),
        (
            "turn.ended",
            {"turn": 0, "outcome": "ANSWERED", "answer_digest": "sha256:" + "0" * 64},
            None,
        ),
        ("turn.ended", {"turn": 0, "outcome": "MAYBE"}, None),
    ],
)
def test_bad_events_are_refused_and_not_recorded(
    rig: Rig, client: ControlClient, kind: str, body: dict[str, Any], code: Any
) -> None:
    opened = client.open_session([rig.user.recipient])
    with pytest.raises(grpc.RpcError) as info:
        client.append_event(opened.session_id, kind, body)
    assert code_of(info) == (code or grpc.StatusCode.INVALID_ARGUMENT)
    assert rig.log.store.size(opened.session_id) == 1
    with pytest.raises(grpc.RpcError) as info:
        client.append_event("no-such-session", "turn.started", started(0, b"x"))
    assert code_of(info) == grpc.StatusCode.NOT_FOUND


def test_stream_entries_are_the_stored_bytes_from_a_seq(rig: Rig, client: ControlClient) -> None:
    opened = client.open_session([rig.user.recipient], pins={"seed": 1})
    for turn in range(3):
        client.append_event(opened.session_id, "turn.started", started(turn, b"q%d" % turn))
    stored = [(e.seq, e.line) for e in rig.log.store.entries(opened.session_id)]
    assert list(client.entries(opened.session_id)) == stored
    assert list(client.entries(opened.session_id, 3)) == stored[3:]
    assert list(client.entries(opened.session_id, 99)) == []
    with pytest.raises(grpc.RpcError) as info:
        list(client.entries("no-such-stream"))
    assert code_of(info) == grpc.StatusCode.NOT_FOUND


def test_a_16_mib_tool_result_streams_whole(rig: Rig, client: ControlClient) -> None:
    opened = client.open_session([rig.user.recipient])
    result = os.urandom(16 << 20)
    body = ToolResult(
        call_seq=0,
        outcome="COMMITTED",
        result_bytes=result,
        result_digest=digest(Domain.TOOL_RESULT, result),
    )
    seq = rig.log.append(opened.session_id, body).seq
    ((got_seq, line),) = client.entries(opened.session_id, seq)
    (stored,) = rig.log.store.entries(opened.session_id, seq)
    assert got_seq == seq and line == stored.line and len(line) > 16 << 20
    opened_body = rig.bodies(opened.session_id)[seq][1]
    assert isinstance(opened_body, ToolResult) and opened_body.result_bytes == result


def test_following_a_stream_sends_new_entries(rig: Rig, client: ControlClient) -> None:
    opened = client.open_session([rig.user.recipient])
    follow = client.entries(opened.session_id, 1, follow=True, timeout=30)
    timer = threading.Timer(
        0.2, client.append_event, (opened.session_id, "turn.started", started(0, b"later"))
    )
    timer.start()
    try:
        seq, line = next(follow)
    finally:
        follow.close()
        timer.join()
    assert seq == 1 and line == next(iter(rig.log.store.entries(opened.session_id, 1))).line


def test_replay_arms_only_a_session_that_names_its_stream(rig: Rig, client: ControlClient) -> None:
    old = client.open_session([rig.user.recipient])
    plain = client.open_session([rig.user.recipient])
    with pytest.raises(grpc.RpcError) as info:
        client.arm_replay(plain.session_id, old.session_id)
    assert code_of(info) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as info:
        client.get_verdicts(plain.session_id)
    assert code_of(info) == grpc.StatusCode.FAILED_PRECONDITION
    new = client.open_session([rig.user.recipient], {"affidavit/replays": old.session_id})
    armed = client.arm_replay(new.session_id, old.session_id)
    assert (armed.model_steps, armed.tool_calls) == (0, 0)
    verdicts = client.get_verdicts(new.session_id)
    assert verdicts.source_stream == old.session_id and list(verdicts.verdicts_json) == []
    assert verdicts.live_calls == 0


def test_the_proxy_serves_its_control_socket(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "record.db", appliance_key=KeyPair.generate())
    socket_path = tmp_path / "ctl.sock"
    proxy = ProxyServer(
        proxy_config("http://127.0.0.1:9"), log, env=ENV, control_socket=socket_path
    )
    try:
        with proxy, ControlClient(socket_path) as c:
            assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
            opened = c.open_session([KeyPair.generate().recipient])
            assert proxy.registry.authenticate(opened.session_id, opened.token).id
        assert not socket_path.exists()
    finally:
        log.close()


def test_the_generated_code_is_current(tmp_path: Path) -> None:
    for fresh in proto_generate.generate(tmp_path):
        committed = proto_generate.HERE / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed.name} is stale: run python -m egress_proxy.proto.generate"
        )
