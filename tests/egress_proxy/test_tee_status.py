"""egress_proxy.tee_status: the appliance's self-check as the proxy reads it, and the control
plane refusing pinned sessions while it says the appliance is not attested.

Real parts: the proxy (``ProxyServer``) with its control plane on a Unix socket, a real gRPC
client, and the real ``affidavit session new`` against it. The status file is what PID 1
writes (``write_tee_status``); no TEE is involved here."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest

from egress_proxy.control import ControlClient
from egress_proxy.server import ProxyServer
from egress_proxy.tee_status import (
    MAX_BYTES,
    REFUSAL,
    TeeStatus,
    TeeStatusError,
    TeeStatusUnreadable,
    pins_refusal,
    read_tee_status,
    write_tee_status,
)
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, proxy_config

WHEN = datetime(2026, 12, 3, 0, 1, 2, tzinfo=UTC)
NOT_YET = "the appliance has not checked its evidence yet"
FAILED = TeeStatus(attested=False, tee_type="none", reason="no evidence: no TEE", checked_at=WHEN)


def test_the_status_file_round_trips_root_s_and_world_readable(tmp_path: Path) -> None:
    path = tmp_path / "tee-status.json"
    status = TeeStatus(attested=True, tee_type="sev-snp", checked_at=WHEN)
    old = os.umask(0o077)
    try:
        write_tee_status(path, status)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert read_tee_status(path) == status
    text = path.read_text()
    assert '"format": "affidavit/tee-status/v1"' in text
    assert '"checked_at": "2026-12-03T00:01:02Z"' in text
    write_tee_status(path, FAILED)  # replaced whole
    assert read_tee_status(path) == FAILED
    assert not (tmp_path / "tee-status.json.tmp").exists()


def test_reading_refuses_what_is_not_a_status(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert read_tee_status(path) is None  # not written yet
    path.write_bytes(b" " * (MAX_BYTES + 1))
    with pytest.raises(TeeStatusError, match=f"larger than {MAX_BYTES} bytes"):
        read_tee_status(path)
    path.write_text("{")
    with pytest.raises(TeeStatusError, match=r"s\.json: \(the file\): Invalid JSON"):
        read_tee_status(path)
    good = FAILED.model_dump(mode="json")
    for change, where in (
        ({"format": "affidavit/tee-status/v2"}, "format"),
        ({"tee_type": "sgx"}, "tee_type"),
        ({"checked_at": "2026-12-03T00:01:02"}, "checked_at"),  # no offset: refused
        ({"extra": 1}, "extra"),
    ):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(TeeStatusError, match=f": {where}: "):
            read_tee_status(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(TeeStatusUnreadable):
        read_tee_status(path)
    offset = TeeStatus.model_validate({**good, "checked_at": "2026-12-03T01:01:02+01:00"})
    assert offset.checked_at == WHEN.astimezone(timezone(timedelta(hours=1)))


def test_pins_refusal() -> None:
    assert pins_refusal(None) == NOT_YET
    assert pins_refusal(TeeStatus(attested=True, tee_type="tdx", checked_at=WHEN)) is None
    allowed = FAILED.model_copy(update={"allow_unattested": True})
    assert pins_refusal(allowed) is None
    assert pins_refusal(FAILED) == (
        "the appliance's check of its own evidence failed (no evidence: no TEE); it runs with"
        " tee_type none, and only affidavit.unattested=allow on its kernel command line lets"
        " it pin sessions"
    )
    unsaid = FAILED.model_copy(update={"reason": None})
    assert "(no reason given)" in (pins_refusal(unsaid) or "")


# -- the control plane --------------------------------------------------------------------------


class Appliance:
    def __init__(self, proxy: ProxyServer, log: Log, socket: Path, status: Path) -> None:
        self.proxy, self.log, self.socket, self.status = proxy, log, socket, status
        self.user = KeyPair.generate()


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """A proxy whose config names a status file (as the guest's does), no status written."""
    where = tmp_path_factory.mktemp("tee")
    log = Log.open(where / "record.db", appliance_key=KeyPair.generate())
    status = where / "tee-status.json"
    socket = where / "control.sock"
    with LoopbackServer(FakeUpstream()) as up:
        config = proxy_config(up.url, tee_status=str(status))
        assert config.tee_status == status
        with ProxyServer(config, log, env=ENV, control_socket=socket) as proxy:
            yield Appliance(proxy, log, socket, status)
    log.close()


@pytest.fixture
def ctl(appliance: Appliance) -> Iterator[ControlClient]:
    appliance.status.unlink(missing_ok=True)
    with ControlClient(appliance.socket) as client:
        yield client


def _refused(call: Any) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    error: Any = info.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    details: str = error.details()
    assert details.startswith(REFUSAL)
    return details.removeprefix(REFUSAL)


def test_pins_are_refused_until_the_appliance_shows_itself_attested(
    appliance: Appliance, ctl: ControlClient
) -> None:
    user = [appliance.user.recipient]
    before = set(appliance.log.store.streams())
    pins = {"seed": 7}
    assert _refused(lambda: ctl.open_session(user, {}, pins)) == NOT_YET
    write_tee_status(appliance.status, FAILED)
    assert _refused(lambda: ctl.open_session(user, {}, pins)) == pins_refusal(FAILED)
    assert set(appliance.log.store.streams()) == before  # nothing recorded
    # a session without pins claims nothing: it opens; pinning it later is refused
    plain = ctl.open_session(user, {}, None)
    assert _refused(lambda: ctl.set_pins(plain.session_id, pins)) == pins_refusal(FAILED)
    ctl.set_pins(plain.session_id, None)  # no pins: nothing claimed, nothing refused
    # the file is read at each call: PID 1 writes it after the proxy started
    write_tee_status(appliance.status, FAILED.model_copy(update={"allow_unattested": True}))
    opened = ctl.open_session(user, {}, pins)
    assert appliance.proxy.registry.authenticate(opened.session_id, opened.token).pins == pins
    write_tee_status(
        appliance.status, TeeStatus(attested=True, tee_type="sev-snp", checked_at=WHEN)
    )
    ctl.set_pins(plain.session_id, pins)
    assert appliance.proxy.registry.get(plain.session_id).pins == pins  # type: ignore[union-attr]


def test_a_status_file_that_is_not_one_refuses_pins(
    appliance: Appliance, ctl: ControlClient
) -> None:
    appliance.status.write_text("attested: yes")
    said = _refused(lambda: ctl.open_session([appliance.user.recipient], {}, {"seed": 1}))
    assert said.startswith("the appliance's self-check status cannot be read (")


def test_a_proxy_without_a_status_file_pins_as_before(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "record.db", appliance_key=KeyPair.generate())
    try:
        with LoopbackServer(FakeUpstream()) as up:
            config = proxy_config(up.url)
            assert config.tee_status is None  # affidavit up on a developer's machine
            socket = tmp_path / "c.sock"
            with (
                ProxyServer(config, log, env=ENV, control_socket=socket),
                ControlClient(socket) as client,
            ):
                opened = client.open_session([KeyPair.generate().recipient], {}, {"seed": 3})
                assert opened.session_id
    finally:
        log.close()


def test_session_new_pinned_says_the_refusal_in_one_line(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main
    from harness.state import Appliance as ApplianceFile
    from harness.state import Home

    home = tmp_path / "home"
    home.mkdir()
    Home(home).write_appliance(
        ApplianceFile(
            proxy_url=appliance.proxy.url,
            control_socket=str(appliance.socket),
            store=str(tmp_path / "unused.db"),
            model="m",
        )
    )
    appliance.status.unlink(missing_ok=True)
    write_tee_status(appliance.status, FAILED)
    capsys.readouterr()
    assert main(["session", "new", "--pin", "default", "--home", str(home), "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"affidavit: error: {REFUSAL}{pins_refusal(FAILED)}\n"
    # unpinned, the same appliance opens the session
    assert main(["session", "new", "--home", str(home), "--json"]) == 0
    assert '"session"' in capsys.readouterr().out
