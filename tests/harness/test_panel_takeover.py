"""The panel's turn page shows where the writer changed mid-turn: a ``lease.taken`` entry
(one writer per stream, ``docs/record.md`` §2) written by the writer that took the stream
over from one that stopped without letting go. Pages come from the real app (Starlette's
test client) over a real store written by two real logs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("jinja2", reason="the panel renders with Jinja2")

from starlette.testclient import TestClient

from harness.panel.app import create_app
from harness.panel.source import ApplianceSource
from harness.state import Home
from record.checkpoint import Signer
from record.digest import Domain, digest
from record.log import LOG_KEY_NAME, Log
from record.schema import ModelResponse, TurnEnded, TurnStarted
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.egress_proxy.test_limits import _request

TOKEN = "takeover-test-token"
STREAM = "session-taken-over"


class _CannotLetGo(SQLiteStore):
    """A store that is gone by the time its writer stops: its leases stay "held"."""

    def release_leases(self, holder: str) -> None:
        raise sqlite3.OperationalError("the store went away")


def test_the_turn_page_shows_where_the_writer_changed(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.root.mkdir()
    user, appliance = KeyPair.generate(), KeyPair.generate()
    user.write(home.user_key_file)
    store = home.root / "record.db"
    signer = Signer.load_or_create(home.root / "record.db.signing-key", LOG_KEY_NAME)
    said = b"What happened?"

    first = Log(_CannotLetGo(store), signer, appliance_key=appliance)
    first.open_stream(STREAM, [user.recipient, appliance.recipient])
    first.append(STREAM, TurnStarted(turn=0, input_bytes=said,
                                     input_digest=digest(Domain.INPUT, said)))  # fmt: skip
    asked = first.append(STREAM, _request()).seq
    holder = first.holder
    first.close()  # could not let go: the next writer takes over
    with Log.open(store, appliance_key=appliance, lease_wait=0) as second:
        second.append(STREAM, ModelResponse(request_seq=asked, outcome="UNKNOWN"))
        second.append(STREAM, TurnEnded(turn=0, outcome="FAILED"))
        taker = second.holder

    client = TestClient(create_app(ApplianceSource(home), token=TOKEN))
    assert client.get(f"/?token={TOKEN}").status_code == 200
    page = client.get(f"/s/{STREAM}/t/0")
    assert page.status_code == 200
    assert page.text.count('class="warn takeover"') == 1
    assert "the writer changed mid-turn" in page.text
    assert f"<code>{taker}</code> took the stream over from <code>{holder}</code>" in page.text
