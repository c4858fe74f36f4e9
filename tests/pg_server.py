"""A private PostgreSQL cluster for the run: ``postgres_server``, a session fixture.

The cluster itself is ``tests/pg_cluster.py`` (shared with ``bench/log_append.py``): Debian's
binaries (``/usr/lib/postgresql/<version>/bin``, installed by ``make test``'s
``system-deps``), ``initdb`` into a fresh temporary folder, listening on 127.0.0.1 only, on a
free port, with its Unix socket in that folder, ``fsync`` and ``synchronous_commit`` on, run
as the system user ``affidavit-pg`` when we are root (``initdb`` refuses root, and CI runs as
root). The fixture starts it once per session, stops it (``pg_ctl stop -m fast``) and removes
its folder at the end. The superuser's password is random, so only this run can log in.

Missing binaries skip the tests that need the server, saying why; with ``CI=true`` that skip
fails (``tests/conftest.py``), since ``make test`` installs them.

A conftest makes the fixture available by importing it (``from tests.pg_server import
postgres_server``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg_cluster import (
    SERVICE_USER,
    SETTINGS,
    SUPERUSER,
    ClusterUnavailable,
    PostgresServer,
    find_bin_dir,
    start_server,
    stop_server,
)

__all__ = [
    "SERVICE_USER",
    "SETTINGS",
    "SUPERUSER",
    "PostgresServer",
    "find_bin_dir",
    "postgres_server",
    "start_server",
    "stop_server",
]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster on 127.0.0.1 for the whole run, removed at the end."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin): "
            "`make test` installs Debian's postgresql package (make system-deps)"
        )
    pytest.importorskip("psycopg", reason="psycopg is missing: install the `postgres` extra")
    try:
        server = start_server(bin_dir)
    except ClusterUnavailable as why:
        pytest.skip(str(why))
    try:
        yield server
    finally:
        stop_server(server)
