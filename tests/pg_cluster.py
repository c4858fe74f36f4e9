"""Start and stop a private PostgreSQL cluster: shared by the tests' fixture
(``tests/pg_server.py``) and the log bench (``bench/log_append.py``). No pytest here.

Nothing here assumes a server is already running. ``find_bin_dir`` finds Debian's binaries
(``/usr/lib/postgresql/<version>/bin``, installed by ``make test``'s ``system-deps``);
``start_server`` ``initdb``s a cluster into a fresh temporary folder and starts it listening
on 127.0.0.1 only, on a free port, with its Unix socket in that folder, and ``fsync`` and
``synchronous_commit`` on; ``stop_server`` stops it (``pg_ctl stop -m fast``) and removes the
folder. The superuser's password is random, so only this process can log in.

``initdb`` refuses to run as root, and CI runs as root: then the cluster runs as the system
user ``affidavit-pg``, created (``useradd --system``) when it is missing; when it cannot be,
``start_server`` raises :class:`ClusterUnavailable`.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

SERVICE_USER = "affidavit-pg"
SUPERUSER = "affidavit"
#: Written into the cluster's postgresql.conf; the durability pair is asserted by the tests.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",
    "shared_buffers": "32MB",
}


class ClusterUnavailable(RuntimeError):
    """This machine cannot run a private cluster (and the message says why)."""


def find_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL's ``bin`` folder that has ``initdb`` and ``pg_ctl``."""
    found = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bin_dir = Path(initdb).parent
        version = bin_dir.parent.name
        if (bin_dir / "pg_ctl").is_file() and version.isdigit():
            found.append((int(version), bin_dir))
    return max(found)[1] if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_account() -> pwd.struct_passwd | None:
    """Who runs the cluster: ``affidavit-pg`` when we are root (created if missing), else
    ``None`` (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ClusterUnavailable(
            f"running as root, and there is no useradd to create {SERVICE_USER}"
        )
    subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(SERVICE_USER)


@dataclass
class PostgresServer:
    """A running private cluster; ``fresh_database()`` gives each user its own database."""

    bin_dir: Path
    root: Path
    port: int
    password: str
    account: pwd.struct_passwd | None
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def fresh_database(self) -> str:
        """Create an empty database and return its URL."""
        name = f"t{next(self._names)}"
        self._admin("CREATE DATABASE {}", name)
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database ``fresh_database`` made (its stores closed or not): its dirty pages
        go with it, so stopping the cluster needs no long shutdown checkpoint."""
        name = url.rsplit("/", 1)[1]
        self._admin("DROP DATABASE {} WITH (FORCE)", name)

    def _admin(self, template: LiteralString, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL(template).format(sql.Identifier(name)))

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one of the cluster's tools as the cluster's owner."""
        owner: dict[str, Any] = {}
        if self.account is not None:
            owner = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bin_dir / tool), *args],
            check=check,
            capture_output=True,
            text=True,
            cwd=self.root,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
            timeout=120,
            **owner,
        )


def start_server(bin_dir: Path) -> PostgresServer:
    account = _service_account()
    # Under /tmp when the cluster runs as another user: it must reach its folder, and a
    # root's TMPDIR may be closed to it.
    root = Path(tempfile.mkdtemp(prefix="affidavit-pg-", dir="/tmp" if account else None))
    if account is not None:
        os.chown(root, account.pw_uid, account.pw_gid)
    server = PostgresServer(bin_dir, root, _free_port(), secrets.token_hex(16), account)
    pwfile = root / "pwfile"
    pwfile.write_text(server.password + "\n")
    if account is not None:
        os.chown(pwfile, account.pw_uid, account.pw_gid)
    # --no-sync: only initdb's own final fsync of the new files is skipped; the server then
    # runs with fsync on, and the tests check it.
    server.run(
        "initdb", "--pgdata", str(server.data), "--username", SUPERUSER,
        "--pwfile", str(pwfile), "--auth", "scram-sha-256", "--encoding", "UTF8",
        "--locale", "C.UTF-8", "--no-sync", "--no-instructions",
    )  # fmt: skip
    pwfile.unlink()
    settings = {**SETTINGS, "port": str(server.port), "unix_socket_directories": f"'{root}'"}
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write("\n# a private cluster (tests/pg_cluster.py)\n")
        conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
    started = server.run(
        "pg_ctl", "start", "--pgdata", str(server.data), "--log", str(root / "server.log"),
        "--wait", "--timeout", "60", check=False,
    )  # fmt: skip
    if started.returncode != 0:
        log = (
            (root / "server.log").read_text(errors="replace")
            if (root / "server.log").exists()
            else ""
        )
        stop_server(server)
        raise RuntimeError(f"the private PostgreSQL did not start: {started.stderr}\n{log}")
    return server


def stop_server(server: PostgresServer) -> None:
    try:
        if (server.data / "postmaster.pid").exists():
            server.run("pg_ctl", "stop", "--pgdata", str(server.data), "--mode", "fast", "--wait")
    finally:
        shutil.rmtree(server.root, ignore_errors=True)


@contextmanager
def private_cluster(bin_dir: Path) -> Iterator[PostgresServer]:
    """A started cluster, stopped and removed on leaving the block."""
    server = start_server(bin_dir)
    try:
        yield server
    finally:
        stop_server(server)
