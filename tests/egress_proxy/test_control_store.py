"""Reading the proxy's store through its control socket: ``control:/path/to/control.sock``.

A real ``ProxyServer`` serves its control socket over a real store, a SQLite file and a
database on the run's private PostgreSQL cluster (``tests/pg_server.py``); sessions are
written through it (``OpenSession``, ``AppendEvent``, ``ArchiveEvidence`` of a file past one
chunk). Then:

- ``ControlStore`` answers every read as the store read directly does (entries with start and
  stop, leaf hashes, sizes, streams, checkpoints, evidence, meta, leases, writer liveness,
  ``shared``), the leaf hashes computed here from the lines;
- ``affidavit log verify control:SOCK`` (a process of its own) reports what a direct verify
  reports, and so does a home whose ``appliance.json`` names the socket, and the panel's
  source of that home;
- every write is refused as a read-only store refuses it, and nothing is written;
- the new RPCs refuse a name that is no stream name (or meta key) with ``INVALID_ARGUMENT``
  naming it, and ``ControlStore`` says so as ``UnknownStream``;
- a socket that is not there, or that nobody serves, is exit 3 in one line;
- a ``control:`` location where no module registered the scheme says what to load.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest

from egress_proxy.control import ControlClient
from egress_proxy.control_store import SCHEME, ControlStore, control_location
from egress_proxy.proto import control_pb2 as pb
from egress_proxy.server import ProxyServer
from record.backends import location, open_store, store_label, store_name
from record.digest import Domain, digest
from record.errors import BadStoreLocation, StoreMissing, UnknownStream
from record.log import Log
from record.merkle import hash_leaf
from record.schema import TurnEnded, TurnStarted
from record.seal import KeyPair
from record.store import LogStore, PendingEntry
from tests.egress_proxy.loopback import ENV, proxy_config
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

REPO = Path(__file__).resolve().parents[2]
#: Evidence bigger than one chunk (1 MiB): it travels in three.
EVIDENCE = bytes(range(256)) * (10 << 10)


@dataclass
class Proxied:
    """A proxy serving its control socket over ``where``, and what was written through it."""

    backend: str
    where: str  # the store's location (a path as text, or a URL with its password)
    socket: Path
    user_key: Path
    streams: list[str]
    env: dict[str, str]


def _started(turn: int, text: bytes) -> dict[str, Any]:
    body = TurnStarted(turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text))
    return body.model_dump(mode="json")


def _ended(turn: int, answer: bytes) -> dict[str, Any]:
    body = TurnEnded(
        turn=turn,
        outcome="ANSWERED",
        answer_bytes=answer,
        answer_digest=digest(Domain.RESPONSE, answer),
    )
    return body.model_dump(mode="json")


def _store_of(backend: str, request: pytest.FixtureRequest, folder: Path) -> str:
    if backend == "sqlite":
        return str(folder / "record.db")
    server = request.getfixturevalue("postgres_server")
    url: str = server.fresh_database()
    request.addfinalizer(lambda: server.drop_database(url))  # after the proxy let go of it
    return url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def proxied(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxied]:
    folder = tmp_path_factory.mktemp("ctlstore")  # short: a socket path has a length limit
    where = _store_of(request.param, request, folder)
    log = Log.open(
        location(where),
        signing_key=folder / "record.signing-key",
        appliance_key=KeyPair.generate(),
    )
    user = KeyPair.generate()
    user.write(folder / "user.key")
    sock = folder / "ctl.sock"
    proxy = ProxyServer(
        proxy_config("http://127.0.0.1:9"),
        log,
        env=ENV,
        control_socket=sock,
        sessions=folder / "sessions.db",
    )
    try:
        with proxy, ControlClient(sock) as client:
            streams = []
            for n in range(2):
                opened = client.open_session([user.recipient], {"n": str(n)})
                for turn in range(n + 1):
                    client.append_event(
                        opened.session_id, "turn.started", _started(turn, b"q%d" % turn)
                    )
                    client.append_event(opened.session_id, "turn.ended", _ended(turn, b"a"))
                streams.append(opened.session_id)
            client.archive_evidence(streams[0], "sev-snp", "report.bin", EVIDENCE)
            client.archive_evidence(streams[0], "sev-snp", "empty.bin", b"")
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            yield Proxied(request.param, where, sock, folder / "user.key", streams, env)
    finally:
        log.close()


@pytest.fixture
def control(proxied: Proxied) -> Iterator[ControlStore]:
    store = open_store(control_location(proxied.socket), readonly=True)
    assert isinstance(store, ControlStore)
    yield store
    store.close()


@pytest.fixture
def direct(proxied: Proxied) -> Iterator[LogStore]:
    store = open_store(location(proxied.where), readonly=True)
    yield store
    store.close()


def _affidavit(proxied: Proxied, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        cwd=REPO,
        env=proxied.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_read_answers_as_the_store_read_directly(
    proxied: Proxied, control: ControlStore, direct: LogStore
) -> None:
    assert control.shared is direct.shared is (proxied.backend == "postgresql")
    assert control.label == store_label(location(proxied.where))
    password = urlsplit(proxied.where).password
    assert control.label and (password is None or password not in control.label)
    assert control.streams() == direct.streams() and set(proxied.streams) <= set(control.streams())
    for stream in proxied.streams:
        size = direct.size(stream)
        assert control.size(stream) == size and size >= 4
        assert list(control.entries(stream)) == list(direct.entries(stream))
        for start, stop in ((0, 1), (1, 3), (2, None), (size - 1, size + 5), (3, 3), (5, 2)):
            assert list(control.entries(stream, start, stop)) == list(
                direct.entries(stream, start, stop)
            ), (start, stop)
        assert control.leaf_hashes(stream) == direct.leaf_hashes(stream)
        assert control.leaf_hashes(stream, 2) == direct.leaf_hashes(stream, 2)
        assert [hash_leaf(e.line) for e in control.entries(stream)] == control.leaf_hashes(stream)
        assert control.checkpoints(stream) == direct.checkpoints(stream) != []
        assert control.evidence(stream) == direct.evidence(stream)
        assert control.lease(stream) == direct.lease(stream) is not None
        assert control.writer_alive(stream) is direct.writer_alive(stream) is True
    assert control.evidence(proxied.streams[0]) == [("empty.bin", b""), ("report.bin", EVIDENCE)]
    assert control.get_meta("log_key") == direct.get_meta("log_key")
    assert control.get_meta("no_such_key") is None
    # a stream the store does not hold reads as an empty one, as the contract says
    assert control.size("no-such-stream") == 0 and list(control.entries("no-such-stream")) == []
    assert control.leaf_hashes("no-such-stream") == [] and control.checkpoints("none") == []
    assert control.evidence("none") == [] and control.lease("none") is None
    assert control.writer_alive("none") is False


def test_stream_entries_stops_where_asked_and_reads_on_without_a_stop(proxied: Proxied) -> None:
    stream = proxied.streams[1]
    with ControlClient(proxied.socket) as client:
        everything = list(client.entries(stream))
        assert [seq for seq, _ in everything] == list(range(len(everything)))
        assert list(client.entries(stream, 1, stop=3)) == everything[1:3]
        # following with a stop ends there instead of waiting for more
        assert list(client.entries(stream, 2, stop=4, follow=True, timeout=10)) == everything[2:4]


def test_log_verify_through_the_socket_reports_what_a_direct_verify_does(
    proxied: Proxied, direct: LogStore
) -> None:
    key = ["--key", str(proxied.user_key)]
    through = _affidavit(proxied, "log", "verify", control_location(proxied.socket), *key)
    plain = _affidavit(proxied, "log", "verify", proxied.where, *key)
    assert through.returncode == plain.returncode == 0, through.stderr + plain.stderr
    name = f"{SCHEME}{proxied.socket}"
    assert through.stdout.startswith(f"ok: {name}: "), through.stdout
    direct_name = store_name(location(proxied.where))
    assert through.stdout.replace(name, "STORE") == plain.stdout.replace(direct_name, "STORE")
    as_json = [
        json.loads(_affidavit(proxied, "log", "verify", where, *key, "--json").stdout)
        for where in (control_location(proxied.socket), proxied.where)
    ]
    assert as_json[0] == as_json[1] and as_json[0]["ok"] is True
    assert as_json[0]["entries"] == sum(direct.size(s) for s in direct.streams())


def test_a_home_whose_appliance_names_the_socket_reads_through_it(
    proxied: Proxied, direct: LogStore, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    appliance = {
        "proxy_url": "http://127.0.0.1:9",
        "control_socket": str(proxied.socket),
        "store": control_location(proxied.socket),
        "model": "m",
    }
    (home / "appliance.json").write_text(json.dumps(appliance))
    key = ["--key", str(proxied.user_key)]
    verified = _affidavit(proxied, "log", "verify", "--home", str(home), *key)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"ok: {SCHEME}{proxied.socket}: "), verified.stdout
    stream = proxied.streams[1]
    shown = _affidavit(proxied, "log", "show", stream, "--home", str(home), "--json", *key)
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == direct.size(stream)

    from harness.panel.source import ApplianceSource
    from harness.state import Home

    source = ApplianceSource(Home.at(home))
    assert source.streams() == direct.streams()
    record = source.record(stream)
    assert [row.line for row in record.rows] == [e.line for e in direct.entries(stream)]
    assert record.notes == [c.note for c in direct.checkpoints(stream)]


def test_every_write_is_refused_read_only_and_writes_nothing(
    proxied: Proxied, control: ControlStore, direct: LogStore
) -> None:
    stream = proxied.streams[0]
    before = (direct.size(stream), direct.evidence(stream), direct.lease(stream))

    def build(seq: int) -> tuple[bytes, bytes]:
        return b"x", hash_leaf(b"x")

    writes: list[Callable[[], object]] = [
        lambda: control.append([PendingEntry(stream, build)]),
        lambda: control.take_lease(stream, "me", wait=0),
        lambda: control.release_leases("me"),
        lambda: control.archive_evidence(stream, "other.bin", b"x"),
        lambda: control.set_meta("log_key", "k"),
    ]
    for write in writes:
        with pytest.raises(PermissionError, match="was opened read-only"):
            write()
    assert (direct.size(stream), direct.evidence(stream), direct.lease(stream)) == before
    with pytest.raises(BadStoreLocation, match="read-only"):
        open_store(control_location(proxied.socket))  # a writer's open: refused at once
    checkpoint = _affidavit(proxied, "log", "checkpoint", stream, "--store", control.name)
    assert checkpoint.returncode == 2 and len(checkpoint.stderr.splitlines()) == 1
    assert "read-only" in checkpoint.stderr and "Traceback" not in checkpoint.stderr


@pytest.mark.parametrize("bad", ["../etc", "a b", "", "-x", "x" * 129])
def test_a_name_that_is_no_stream_name_is_refused_naming_it(
    proxied: Proxied, control: ControlStore, bad: str
) -> None:
    with ControlClient(proxied.socket) as client:
        calls: list[Callable[[], object]] = [
            lambda: client.stream_state(bad),
            lambda: client.checkpoints(bad),
            lambda: client.evidence(bad),
            lambda: list(client.entries(bad)),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                call()
            error: Any = info.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details().startswith("stream: not a stream name") and repr(bad) in (
                error.details()
            )
    reads: list[Callable[[], object]] = [
        lambda: control.size(bad),
        lambda: list(control.entries(bad)),
        lambda: control.checkpoints(bad),
        lambda: control.lease(bad),
    ]
    for read in reads:
        with pytest.raises(UnknownStream, match="not a stream name"):
            read()


def test_a_meta_key_that_is_no_plain_name_is_refused(proxied: Proxied) -> None:
    with ControlClient(proxied.socket) as client:
        for bad in ("", "a/b", "x" * 65, "log key"):
            with pytest.raises(grpc.RpcError) as info:
                client._call("GetMeta", pb.GetMetaRequest(key=bad), pb.GetMetaResponse, 10)
            error: Any = info.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details().startswith("key: not a meta key"), error.details()


def test_a_bad_stream_name_on_the_command_line_is_one_line(proxied: Proxied) -> None:
    shown = _affidavit(
        proxied, "log", "show", "../etc", "--store", control_location(proxied.socket)
    )
    assert shown.returncode == 3, shown.stdout + shown.stderr
    (line,) = shown.stderr.splitlines()
    assert line.startswith("affidavit: missing: ") and "not a stream name" in line, line


def test_a_socket_nobody_serves_is_missing_in_one_line(
    proxied: Proxied, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("gone")
    gone = _affidavit(proxied, "log", "verify", f"{SCHEME}{folder}/ctl.sock")
    assert gone.returncode == 3, gone.stdout + gone.stderr
    (line,) = gone.stderr.splitlines()
    assert line.startswith(f"affidavit: missing: cannot reach store {SCHEME}{folder}/ctl.sock: ")
    # a socket file that nobody listens on (a proxy that died)
    dead = socket.socket(socket.AF_UNIX)
    try:
        dead.bind(str(folder / "dead.sock"))
        with pytest.raises(StoreMissing, match=f"cannot reach store {SCHEME}{folder}/dead.sock"):
            ControlStore(folder / "dead.sock")
        refused = _affidavit(proxied, "log", "verify", f"{SCHEME}{folder}/dead.sock")
        assert refused.returncode == 3 and len(refused.stderr.splitlines()) == 1, refused.stderr
    finally:
        dead.close()


def test_a_control_location_is_text_and_needs_an_absolute_socket(tmp_path: Path) -> None:
    assert location("control:/run/affidavit/control.sock") == "control:/run/affidavit/control.sock"
    assert store_name("control:/run/x.sock") == store_label("control:/run/x.sock")
    with pytest.raises(BadStoreLocation, match="absolute path"):
        open_store("control:run/x.sock", readonly=True)
    with pytest.raises(BadStoreLocation, match="absolute path"):  # a URL's habit, not a path
        open_store("control://run/x.sock", readonly=True)


def test_a_seq_past_every_store_reads_as_none_not_as_a_store_failure(
    control: ControlStore, proxied: Proxied
) -> None:
    stream = proxied.streams[1]
    assert list(control.entries(stream, 1 << 64)) == []
    assert len(list(control.entries(stream, 0, 1 << 64))) == control.size(stream)


def test_an_unregistered_control_scheme_says_what_to_load() -> None:
    probe = (
        "import sys\n"
        "from record.backends import location, open_store\n"
        "from record.errors import StoreMissing\n"
        "assert 'egress_proxy.control_store' not in sys.modules\n"
        "assert location('control:/x/ctl.sock') == 'control:/x/ctl.sock'\n"
        "try:\n"
        "    open_store('control:/x/ctl.sock', readonly=True)\n"
        "except StoreMissing as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "egress_proxy.control_store" in done.stdout and "not loaded" in done.stdout, done.stdout


def test_a_writer_on_a_control_location_is_refused_before_it_makes_a_key(tmp_path: Path) -> None:
    """``Log.open`` (``affidavit up --store``) on a store only the proxy writes: refused in one
    line, and no signing key is left behind for a log that never opened."""
    key = tmp_path / "record.signing-key"
    with pytest.raises(BadStoreLocation, match="only the proxy writes it"):
        Log.open(f"{SCHEME}{tmp_path / 'control.sock'}", signing_key=key)
    assert not key.exists()


def test_readers_never_take_the_workers_a_turn_writes_with(proxied: Proxied) -> None:
    """Streamed reads (here five followers, which never end by themselves) hold at most the
    readers' share of the control plane's threads: one more is refused at once, a turn's
    writes still go through, and ``ControlStore`` retries a refused read until one is free."""
    import threading

    from egress_proxy.control import WRITERS_KEPT

    readers = 8 - WRITERS_KEPT  # the proxy's control plane runs 8 workers
    clients = [ControlClient(proxied.socket) for _ in range(readers + 1)]
    followers = [c.entries(proxied.streams[1], follow=True) for c in clients[:readers]]
    try:
        for follower in followers:
            assert next(follower)[0] == 0  # each holds a worker now
        one_more = clients[-1].entries(proxied.streams[1])
        with pytest.raises(grpc.RpcError) as refused:
            next(one_more)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "too many store reads at once" in refused.value.details()
        with ControlClient(proxied.socket) as writer:  # a turn's writes are not starved
            opened = writer.open_session([KeyPair.read(proxied.user_key).recipient], {})
            writer.append_event(opened.session_id, "turn.started", _started(0, b"still"))
        store = ControlStore(proxied.socket)
        try:
            threading.Timer(0.3, followers[0].close).start()  # a worker comes free
            assert opened.session_id in store.streams()  # retried until it did
        finally:
            store.close()
    finally:
        for follower in followers:
            follower.close()
        for client in clients:
            client.close()


def test_a_reader_that_stops_reading_lets_go_at_its_deadline(
    control: ControlStore, proxied: Proxied
) -> None:
    """A stream's evidence is sent by one call at a time; a client that stops reading
    midway (a suspended process) holds it only until its deadline, which the proxy
    enforces: the next reader then gets the files whole."""
    import time

    big = os.urandom(24 << 20)  # more than gRPC's and the socket's buffers hold unread
    with ControlClient(proxied.socket) as client:
        opened = client.open_session([KeyPair.read(proxied.user_key).recipient], {})
        for name in ("a.bin", "b.bin"):
            client.archive_evidence(opened.session_id, "sev-snp", name, big)
        call = client.channel.unary_stream(
            "/affidavit.control.v1.Control/StreamEvidence",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb.EvidenceChunk.FromString,
        )(pb.StreamEvidenceRequest(stream=opened.session_id), timeout=2.0)
        assert next(call).offset == 0  # then nothing more is read
        time.sleep(2.5)  # past its deadline: the proxy cancelled the call
        files = dict(control.evidence(opened.session_id))
        assert files == {"a.bin": big, "b.bin": big}
