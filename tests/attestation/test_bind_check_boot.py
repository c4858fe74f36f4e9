"""The appliance's boot evidence in every session's bundle, and ``bind-check`` without a key.

The appliance keeps its boot report and the host's certificates in a stream of its own,
labelled ``affidavit/boot-evidence`` and sealed to the appliance's key, through the proxy's
control plane (``enclave_image.appliance.keep_evidence`` does exactly these two calls). A
user's session bundle then carries that stream as ``boot/<stream>/`` (docs/record.md §11), so
an auditor holding only the bundle, and no recipient key, checks that the attested appliance
wrote it.

No SEV-SNP machine exists here, so the report is signed by the test double of AMD's chain
(``tests.attestation.snp_double``, named so) and its ARK is given with ``--trusted-root``.
The proxy, its control plane, the record, the bundle, the verifier and the CLI are real.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from affidavit.cli import main
from attestation.binding import report_data
from record.bundle import BOOT, BOOT_LABEL, EVIDENCE, INDEX, export_stream, verify_bundle
from record.log import Log
from record.seal import KeyPair
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report
from tests.record import independent_reader

STAMP = "20261201T120000Z"
REPORT = f"snp-{STAMP}.report"
CERTS = f"snp-{STAMP}.certs.pem"


@dataclass(frozen=True)
class Appliance:
    store: Path
    session: str
    boot: str  # the boot-evidence stream
    user_key: Path
    ark: Path
    log_key: str
    chain: FakeAmd


def _pems(amd: FakeAmd) -> tuple[bytes, bytes]:
    """The VCEK and its chain as the host's table gives them (PEM), and the ARK alone."""
    vek = x509.load_der_x509_certificate(amd.vek).public_bytes(Encoding.PEM)
    ark = x509.load_pem_x509_certificates(amd.chain)[1].public_bytes(Encoding.PEM)
    return vek + amd.chain, ark


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """The real proxy and control plane; the boot evidence kept as the appliance keeps it,
    then a user's session opened."""
    from egress_proxy.control import ControlClient
    from harness.session import open_session
    from harness.state import Home
    from harness.up import running_appliance
    from record.sqlite_store import SQLiteStore

    root = tmp_path_factory.mktemp("boot")
    home = Home(root / "home")
    provider = {"api": "openai", "base_url": "http://127.0.0.1:9"}  # never called here
    with running_appliance(home, provider=provider, model="none") as up:
        store = SQLiteStore(up.appliance.store, readonly=True)
        try:
            log_key = store.get_meta("log_key")
        finally:
            store.close()
        assert log_key is not None
        sealing = KeyPair.read(home.root / "appliance.key").recipient.public.public_bytes_raw()
        amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
        chain, ark = _pems(amd)
        report = v5_report(amd.vek_key, report_data=report_data(log_key, sealing), policy=0x30000)
        with ControlClient(home.appliance().control_socket) as client:
            opened = client.open_session([], {BOOT_LABEL: STAMP})
            client.archive_evidence(opened.session_id, "sev-snp", REPORT, report)
            client.archive_evidence(opened.session_id, "sev-snp", CERTS, chain)
        session = open_session(home, None).session_id
        (root / "ark.pem").write_bytes(ark)
        yield Appliance(
            up.appliance.store, session, opened.session_id, home.user_key_file,
            root / "ark.pem", log_key, amd,
        )  # fmt: skip


def _export(appliance: Appliance, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    export_stream(appliance.store, appliance.session, out)
    return out


def _bind_check(
    appliance: Appliance, bundle: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, dict[str, object]]]:
    args = ["attest", "bind-check", str(bundle), "--trusted-root", str(appliance.ark), "--json"]
    code = main([*args, *extra])
    out, err = capsys.readouterr()
    assert err == ""
    doc = json.loads(out)
    assert doc["verdict"] == ("accept" if code == 0 else "reject")
    return code, {c["name"]: c for c in doc["checks"]}


def test_the_session_bundle_carries_the_boot_stream(appliance: Appliance, tmp_path: Path) -> None:
    bundle = _export(appliance, tmp_path)
    index = json.loads((bundle / INDEX).read_text())
    assert index["boot"] == [appliance.boot]
    nested = bundle / BOOT / appliance.boot
    assert sorted(p.name for p in (nested / EVIDENCE).iterdir()) == [CERTS, REPORT]
    inner = json.loads((nested / INDEX).read_text())
    assert (inner["stream"], inner.get("boot"), inner["evidence"]) == (
        appliance.boot,
        None,
        [CERTS, REPORT],
    )
    assert (nested / "log_key.pub").read_text() == appliance.log_key + "\n"
    report = verify_bundle(bundle)
    assert report.ok, report.problems
    assert set(report.streams) == {appliance.session, appliance.boot}
    # the independent reader, written from docs/record.md alone, agrees
    assert independent_reader.verify_bundle(bundle).ok
    # the boot stream's own export holds no boot bundle: a boot bundle is never nested
    alone = tmp_path / "boot-alone"
    assert "boot" not in export_stream(appliance.store, appliance.boot, alone)
    assert not (alone / BOOT).exists()


def test_bind_check_without_a_key_accepts_the_session_bundle(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _export(appliance, tmp_path)
    code, checks = _bind_check(appliance, bundle, capsys)
    name = f"{BOOT}/{appliance.boot}/{REPORT}"
    assert code == 0, checks
    assert list(checks) == [
        "trust.amd_roots", "bundle", "evidence.link", f"evidence.{name}", f"binding.{name}",
    ]  # fmt: skip
    assert str(checks["bundle"]["detail"]).endswith(
        f"verify under {appliance.log_key}, and the 1 boot bundle under the same key"
    )
    link = checks["evidence.link"]
    assert link["ok"] is None
    assert str(link["detail"]).startswith("no key: evidence.archived bodies are sealed")
    detail = str(checks[f"evidence.{name}"]["detail"])
    assert detail.startswith("verified at ") and detail.endswith(
        f"the time of stream {appliance.boot}'s first signed evidence.archived entry (seq 1): "
        "no key links the file to its own entry"
    )
    assert str(checks[f"binding.{name}"]["detail"]).startswith(
        "report_data binds the log key and sealing key "
    )
    # text output: the mode is said on its own line
    assert main(["attest", "bind-check", str(bundle), "--trusted-root", str(appliance.ark)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("skip evidence.link: no key: ")
    assert lines[-1] == "verdict: accept"


def test_bind_check_with_the_users_key_accepts_and_says_the_boot_stream_is_not_its(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _export(appliance, tmp_path)
    code, checks = _bind_check(appliance, bundle, capsys, "--key", str(appliance.user_key))
    assert code == 0, checks
    assert str(checks["evidence.link"]["detail"]).startswith(
        "boot evidence is sealed to the appliance's key, not this one"
    )
    assert checks[f"binding.{BOOT}/{appliance.boot}/{REPORT}"]["ok"] is True


def test_a_changed_boot_report_rejects_by_its_signature(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a key no digest vouches for the file; the report vouches for itself."""
    bundle = _export(appliance, tmp_path)
    path = bundle / BOOT / appliance.boot / EVIDENCE / REPORT
    data = bytearray(path.read_bytes())
    data[0x90] ^= 0x01  # a byte of the measurement
    path.write_bytes(bytes(data))
    code, checks = _bind_check(appliance, bundle, capsys)
    assert code == 1
    check = checks[f"evidence.{BOOT}/{appliance.boot}/{REPORT}"]
    assert check["ok"] is False and "FAIL report_signature" in str(check["detail"]), check


def test_a_removed_boot_evidence_file_rejects_naming_it(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _export(appliance, tmp_path)
    (bundle / BOOT / appliance.boot / EVIDENCE / CERTS).unlink()
    code, checks = _bind_check(appliance, bundle, capsys)
    assert code == 1
    assert checks["bundle"] == {
        "name": "bundle",
        "ok": False,
        "detail": f"evidence_missing: {BOOT}/{appliance.boot}: {INDEX} lists {EVIDENCE}/{CERTS}; "
        "it is missing",
    }
    # with no chain kept, the report cannot be judged either
    assert checks[f"evidence.{BOOT}/{appliance.boot}/{REPORT}"]["ok"] is False


def test_a_removed_boot_bundle_rejects(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _export(appliance, tmp_path)
    shutil.rmtree(bundle / BOOT / appliance.boot)
    code, checks = _bind_check(appliance, bundle, capsys)
    assert code == 1
    assert checks["bundle"]["detail"] == (
        f"evidence_missing: {INDEX} lists {BOOT}/{appliance.boot}/; it is missing"
    )
    assert checks["evidence"]["detail"] == "the bundle holds no archived report"


def test_a_boot_bundle_signed_by_another_log_key_rejects(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same stream name and the same genuine report, but kept by another log: its
    checkpoints do not verify under the session's log key."""
    bundle = _export(appliance, tmp_path)
    nested = bundle / BOOT / appliance.boot
    other_store = tmp_path / "other.db"
    with Log.open(other_store) as log:
        log.open_stream(appliance.boot, [KeyPair.generate().recipient], {BOOT_LABEL: STAMP})
        for name in (REPORT, CERTS):
            log.archive_evidence(
                appliance.boot, "sev-snp", name, (nested / EVIDENCE / name).read_bytes()
            )
    shutil.rmtree(nested)
    export_stream(other_store, appliance.boot, nested)
    code, checks = _bind_check(appliance, bundle, capsys)
    assert code == 1
    assert checks["bundle"]["ok"] is False
    problems = verify_bundle(bundle).problems
    codes = {(p.code, p.stream) for p in problems}
    assert ("checkpoint_invalid", appliance.boot) in codes
    assert any(
        p.detail.startswith(f"{BOOT}/{appliance.boot}: log_key.pub names ") for p in problems
    )
    # the independent reader names it the same way
    assert "checkpoint_invalid" in independent_reader.verify_bundle(bundle).codes()


def test_an_unlisted_boot_folder_rejects_and_an_older_bundle_stays_valid(
    appliance: Appliance, tmp_path: Path
) -> None:
    bundle = _export(appliance, tmp_path)
    index = json.loads((bundle / INDEX).read_text())
    del index["boot"]
    (bundle / INDEX).write_text(json.dumps(index))
    report = verify_bundle(bundle)
    assert [(p.code, p.detail) for p in report.problems] == [
        ("evidence_unlisted", f"{BOOT}/{appliance.boot} is not listed in {INDEX}")
    ]
    assert independent_reader.verify_bundle(bundle).codes() == {"evidence_unlisted"}
    shutil.rmtree(bundle / BOOT)  # a bundle written before boot bundles existed
    assert verify_bundle(bundle).ok
    assert independent_reader.verify_bundle(bundle).ok


def test_a_boot_report_binding_another_log_key_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An appliance-like store written by the log directly: the boot report binds a log key
    that is not the one that signed the session's checkpoints."""
    user, appliance_key = KeyPair.generate(), KeyPair.generate()
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    chain, ark = _pems(amd)
    store = tmp_path / "record.db"
    sealing = appliance_key.recipient.public.public_bytes_raw()
    with Log.open(store, appliance_key=appliance_key) as log:
        log.open_stream("boot-1", [appliance_key.recipient], {BOOT_LABEL: STAMP})
        data = report_data("affidavit-log+00000000+AAAA", sealing)  # not this log's key
        report = v5_report(amd.vek_key, report_data=data, policy=0x30000)
        log.archive_evidence("boot-1", "sev-snp", REPORT, report)
        log.archive_evidence("boot-1", "sev-snp", CERTS, chain)
        log.open_stream("session-1", [user.recipient, appliance_key.recipient])
    bundle = tmp_path / "bundle"
    export_stream(store, "session-1", bundle)
    (tmp_path / "ark.pem").write_bytes(ark)
    args = ["attest", "bind-check", str(bundle), "--trusted-root", str(tmp_path / "ark.pem")]
    assert main([*args, "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["bundle"]["ok"] is True
    assert checks[f"evidence.{BOOT}/boot-1/{REPORT}"]["ok"] is True  # genuine...
    assert checks[f"binding.{BOOT}/boot-1/{REPORT}"] == {  # ...but for another log
        "name": f"binding.{BOOT}/boot-1/{REPORT}",
        "ok": False,
        "detail": "report_data binds neither this log key nor any recipient of the stream",
    }


def test_log_export_says_which_boot_bundles_it_wrote(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "exported"
    args = ["log", "export", appliance.session, "--store", str(appliance.store), "--out", str(out)]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert said.rstrip().endswith(f"to {out}, with 1 boot bundle: {appliance.boot}")
    assert (out / BOOT / appliance.boot / INDEX).is_file()
