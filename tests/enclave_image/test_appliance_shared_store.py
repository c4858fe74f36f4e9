"""The appliance on a shared PostgreSQL store: a config disk names the database, the proxy
writes the record there, and the harness's commands and panel read it through the proxy's
control socket (``docs/deploy.md``, "The appliance image on a shared store").

Real parts: the guest program's ``run_appliance`` on the host (as ``test_appliance.py``
runs it), the real engine with a test build's tiny model, the real proxy process, a private
PostgreSQL cluster (``tests/pg_server.py``), the ``affidavit`` command line in subprocesses,
the panel over HTTP. The one double is the TEE (none here: the self-check fails and
``affidavit.unattested=allow`` lets the self-test's pinned turn run), and the config disk is
a file named by a stand-in ``/sys/block`` (a container has no virtio disk to attach).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from enclave_image.appliance import BootOptions, GuestLayout, run_appliance
from enclave_image.appliance_config import SERIAL, OperatorConfig, config_disk_bytes
from tests.attestation.kds_double import stand_in_kds
from tests.enclave_image.test_appliance import _free_ports
from tests.enclave_image.test_appliance_config import db_ca_pem
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

REPO = Path(__file__).resolve().parents[2]


def _as_harness(layout: GuestLayout, *args: str) -> subprocess.CompletedProcess[str]:
    """An ``affidavit`` command as the harness's service runs one: its home, its env."""
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "AFFIDAVIT_HOME": str(layout.home_dir)},
        timeout=120,
        check=False,
    )


def test_the_appliance_writes_a_shared_store_and_its_harness_reads_it_through_the_proxy(
    tmp_path: Path,
    postgres_server: Any,  # noqa: F811
) -> None:
    from enclave_image.build import model_tree
    from record.postgres_store import PostgresStore

    url = postgres_server.fresh_database()
    model_tree(tmp_path / "model", test_model="tiny")
    block, dev = tmp_path / "sys-block", tmp_path / "dev"
    (block / "vdf").mkdir(parents=True)
    (block / "vdf" / "serial").write_text(SERIAL + "\n")
    dev.mkdir()
    # with a CA for the server, as docs/deploy.md writes it (the tests' server speaks no TLS,
    # so libpq's default sslmode=prefer goes on without it; the CA file must not stop it)
    config = OperatorConfig(format="affidavit-config/1", store=url, store_ca=db_ca_pem(tmp_path))
    (dev / "vdf").write_bytes(config_disk_bytes(config))
    engine, proxy, harness, tls = _free_ports(4)
    (tmp_path / "state").mkdir()
    with stand_in_kds() as kds:
        layout = GuestLayout(
            state_mount=tmp_path / "state",
            run_dir=tmp_path / "run",
            sev_guest=tmp_path / "no-sev-guest",
            model_dir=tmp_path / "model",
            block_dir=block,
            dev_dir=dev,
            store_on_loopback=True,  # the tests' private PostgreSQL listens on 127.0.0.1
            python=sys.executable,
            engine_port=engine,
            proxy_port=proxy,
            harness_port=harness,
            tls_port=tls,
            tls_host="127.0.0.1",
            switch_users=False,
            start_timeout=60,
            engine_start_timeout=60,
            env={"PYTHONPATH": str(REPO)},
            kds_url=kds.url,
        )
        said: list[str] = []
        ready = threading.Event()

        def say(line: str) -> None:
            said.append(line)
            if line.startswith("selftest: "):
                ready.set()

        stop = threading.Event()
        options = BootOptions(
            tmp_path / "disk", "test-insecure", selftest=True, allow_unattested=True
        )
        result: list[int] = []
        thread = threading.Thread(
            target=lambda: result.append(run_appliance(layout, options, True, say, stop))
        )
        thread.start()
        try:
            assert ready.wait(120), "\n".join(said)
            turn = next(x for x in said if x.startswith("selftest: "))
            assert " ANSWERED reply sha256=" in turn, "\n".join(said)
            session = turn.split(" of session ", 1)[1].split()[0]
            # As the harness: the home names the store by the control socket, not the URL
            named = json.loads((layout.home_dir / "appliance.json").read_text())["store"]
            assert named == f"control:{layout.control_socket}"
            assert postgres_server.password not in json.dumps(named)
            verified = _as_harness(layout, "log", "verify", "--json")
            assert verified.returncode == 0, verified.stdout + verified.stderr
            audit = json.loads(verified.stdout)
            shown = _as_harness(layout, "session", "show", session, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["status"] == "idle"
            _panel_lists(said, harness, session)
        finally:
            stop.set()
            thread.join(60)
    assert result == [0], "\n".join(said)
    assert any(
        x.startswith("store: postgresql://") and "(from the config disk" in x for x in said
    ), said
    assert not (tmp_path / "state" / "record" / "record.db").exists()
    # The database holds the record: the self-test's session and the boot evidence stream
    store = PostgresStore(url, readonly=True)
    try:
        streams = store.streams()
        assert session in streams
        assert store.size(session) > 4
        # the harness's audit, through the proxy, read every entry the database holds
        assert audit["ok"] and audit["entries"] == sum(store.size(s) for s in streams)
    finally:
        store.close()


def _panel_lists(said: list[str], port: int, session: str) -> None:
    printed = next(x for x in said if x.startswith("[harness] affidavit panel: "))
    token = printed.rsplit("?token=", 1)[1]
    base = f"http://127.0.0.1:{port}/panel"
    with httpx.Client(timeout=30) as client:
        signed = client.get(f"{base}/?token={token}")
        assert signed.status_code == 303
        index = client.get(f"{base}/")
        assert index.status_code == 200 and session in index.text, index.text[:2000]
        page = client.get(f"{base}/s/{session}")
        assert page.status_code == 200, page.text[:2000]
