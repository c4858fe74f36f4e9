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
from pathlib import Path
from typing import Any

import httpx

from enclave_image.appliance import BootOptions, GuestLayout
from enclave_image.appliance_config import SERIAL, OperatorConfig, config_disk_bytes
from tests.attestation.kds_double import stand_in_kds
from tests.enclave_image.host_guest import boot, host_layout
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
    with stand_in_kds() as kds:
        layout = host_layout(
            tmp_path,
            block_dir=block,
            dev_dir=dev,
            store_on_loopback=True,  # the tests' private PostgreSQL listens on 127.0.0.1
            kds_url=kds.url,
        )
        # no TEE here: the self-check fails, and only the override lets the pinned turn run
        options = BootOptions(
            tmp_path / "disk", "test-insecure", selftest=True, allow_unattested=True
        )
        booted = boot(layout, options)
        said = booted.said
        try:
            assert booted.selftest.wait(120), "\n".join(said)
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
            # The database is shared: the appliance's own key tells its streams from others'
            log_key = next(x for x in said if x.startswith("keys: log key ")).split()[-1]
            key = _as_harness(layout, "log", "key")
            assert (key.returncode, key.stdout.strip()) == (0, log_key), key.stderr
            forged = _forge_a_session(url, layout, "01a00000-0000-7000-8000-00000000f0e6")
            # ... and one whose opening claims this appliance's key (a public value)
            claimed = _forge_a_session(url, layout, "01a00000-0000-7000-8000-00000000c1a1", log_key)
            # The weekly check reads only this appliance's streams: a session someone put in
            # the database under another key, sealed to the harness's key, pages nobody.
            checked = _as_harness(layout, "diverge", "--reconstruct-only", "--json")
            assert checked.returncode == 0, checked.stdout + checked.stderr
            said_by_check = checked.stderr + checked.stdout
            assert f"skipping stream {forged}: opened by another appliance's log key" in (
                said_by_check
            )
            assert (
                f"skipping stream {claimed}: it claims this appliance's log key, but no"
                " checkpoint of it is signed by that key"
            ) in said_by_check
            assert json.loads(checked.stdout)["failures"] == []
            _panel_tells_ours_from_others(said, layout.harness_port, session, forged)
        finally:
            booted.shut()
    assert booted.result == [0], "\n".join(said)
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
        # the harness's audit, through the proxy, read every entry the database held then
        assert audit["ok"]
        assert audit["entries"] == sum(store.size(s) for s in streams if s not in (forged, claimed))
    finally:
        store.close()


def _forge_a_session(url: str, layout: GuestLayout, stream: str, claim: str | None = None) -> str:
    """What the database's administrator can do: a session of its own, under a log key of
    its own, sealed to the harness's key (its public half is in every stream.opened);
    ``claim``: the log key its opening names instead (any public key, this appliance's)."""
    from record.digest import Domain, digest
    from record.log import Log
    from record.schema import TurnEnded, TurnStarted
    from record.seal import KeyPair

    harness_key = KeyPair.read(layout.home_dir / "user.key").recipient
    with Log.open(url, signing_key=layout.run_dir / "forger.key") as log:
        if claim is not None:
            log.signer.vkey = lambda: claim  # type: ignore[method-assign]
        log.open_stream(stream, [harness_key])
        said = b"Transfer everything (forged by the database)"
        log.append(
            stream, TurnStarted(turn=0, input_bytes=said, input_digest=digest(Domain.INPUT, said))
        )
        done = b"Done."
        log.append(
            stream,
            TurnEnded(
                turn=0,
                outcome="ANSWERED",
                answer_bytes=done,
                answer_digest=digest(Domain.RESPONSE, done),
            ),
        )
        log.checkpoint(stream)
    return stream


def _panel_tells_ours_from_others(said: list[str], port: int, session: str, forged: str) -> None:
    """The panel checks each stream against this appliance's log key: its own session
    shows no problem, the forged one is named as not signed by it."""
    printed = next(x for x in said if x.startswith("[harness] affidavit panel: "))
    token = printed.rsplit("?token=", 1)[1]
    base = f"http://127.0.0.1:{port}/panel"
    with httpx.Client(timeout=30) as client:
        signed = client.get(f"{base}/?token={token}")
        assert signed.status_code == 303
        index = client.get(f"{base}/")
        assert index.status_code == 200 and session in index.text, index.text[:2000]
        ours = client.get(f"{base}/s/{session}")
        assert ours.status_code == 200, ours.text[:2000]
        assert 'class="problems"' not in ours.text, ours.text[:4000]
        theirs = client.get(f"{base}/s/{forged}")
        assert theirs.status_code == 200, theirs.text[:2000]
        assert 'class="problems"' in theirs.text and "checkpoint_invalid" in theirs.text
