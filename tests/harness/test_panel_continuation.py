"""The panel names the stream a continuation carries on (#21 line 2), and links to it.

A real record (SQLite, written by ``record.log.Log``) in a home: stream ``old`` and a stream
``new`` whose ``stream.opened`` continues it (``record.continuation.link_to``; one log key
here, which only the proxy refuses). The panel's page of ``new`` says which stream it carries
on and from how many entries, with a link to that stream's page; ``old``'s page says nothing
of the kind.
"""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from harness.panel.app import create_app
from harness.panel.source import ApplianceSource
from harness.state import Home
from record.checkpoint import Signer
from record.continuation import link_to
from record.digest import Domain, digest
from record.log import LOG_KEY_NAME, Log
from record.schema import TurnStarted
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

TOKEN = "continuation-panel-token"


def test_the_page_of_a_continuation_names_and_links_the_stream_it_carries_on(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path / "home")
    home.root.mkdir()
    user = KeyPair.generate()
    user.write(home.user_key_file)
    with Log(SQLiteStore(home.root / "record.db"), Signer.generate(LOG_KEY_NAME)) as log:
        log.open_stream("old", [user.recipient])
        data = b"hello"
        log.append(
            "old", TurnStarted(turn=0, input_bytes=data, input_digest=digest(Domain.INPUT, data))
        )
        log.open_stream("new", [user.recipient], continues=link_to(log.store, "old"))
    client = TestClient(create_app(ApplianceSource(home), token=TOKEN))
    assert client.get(f"/?token={TOKEN}").status_code == 200
    page = client.get("/s/new").text
    assert 'class="continues"' in page
    assert 'Carries on <a href="/s/old">old</a>' in page
    assert "from its first 2 entries" in page
    assert 'class="continues"' not in client.get("/s/old").text
