"""``record.backends``: a store named by a path, a ``postgresql://`` URL or a registered
scheme's location, word for word.

Real stores only: a SQLite file in ``tmp_path`` and the private PostgreSQL cluster of
``tests/pg_server.py``; a database nobody answers on is a closed port on loopback. A scheme
is registered here with an opener of a SQLite file (the proxy's ``control:`` is tested with a
real proxy in ``tests/egress_proxy/test_control_store.py``).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

import record.backends as backends
from record.backends import (
    is_url,
    location,
    open_store,
    register_scheme,
    store_exists,
    store_label,
    store_name,
)
from record.errors import StoreMissing
from record.postgres_store import PostgresStore
from record.sqlite_store import SQLiteStore
from record.store import LogStore


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_only_a_postgresql_url_is_a_url() -> None:
    assert is_url("postgresql://u@h/db") and is_url("postgres://h/db")
    assert not is_url("postgresql:/h/db")  # a Path would have collapsed the two slashes
    assert not is_url(Path("postgresql://h/db")) and not is_url("record.db")
    assert not is_url("mysql://h/db") and not is_url("")


def test_names_and_labels() -> None:
    assert store_name(Path("/x/record.db")) == "/x/record.db"
    assert store_name("rel/record.db") == "rel/record.db"
    assert store_name("postgresql://u:secret@db.example:5433/rec") == (
        "postgresql://u@db.example:5433/rec"
    )
    assert store_label(Path("/x/record.db")) == "record.db"
    assert store_label("postgresql://u:secret@h/rec") == "postgresql://u@h/rec"


def test_exists(tmp_path: Path) -> None:
    assert not store_exists(tmp_path / "record.db")
    assert not store_exists(str(tmp_path))  # a folder is no store file
    SQLiteStore(tmp_path / "record.db").close()
    assert store_exists(tmp_path / "record.db") and store_exists(str(tmp_path / "record.db"))
    assert store_exists("postgresql://127.0.0.1:1/none")  # opening it says whether it is there


def test_a_path_opens_sqlite_writable_or_read_only(tmp_path: Path) -> None:
    writer = open_store(tmp_path / "record.db")
    assert isinstance(writer, SQLiteStore) and not writer.readonly
    writer.close()
    reader = open_store(str(tmp_path / "record.db"), readonly=True)
    assert isinstance(reader, SQLiteStore) and reader.readonly
    reader.close()
    with pytest.raises(StoreMissing):
        open_store(tmp_path / "absent.db", readonly=True)


def test_a_url_opens_postgresql(postgres_server: Any) -> None:
    url: str = postgres_server.fresh_database()
    try:
        writer = open_store(url)
        assert isinstance(writer, PostgresStore) and not writer.readonly
        writer.close()
        reader = open_store(url, readonly=True)
        assert isinstance(reader, PostgresStore) and reader.readonly
        reader.close()
    finally:
        postgres_server.drop_database(url)


def test_a_database_nobody_answers_on_is_missing_in_one_line() -> None:
    port = _closed_port()
    with pytest.raises(StoreMissing) as caught:
        open_store(f"postgresql://u:secret@127.0.0.1:{port}/none", readonly=True)
    import psycopg

    with pytest.raises(psycopg.OperationalError) as direct:
        psycopg.connect(f"postgresql://u:secret@127.0.0.1:{port}/none")
    first = str(direct.value).strip().splitlines()[0]  # the reason; what follows is a hint
    assert str(caught.value) == f"cannot reach store postgresql://u@127.0.0.1:{port}/none: {first}"
    assert "secret" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_url_without_the_postgres_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if not installed: import fails
    with pytest.raises(StoreMissing) as caught:
        open_store("postgresql://127.0.0.1:1/none")
    assert str(caught.value) == (
        "a PostgreSQL store needs the postgres extra: pip install 'affidavit[postgres]'"
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_postgres_names_fill_what_a_conninfo_leaves_out() -> None:
    from record.postgres_store import describe

    assert describe("dbname=rec") == "postgresql://localhost/rec"
    assert describe("host=db.example") == "postgresql://db.example/"
    assert describe("host=h port=5433 user=u password=p dbname=d") == "postgresql://u@h:5433/d"


def test_a_malformed_url_is_a_usage_error_that_does_not_echo_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from affidavit.cli import main
    from record.errors import BadStoreLocation

    url = "postgresql://u:secret@[::1/db"
    assert store_name(url) == "a malformed postgresql:// URL"
    with pytest.raises(BadStoreLocation) as caught:
        open_store(url, readonly=True)
    assert caught.value.exit_code == 2 and "secret" not in str(caught.value)
    assert str(caught.value).startswith("the store is not a PostgreSQL URL libpq reads: ")
    assert main(["log", "verify", url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith("affidavit: error: the store is not a PostgreSQL URL")
        and "secret" not in line
    )


@pytest.fixture
def no_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No scheme registered (whatever this process imported), and none left behind."""
    monkeypatch.setattr(backends, "_REGISTERED", {})


def test_a_registered_scheme_is_text_named_its_way_and_opened_by_its_opener(
    no_schemes: None, tmp_path: Path
) -> None:
    SQLiteStore(tmp_path / "record.db").close()
    opened: list[tuple[str, bool]] = []

    def opener(where: str, readonly: bool) -> LogStore:
        opened.append((where, readonly))
        return SQLiteStore(tmp_path / "record.db", readonly=readonly)

    assert not is_url("toy:/a/b")  # not yet: a path
    register_scheme("toy:", opener, lambda where: "the toy at " + where.removeprefix("toy:"))
    assert is_url("toy:/a/b") and location("toy:/a/b") == "toy:/a/b"
    assert not is_url(Path("toy:/a/b")) and not is_url("toyx:/a")
    assert store_name("toy:/a/b") == store_label("toy:/a/b") == "the toy at /a/b"
    assert store_exists("toy:/nowhere")  # opening it says whether it is there
    for readonly in (True, False):
        store = open_store("toy:/a/b", readonly=readonly)
        assert isinstance(store, SQLiteStore) and store.readonly is readonly
        store.close()
    assert opened == [("toy:/a/b", True), ("toy:/a/b", False)]


@pytest.mark.parametrize("prefix", ["", "toy", "postgresql://", "postgres://", "a/b:", "Toy:"])
def test_only_a_new_scheme_prefix_registers(no_schemes: None, prefix: str) -> None:
    with pytest.raises(ValueError, match="not a scheme prefix"):
        register_scheme(prefix, lambda where, readonly: SQLiteStore(where))
    assert backends._REGISTERED == {}


def test_a_control_location_where_nothing_registered_it_says_what_to_load(
    no_schemes: None,
) -> None:
    where = "control:/run/affidavit/control.sock"
    assert is_url(where) and location(where) == where and store_name(where) == where
    assert store_exists(where)
    with pytest.raises(StoreMissing) as caught:
        open_store(where, readonly=True)
    said = str(caught.value)
    assert said.startswith("a control: store is read by egress_proxy.control_store"), said
    assert "not loaded" in said and "No such file" not in said
