"""#21 line 1, the command line: ``affidavit up --store postgresql://…`` and every reader.

A private PostgreSQL cluster (``tests/pg_server.py``) holds the record. ``affidavit up`` runs
as a process in front of a provider it never calls, opens sessions into the database, and
stops; then, with nothing running, ``session show``, ``log verify``, ``log show``,
``log export``, ``log key`` and the panel read the same database, from the home (its ``store`` file)
and from ``--store URL``. The rows are read back with ``psycopg`` itself; the home holds no
``record.db``. A URL with a password is refused (it would be written to the home), and a
database nobody answers on is one line and exit 3.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from record.checkpoint import Signer
from record.log import LOG_KEY_NAME
from tests.pg_cluster import SUPERUSER
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

REPO = Path(__file__).resolve().parents[2]
PROVIDER = "http://127.0.0.1:9/v1"  # nothing listens: no completion is asked for


def _env(server: Any) -> dict[str, str]:
    # libpq's own variable: the password stays out of the URL the home keeps
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PGPASSWORD": server.password}


def _affidavit(server: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        cwd=REPO,
        env=_env(server),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def database(postgres_server: Any) -> Any:  # noqa: F811
    with_password: str = postgres_server.fresh_database()
    name = with_password.rsplit("/", 1)[1]
    url = f"postgresql://{SUPERUSER}@127.0.0.1:{postgres_server.port}/{name}"
    yield url
    postgres_server.drop_database(with_password)


def _up(server: Any, home: Path, store: str, console: Path) -> subprocess.Popen[bytes]:
    with console.open("wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "affidavit", "up", "--home", str(home)),
                *("--provider-url", PROVIDER, "--model-name", "pg-model", "--store", store),
            ],
            cwd=REPO,
            env=_env(server),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 90
    while b"affidavit is up" not in console.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"affidavit up did not start:\n{console.read_text()}")
        time.sleep(0.05)
    return proc


def _rows(server: Any, url: str, stream: str) -> int:
    import psycopg

    with psycopg.connect(url, password=server.password) as conn:
        row = conn.execute("SELECT count(*) FROM entries WHERE stream = %s", (stream,)).fetchone()
    assert row is not None
    return int(row[0])


def test_up_writes_the_record_to_postgresql_and_every_reader_reads_it_offline(
    postgres_server: Any,  # noqa: F811
    database: str,
    tmp_path: Path,
) -> None:
    server, home = postgres_server, tmp_path / "home"
    up = _up(server, home, database, tmp_path / "up.log")
    try:
        assert f"record {database};" in (tmp_path / "up.log").read_text()
        opened = _affidavit(server, "session", "new", "--json", "--home", str(home))
        assert opened.returncode == 0, opened.stderr
        session = json.loads(opened.stdout)["session"]
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
    assert not (home / "appliance.json").exists()  # nothing runs from here on
    assert not (home / "record.db").exists()
    assert (home / "store").read_text() == f"{database}\n"
    assert (home / "store").stat().st_mode & 0o777 == 0o600
    assert (home / "record.signing-key").is_file()
    assert _rows(server, database, session) >= 1

    shown = _affidavit(server, "session", "show", session, "--home", str(home), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "idle"

    for where in (["--home", str(home)], [database]):
        verified = _affidavit(server, "log", "verify", *where, "--key", str(home / "user.key"))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.startswith(f"ok: {database}: "), verified.stdout
    listed = _affidavit(server, "log", "show", session, "--store", database, "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == _rows(server, database, session)
    # a database keeps no one log key (appliances may share it): the home's appliance's is it
    vkey = _affidavit(server, "log", "key", "--home", str(home))
    signer = Signer.load_or_create(home / "record.signing-key", LOG_KEY_NAME)
    assert vkey.returncode == 0 and vkey.stdout == signer.vkey() + "\n", vkey.stderr
    elsewhere = tmp_path / "no-appliance"
    keyless = _affidavit(server, "log", "key", "--store", database, "--home", str(elsewhere))
    assert keyless.returncode == 1 and keyless.stdout == ""
    assert "is shared and keeps no one log key" in keyless.stderr, keyless.stderr
    bundle = tmp_path / "bundle"
    exported = _affidavit(
        server, "log", "export", session, "--store", database, "--out", str(bundle)
    )
    assert exported.returncode == 0, exported.stderr
    checked = _affidavit(server, "log", "verify", str(bundle), "--key", str(home / "user.key"))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # the panel, with nothing running, lists the session from the database
    panel = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "panel", "--home", str(home), "--json"],
        cwd=REPO,
        env=_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert panel.stdout is not None
        doc = json.loads(panel.stdout.readline())
        with httpx.Client(trust_env=False, timeout=30) as http:
            page = http.get(doc["url"], follow_redirects=True)
        assert page.status_code == 200 and session in page.text, page.text[:2000]
    finally:
        panel.send_signal(signal.SIGINT)
        assert panel.wait(timeout=30) == 0, panel.stderr.read() if panel.stderr else ""

    # a second start takes the kept store with no --store, and appends to the same database
    again = _up(server, home, database, tmp_path / "again.log")
    try:
        more = _affidavit(server, "session", "new", "--json", "--home", str(home))
        assert more.returncode == 0, more.stderr
        second = json.loads(more.stdout)["session"]
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0
    assert _rows(server, database, second) >= 1
    assert not (home / "record.db").exists()


def test_a_password_in_the_url_is_refused_and_an_unanswered_database_is_missing(
    postgres_server: Any,  # noqa: F811
    database: str,
    tmp_path: Path,
) -> None:
    server = postgres_server
    with_password = database.replace(f"{SUPERUSER}@", f"{SUPERUSER}:{server.password}@")
    refused = _affidavit(
        server,
        *("up", "--home", str(tmp_path / "h"), "--provider-url", PROVIDER),
        *("--model-name", "m", "--store", with_password),
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "keep the password out of the URL" in refused.stderr
    assert server.password not in refused.stdout + refused.stderr
    assert not (tmp_path / "h" / "store").exists()

    nobody = "postgresql://affidavit@127.0.0.1:9/none"
    gone = _affidavit(server, "log", "verify", nobody)
    assert gone.returncode == 3, gone.stdout + gone.stderr
    (line,) = gone.stderr.splitlines()
    assert line.startswith("affidavit: ") and "cannot reach store postgresql://" in line, line


def test_a_database_that_is_not_a_record_is_one_line_and_1(
    postgres_server: Any,  # noqa: F811
    database: str,
) -> None:
    import psycopg

    server = postgres_server
    with psycopg.connect(database, password=server.password, autocommit=True) as conn:
        conn.execute("CREATE TABLE entries (stream TEXT)")  # a table of that name, not ours
    shown = _affidavit(server, "log", "show", "s", "--store", database)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    (line,) = shown.stderr.splitlines()
    assert line.startswith(f"affidavit: {database} is not a readable record store: "), line
    assert "Traceback" not in shown.stderr


def test_two_appliances_run_at_once_on_one_database(
    postgres_server: Any,  # noqa: F811
    database: str,
    tmp_path: Path,
) -> None:
    """#21: two `affidavit up` (two homes, two sets of keys) write to one PostgreSQL store at
    the same time; each session is its own appliance's stream, signed by its own log key, and
    the store audits as a whole and appliance by appliance."""
    server = postgres_server
    homes = [tmp_path / "a", tmp_path / "b"]
    ups = [_up(server, home, database, tmp_path / f"up-{home.name}.log") for home in homes]
    try:
        sessions = []
        for home in homes:
            opened = _affidavit(server, "session", "new", "--json", "--home", str(home))
            assert opened.returncode == 0, opened.stderr
            sessions.append(json.loads(opened.stdout)["session"])
    finally:
        for up in ups:
            up.send_signal(signal.SIGTERM)
        for up in ups:
            assert up.wait(timeout=60) == 0
    keys = []
    for home in homes:
        printed = _affidavit(server, "log", "key", "--home", str(home))
        assert printed.returncode == 0, printed.stderr
        keys.append(printed.stdout.strip())
    assert keys[0] != keys[1]  # each appliance its own log key, on its own disk
    whole = _affidavit(server, "log", "verify", database, "--json")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    for key, mine, theirs in ((keys[0], *sessions), (keys[1], *reversed(sessions))):
        pinned = _affidavit(server, "log", "verify", database, "--log-key", key, "--json")
        assert pinned.returncode == 1
        streams = {p["stream"] for p in json.loads(pinned.stdout)["problems"]}
        assert theirs in streams and mine not in streams
