"""The operator's config disk (``enclave_image.appliance_config``): written by `affidavit image
config-disk` as ``docs/deploy.md`` shows it, found by its serial, read as hostile input, and
turned into the proxy's store and the harness's ``control:`` location at boot.

The URL checks go through libpq's own parser (psycopg's ``conninfo_to_dict``); the boot with a
real PostgreSQL store is ``test_appliance.py``'s."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="the config disk's checks need the postgres extra")

from enclave_image.appliance import GuestLayout, Refused, prepare_store, services
from enclave_image.appliance_config import (
    MAX_CONFIG_BYTES,
    SERIAL,
    ConfigError,
    OperatorConfig,
    config_disk_bytes,
    find_config_disk,
    parse_config,
    read_config,
    store_conninfo,
)

REPO = Path(__file__).resolve().parents[2]
URL = "postgresql://affidavit:s3cret@db.example.internal:5432/records?sslmode=verify-full"


def db_ca_pem(tmp_path: Path) -> str:
    """A self-signed CA certificate, PEM: what an operator gives as `--store-ca`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "db CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM).decode()


def _doc(**members: object) -> bytes:
    return json.dumps({"format": "affidavit-config/1", **members}).encode()


def test_a_config_disk_reads_back_with_padding_and_its_url_intact(tmp_path: Path) -> None:
    pem = db_ca_pem(tmp_path)
    data = config_disk_bytes(OperatorConfig(format="affidavit-config/1", store=URL, store_ca=pem))
    assert len(data) % 4096 == 0  # whole sectors: QEMU serves no partial one
    disk = tmp_path / "config.img"
    disk.write_bytes(data)
    config = read_config(disk)
    assert (config.store, config.store_ca) == (URL, pem)
    # NUL padding (a disk image made bigger with truncate) reads the same
    disk.write_bytes(_doc(store=URL) + b"\0" * 8192)
    assert read_config(disk).store == URL


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (_doc(store=URL + "&passfile=/var/lib/affidavit/record/appliance.key"), "sets passfile"),
        (_doc(store=URL + "&sslkey=/var/lib/affidavit/tls/key.pem"), "sets sslkey"),
        (_doc(store=URL + "&service=x"), "sets service"),
        (_doc(store=URL + "&options=-c%20synchronous_commit%3Doff"), "sets options"),
        (_doc(store="postgresql://u@%2Fvar%2Frun%2Fpostgresql/db"), "not a host name or a"),
        (_doc(store="postgresql://127.1/db"), "not a host name or a canonical IP"),
        (_doc(store="postgresql://2130706433/db"), "not a host name or a canonical IP"),
        (_doc(store="postgresql://0x7f000001/db"), "not a host name or a canonical IP"),
        (_doc(store="postgresql://0/db"), "not a host name or a canonical IP"),
        (_doc(store="postgresql://localhost./db"), "not the name or address of another"),
        (_doc(store="postgresql://db.localhost/db"), "not the name or address of another"),
        (_doc(store="postgresql://ip6-localhost/db"), "not the name or address of another"),
        (_doc(store="postgresql:///records"), "names no host"),
        (_doc(store="postgresql:///db?hostaddr=10.0.0.5,"), "hostaddr '' is not"),
        (_doc(store="postgresql:///db?hostaddr=,10.0.0.5"), "hostaddr '' is not"),
        (_doc(store="postgresql://127.0.0.1/db"), "not the name or address of another"),
        (_doc(store="postgresql://localhost/db"), "not the name or address of another"),
        (_doc(store="postgresql:///db?hostaddr=::1"), "hostaddr '::1' is not"),
        (_doc(store="postgresql://a,b/db?hostaddr=10.0.0.5"), "different numbers of servers"),
        (_doc(store="postgresql://affidavit:Pa55/w0rd@db.example:5432/records"), "the port is"),
        (_doc(store="postgresql://affidavit:P@55w0rd@db.example/records"), "percent-encoded"),
        (_doc(store="postgresql://u:s3cret@db.example/records@x"), "database name holds @"),
        (_doc(store=URL + "&connect_timeout=abc"), "connect_timeout is not"),
        (_doc(store=URL.replace("verify-full", "require") + "&sslrootcert=system"), "needs sslm"),
        (_doc(store=URL + "&target_session_attrs=bogus"), "target_session_attrs=bogus"),
        (_doc(store="postgresql://u:%FFs3cret@db.example/records"), "libpq cannot read"),
        (_doc(store="postgresql://u:s3cret@db.example/records\u0000?passfile=/x"), "control char"),
        (_doc(store="postgresql://db.example.internal"), "names no database"),
        (_doc(store=URL + "&sslrootcert=/etc/ssl/x.pem"), "sslrootcert may only be `system`"),
        (_doc(store=URL.replace("verify-full", "paranoid")), "sslmode=paranoid"),
        (_doc(store="mysql://db/x"), "not a postgresql:// URL"),
        (_doc(store="postgresql://h/d?port=notaport&x=1"), "libpq cannot read"),
        (_doc(store=URL, extra=1), "extra: Extra inputs are not permitted"),
        (b'{"format": "affidavit-config/2"}', "format: Input should be"),
        (_doc(store_ca="-----BEGIN CERTIFICATE-----"), "store_ca: given without a store"),
        (_doc(store=URL, store_ca="not a certificate"), "store_ca: not PEM certificates"),
        (b'{"format": "affidavit-config/1", "format": "affidavit-config/1"}', "not one JSON"),
        (b"store=" + URL.encode(), "not one JSON document"),
        (b"[" * 200 + b"]" * 200, "not one JSON document"),
        (b"\0" * 4096, "the config disk is empty"),
        (b" " * (MAX_CONFIG_BYTES + 1) + b"{}", "more than 65536 bytes"),
    ],
)
def test_a_hostile_config_disk_is_refused_naming_what_is_wrong(doc: bytes, why: str) -> None:
    with pytest.raises(ConfigError, match=why.replace("(", r"\(").replace("?", r"\?")) as refused:
        parse_config(doc)
    assert "s3cret" not in str(refused.value)  # the password is never quoted back


def _sysfs(tmp_path: Path, disks: dict[str, str | None]) -> tuple[Path, Path]:
    """A ``/sys/block`` and ``/dev`` of ``disks`` (name: serial, None for no serial file)."""
    block, dev = tmp_path / "sys-block", tmp_path / "dev"
    for name, serial in disks.items():
        (block / name).mkdir(parents=True)
        if serial is not None:
            (block / name / "serial").write_text(serial + "\n")
    dev.mkdir(exist_ok=True)
    return block, dev


def test_urls_an_operator_writes_are_taken() -> None:
    for url in (
        URL,
        "postgresql://affidavit:P%40ss%2Fword@db.example:5432/records",
        "postgresql://svc%40tenant:s3cret@[2001:db8::5]:6432/records?sslrootcert=system",
        "postgres://u@a.example:5432,b.example:5433/records?target_session_attrs=read-write",
        "postgres://u@a.example,b.example:5433/records",
        "postgresql:///records?hostaddr=10.0.0.5&port=5432&connect_timeout=10",
    ):
        assert parse_config(_doc(store=url)).store == url
    # with a CA, the proxy's URL is rebuilt from what libpq read: a spelling libpq takes
    # (a # or ? in a password, a trailing ? or &) reads back the same, CA file added
    from psycopg.conninfo import conninfo_to_dict

    for url in (
        "postgresql://u:pa#ss@db.example/records",
        "postgresql://u:p?x@db.example/records",
        "postgresql://u@db.example/records?",
        "postgresql://u@db.example/records?sslmode=verify-full&",
    ):
        config = parse_config(_doc(store=url, store_ca=db_ca_pem(Path("."))))
        built = conninfo_to_dict(store_conninfo(config, Path("/run/x/store-ca.pem")))
        assert built == {**conninfo_to_dict(url), "sslrootcert": "/run/x/store-ca.pem"}
    # the tests' own server is on loopback: only the layout's test knob takes it
    parse_config(_doc(store="postgresql://u@127.0.0.1:5432/db"), loopback=True)


def test_the_config_disk_is_the_one_with_the_serial(tmp_path: Path) -> None:
    block, dev = _sysfs(tmp_path, {"vda": "", "vde": None, "vdf": SERIAL, "loop0": None})
    assert find_config_disk(block, dev) == dev / "vdf"
    block, dev = _sysfs(tmp_path / "none", {"vda": "", "vdb": "affidavit-config-2"})
    assert find_config_disk(block, dev) is None
    assert find_config_disk(tmp_path / "no-sysfs", dev) is None


def _layout(tmp_path: Path, block: Path, dev: Path) -> GuestLayout:
    layout = GuestLayout(
        state_mount=tmp_path / "state",
        run_dir=tmp_path / "run",
        model_dir=tmp_path / "model",
        block_dir=block,
        dev_dir=dev,
        switch_users=False,
    )
    layout.store_file.parent.mkdir(parents=True)
    return layout


def test_boot_hands_the_store_to_the_proxy_alone_and_the_harness_a_control_location(
    tmp_path: Path,
) -> None:
    from enclave_image.appliance import write_appliance_json
    from enclave_image.build import model_tree

    model_tree(tmp_path / "model", test_model="tiny")
    pem = db_ca_pem(tmp_path)
    block, dev = _sysfs(tmp_path, {"vde": None, "vdf": SERIAL})
    (dev / "vdf").write_bytes(
        config_disk_bytes(OperatorConfig(format="affidavit-config/1", store=URL, store_ca=pem))
    )
    layout = _layout(tmp_path, block, dev)
    said: list[str] = []
    assert prepare_store(layout, said.append)
    assert said == [
        f"store: postgresql://affidavit@db.example.internal:5432/records (from the config disk"
        f" {dev / 'vdf'}); the harness reads it through the proxy's control socket"
    ]
    from psycopg.conninfo import conninfo_to_dict

    from record.backends import is_url

    conninfo = layout.store_file.read_text()
    assert is_url(conninfo)  # a URL, as every store location names a database
    params = conninfo_to_dict(conninfo)
    assert params["password"] == "s3cret" and params["sslmode"] == "verify-full"
    assert Path(str(params["sslrootcert"])).read_text() == pem
    for private in (layout.store_file, layout.store_ca_file):
        assert private.stat().st_mode & 0o777 == 0o600
    proxy = services(layout, shared_store=True)["proxy"]
    assert proxy.argv[-2:] == ("--store-file", str(layout.store_file))
    assert not any("s3cret" in word for word in proxy.argv)  # /proc/PID/cmdline is public
    layout.home_dir.mkdir(parents=True)
    write_appliance_json(layout, shared_store=True)
    named = json.loads((layout.home_dir / "appliance.json").read_text())["store"]
    assert named == f"control:{layout.control_socket}"


def test_without_a_config_disk_the_record_stays_on_the_state_disk(tmp_path: Path) -> None:
    block, dev = _sysfs(tmp_path, {"vde": None})
    layout = _layout(tmp_path, block, dev)
    layout.store_file.write_text("an earlier boot's")
    said: list[str] = []
    assert not prepare_store(layout, said.append)
    assert said == [f"store: {layout.record_dir / 'record.db'} on the state disk (no config disk)"]
    assert not layout.store_file.exists()  # never an earlier boot's word


def test_a_bad_config_disk_stops_the_boot(tmp_path: Path) -> None:
    block, dev = _sysfs(tmp_path, {"vdf": SERIAL})
    (dev / "vdf").write_bytes(_doc(store=URL + "&passfile=/etc/shadow"))
    layout = _layout(tmp_path, block, dev)
    with pytest.raises(Refused, match=r"^config disk: .*vdf: store: the URL sets passfile"):
        prepare_store(layout, print)
    assert not layout.store_file.exists()


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_config_disk_command_as_the_deploy_guide_runs_it(tmp_path: Path) -> None:
    guide = (REPO / "docs" / "deploy.md").read_text()
    export = next(x for x in guide.splitlines() if x.startswith("export AFFIDAVIT_STORE_URL="))
    url = export.split("=", 1)[1].strip("'")
    assert "affidavit image config-disk config.img --store-ca db-ca.pem" in guide
    (tmp_path / "db-ca.pem").write_text(db_ca_pem(tmp_path))
    done = _cli(
        "image", "config-disk", "config.img", "--store-ca", "db-ca.pem",
        env={"AFFIDAVIT_STORE_URL": url}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    disk = tmp_path / "config.img"
    assert disk.stat().st_mode & 0o777 == 0o600  # it holds the password
    assert read_config(disk).store == url
    assert "serial affidavit-config" in done.stdout
    # what the guest would refuse is refused here, before a byte is written
    again = _cli(
        "image", "config-disk", "again.img", "--json", env={"AFFIDAVIT_STORE_URL": url},
        cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(again.stdout) == {
        "disk": "again.img", "bytes": 4096, "serial": "affidavit-config",
    }  # fmt: skip
    bad = _cli(
        "image", "config-disk", "bad.img", "--store", url + "&passfile=/etc/shadow",
        env={}, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "store: the URL sets passfile" in bad.stderr
    assert "PASSWORD" not in bad.stderr
    assert not (tmp_path / "bad.img").exists()
    # an existing file is made private before the password is in it; a folder is refused
    (tmp_path / "old.img").write_text("x")
    (tmp_path / "old.img").chmod(0o644)
    over = _cli("image", "config-disk", "old.img", env={"AFFIDAVIT_STORE_URL": url}, cwd=tmp_path)
    assert over.returncode == 0 and (tmp_path / "old.img").stat().st_mode & 0o777 == 0o600
    folder = _cli("image", "config-disk", ".", env={"AFFIDAVIT_STORE_URL": url}, cwd=tmp_path)
    assert folder.returncode == 2 and folder.stderr.startswith("affidavit: cannot write .: ")


def test_the_proxy_says_in_one_line_when_its_store_does_not_answer(tmp_path: Path) -> None:
    """A database down at boot: the proxy exits 3 naming the store (never its password), and
    the supervisor starts it again with backoff."""
    import socket

    from record.checkpoint import Signer
    from record.log import LOG_KEY_NAME
    from record.seal import KeyPair

    record = tmp_path / "record"
    record.mkdir()
    KeyPair.generate().write(record / "appliance.key")
    Signer.load_or_create(record / "record.db.signing-key", LOG_KEY_NAME)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    store_file = tmp_path / "store.conninfo"
    store_file.write_text(f"postgresql://affidavit:s3cret@127.0.0.1:{port}/records\n")
    done = subprocess.run(
        [sys.executable, "-m", "enclave_image.appliance_proxy", "--record", str(record),
         "--control", str(tmp_path / "control.sock"), "--port", "0",
         "--store-file", str(store_file)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith(
        f"proxy: cannot reach store postgresql://affidavit@127.0.0.1:{port}/records: "
    )
    assert "s3cret" not in done.stdout + done.stderr
    assert not (record / "record.db").exists()  # no quiet fallback to a file of its own
