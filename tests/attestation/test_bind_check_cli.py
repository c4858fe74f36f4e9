"""``affidavit attest bind-check`` as an auditor runs it, on real bundles written by the real
log, holding a real signed SEV-SNP report.

No SEV-SNP machine exists here, so the report is signed by the test double of AMD's chain
(``tests.attestation.snp_double``: ARK → ASK → VCEK, named so) and its ARK is handed to the
command with ``--trusted-root``, which the output must say. Everything else is real: the log,
its signed checkpoints, the exported bundle, the recipient key file, the verifier, the CLI.

Most cases run the command in this process (``affidavit.cli.main``, fast); one runs
``python -m affidavit`` as a subprocess, exactly as typed at a shell.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from affidavit.cli import main
from attestation.bind_check import check_bundle
from attestation.binding import report_data
from record.bundle import ENTRIES, EVIDENCE, INDEX, LOG_KEY, export_stream
from record.log import Log
from record.seal import KeyPair
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd, v5_report

ROOT = Path(__file__).resolve().parents[2]
TDX = ROOT.parent / "shared" / "vectors" / "attestation" / "intel-tdx"
STREAM = "session-attested"
STAMP = "20261201T120000Z"
REPORT = f"snp-{STAMP}.report"
CERTS = f"snp-{STAMP}.certs.pem"
NONCE = bytes(range(0xC0, 0xE0))


@dataclass(frozen=True)
class Bundle:
    """An exported bundle, the recipient key that opens it and the double's ARK as a PEM."""

    path: Path
    key: Path
    ark: Path
    log_key: str

    def args(self, *extra: str, trusted: bool = True) -> list[str]:
        root = ["--trusted-root", str(self.ark)] if trusted else []
        return ["attest", "bind-check", str(self.path), "--key", str(self.key), *root, *extra]

    def notice(self) -> str:
        return (
            f"NOT checked: SEV-SNP chains were held to --trusted-root {self.ark} in place of "
            "AMD's pinned roots"
        )


def _bundle(
    tmp_path: Path,
    *,
    wrong_byte: int | None = None,
    tdx: dict[str, bytes] | None = None,
    unsigned_from: int | None = None,
    evidence: bool = True,
    chain: bool = True,
) -> Bundle:
    """Record a stream whose archived SEV-SNP report binds its log key and the appliance's
    sealing key (``wrong_byte``: that byte of report_data flipped), export it, and write the
    user's key and the double's ARK beside it. ``tdx``: TDX evidence files archived after it
    (file suffix → bytes); ``unsigned_from``: the checkpoints covering that many entries or
    more are removed before the export; ``evidence`` False: the stream holds no evidence;
    ``chain`` False: the report is kept without its certificates, written to ``chain.pem``
    beside the bundle instead (``--certs``)."""
    user, appliance = KeyPair.generate(), KeyPair.generate()
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log_key = log.log_key()
        sealing = appliance.recipient.public.public_bytes_raw()
        data = bytearray(report_data(log_key, sealing, NONCE))
        if wrong_byte is not None:
            data[wrong_byte] ^= 0x01
        report = v5_report(amd.vek_key, report_data=bytes(data))
        vek = x509.load_der_x509_certificate(amd.vek).public_bytes(Encoding.PEM)
        if evidence:
            log.archive_evidence(STREAM, "sev-snp", REPORT, report)
            if chain:
                log.archive_evidence(STREAM, "sev-snp", CERTS, vek + amd.chain)
            else:
                (tmp_path / "chain.pem").write_bytes(vek + amd.chain)
        for suffix, blob in (tdx or {}).items():
            log.archive_evidence(STREAM, "tdx", f"tdx-{STAMP}{suffix}", blob)
    if unsigned_from is not None:
        _unsign_from(store, unsigned_from)
    bundle = tmp_path / "bundle"
    export_stream(store, STREAM, bundle)
    key = tmp_path / "user.key"
    user.write(key)
    ark = tmp_path / "ark.pem"
    ark.write_bytes(x509.load_pem_x509_certificates(amd.chain)[1].public_bytes(Encoding.PEM))
    return Bundle(bundle, key, ark, log_key)


def _unsign_from(store: Path, size: int) -> None:
    """Drop the checkpoints that cover ``size`` entries or more (a forged, unsigned tail)."""
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER checkpoints_no_delete")
        conn.execute("DELETE FROM checkpoints WHERE size >= ?", (size,))
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.fixture
def bound(tmp_path: Path) -> Bundle:
    return _bundle(tmp_path)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _json(out: str) -> dict[str, object]:
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2) + "\n"  # one object, printed as the docs show
    assert isinstance(doc, dict) and set(doc) == {"verdict", "checks"}
    return doc


def _by_name(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    checks = doc["checks"]
    assert isinstance(checks, list)
    return {c["name"]: c for c in checks}


def test_json_accepts_a_report_that_binds_the_log_key_and_says_whose_roots(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(bound.args("--json"), capsys)
    assert (code, err) == (0, "")
    doc = _json(out)
    assert doc["verdict"] == "accept"
    checks = _by_name(doc)
    assert list(checks) == ["trust.amd_roots", "bundle", f"evidence.{REPORT}", f"binding.{REPORT}"]
    assert checks["trust.amd_roots"] == {
        "name": "trust.amd_roots",
        "ok": None,
        "detail": bound.notice(),
    }
    assert checks["bundle"]["ok"] is True
    assert str(checks["bundle"]["detail"]).endswith(
        f"entries and the checkpoints verify under {bound.log_key}"
    )
    assert checks[f"evidence.{REPORT}"]["ok"] is True
    assert checks[f"binding.{REPORT}"]["ok"] is True


def test_text_prints_each_check_then_verdict_accept(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(bound.args(), capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 5
    assert lines[0] == f"skip trust.amd_roots: {bound.notice()}"
    assert lines[1].startswith("ok   bundle: ")
    assert lines[2].startswith(f"ok   evidence.{REPORT}: verified at its collection time ")
    assert lines[3].startswith(f"ok   binding.{REPORT}: report_data binds the log key and ")
    assert lines[4] == "verdict: accept"


def test_the_command_runs_as_typed_at_a_shell(bound: Bundle) -> None:
    """``python -m affidavit attest bind-check …``: the real entry point, exit code and all."""
    run = subprocess.run(
        [sys.executable, "-m", "affidavit", *bound.args("--json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["verdict"] == "accept"
    gone = bound.path.with_name("no-such-bundle")
    missing = subprocess.run(
        [sys.executable, "-m", "affidavit", "attest", "bind-check", str(gone), "--key",
         str(bound.key)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert (missing.returncode, missing.stdout) == (3, "")
    assert missing.stderr == f"affidavit: missing: {gone} does not exist\n"


@pytest.mark.parametrize("position", [0, 31])
def test_one_wrong_byte_of_report_data_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], position: int
) -> None:
    bundle = _bundle(tmp_path, wrong_byte=position)
    code, out, err = _run(bundle.args("--json"), capsys)
    assert (code, err) == (1, "")
    doc = _json(out)
    assert doc["verdict"] == "reject"
    checks = _by_name(doc)
    assert checks[f"evidence.{REPORT}"]["ok"] is True  # the report is genuine...
    assert checks[f"binding.{REPORT}"] == {  # ...but vouches for another record
        "name": f"binding.{REPORT}",
        "ok": False,
        "detail": "report_data binds neither this log key nor any recipient of the stream",
    }
    code, out, _ = _run(bundle.args(), capsys)
    assert code == 1
    assert out.splitlines()[-1] == "verdict: REJECT"
    assert f"FAIL binding.{REPORT}: report_data binds neither" in out


def test_without_trusted_root_the_double_chain_is_not_amds(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--trusted-root``: AMD's pinned roots judge the chain, no notice is printed, and a
    chain that is not AMD's rejects."""
    code, out, err = _run(bound.args("--json", trusted=False), capsys)
    assert (code, err) == (1, "")
    doc = _json(out)
    assert doc["verdict"] == "reject"
    checks = _by_name(doc)
    assert list(checks) == ["bundle", f"evidence.{REPORT}", f"binding.{REPORT}"]
    assert checks["bundle"]["ok"] is True
    assert checks[f"evidence.{REPORT}"]["ok"] is False
    code, out, _ = _run(bound.args(trusted=False), capsys)
    assert code == 1
    assert out.splitlines()[0].startswith("ok   bundle: ")
    assert out.splitlines()[-1] == "verdict: REJECT"


def test_trusted_root_leaves_other_kinds_to_their_own_verifier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TDX quote in the same bundle is judged by the TDX verifier, not held to the ARK."""
    bundle = _bundle(tmp_path, tdx={".report": b"not a TDX quote"})
    code, out, _ = _run(bundle.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks[f"binding.{REPORT}"]["ok"] is True
    tdx = checks[f"evidence.tdx-{STAMP}.report"]
    assert tdx["ok"] is False
    assert tdx["detail"] == (
        "FAIL evidence: header.version: 28526 is not a TDX quote version (4 or 5; 3 is an SGX "
        "quote)"
    )
    _, verdicts = check_bundle(bundle.path, KeyPair.read(bundle.key))
    assert [v.kind for v in verdicts] == ["snp", "tdx"]  # the quote that did not parse: tdx's


def test_a_tdx_quote_is_judged_with_its_archived_collateral(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Intel's public quote and collateral (the vectors), archived beside the SEV-SNP report:
    the collateral is read from the bundle and judged at the collection time. Its TCB info,
    QE identity and CRLs were current in 2025 (the root CA's CRL until 2026-04-03), so at any
    collection time since, four collateral checks fail; the first three are shown."""
    if not TDX.is_dir():
        reason = f"{TDX} is absent: the public attestation vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    tdx = {
        ".report": (TDX / "dcap-qvl" / "tdx_quote").read_bytes(),
        ".collateral.json": (TDX / "dcap-qvl" / "tdx_quote_collateral.json").read_bytes(),
    }
    bundle = _bundle(tmp_path, tdx=tdx)
    code, out, _ = _run(bundle.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks[f"evidence.{REPORT}"]["ok"] is True  # the ARK still judges the SEV-SNP chain
    detail = str(checks[f"evidence.tdx-{STAMP}.report"]["detail"])
    shown = detail.split("; ")
    assert [part.split(":")[0] for part in shown] == [
        "FAIL collateral.tcb_info_validity",
        "FAIL collateral.qe_identity_validity",
        "FAIL collateral.root_ca_crl",
    ]
    assert shown[0].startswith(
        "FAIL collateral.tcb_info_validity: tcbInfo issued 2025-06-19T10:16:03Z, next update "
        "2025-07-19T10:16:03Z: expired or not yet issued at "
    )
    assert checks[f"binding.tdx-{STAMP}.report"]["ok"] is False  # not this record's quote


def test_a_stream_without_evidence_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle(tmp_path, evidence=False)
    code, out, _ = _run(bundle.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert list(checks) == ["trust.amd_roots", "bundle", "evidence"]
    assert checks["bundle"]["ok"] is True
    assert checks["evidence"] == {
        "name": "evidence",
        "ok": False,
        "detail": "the bundle holds no archived report",
    }


def test_reports_in_an_unsigned_tail_are_each_not_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every report after the last signed checkpoint is named, not only the first."""
    bundle = _bundle(tmp_path, tdx={".report": b"not a TDX quote"}, unsigned_from=2)
    code, out, _ = _run(bundle.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks["bundle"]["ok"] is False
    for seq, name in ((1, REPORT), (3, f"tdx-{STAMP}.report")):
        check = checks[f"evidence.{name}"]
        assert check["ok"] is False
        assert re.fullmatch(
            rf"not judged: its entry \(seq {seq}\) is covered by no signed checkpoint \(they "
            r"cover 1 entries\), so its time \S+Z is not the log's word",
            str(check["detail"]),
        ), check["detail"]
        assert f"binding.{name}" not in checks


def test_a_bundle_naming_another_stream_fails_and_judges_nothing(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bundle.json`` names a stream its entries are not: each entry is a problem (the
    first three shown), and no checkpoint of the entries' stream vouches for the report."""
    index = bound.path / INDEX
    doc = json.loads(index.read_text())
    doc["stream"] = "another"
    index.write_text(json.dumps(doc))
    code, out, _ = _run(bound.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks["bundle"] == {
        "name": "bundle",
        "ok": False,
        "detail": "; ".join(
            f"stream_mismatch: {ENTRIES} line {n}: entry names {STREAM!r}" for n in (1, 2, 3)
        ),
    }
    assert str(checks[f"evidence.{REPORT}"]["detail"]).startswith(
        "not judged: its entry (seq 1) is covered by no signed checkpoint (they cover 0 entries)"
    )


def test_evidence_changed_after_it_was_recorded_fails_the_bundle(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte added to the certificates file: they still verify, but they are not what the
    log recorded (its digest is in a sealed entry, opened with the key)."""
    certs = bound.path / EVIDENCE / CERTS
    certs.write_bytes(certs.read_bytes() + b"\n")
    code, out, _ = _run(bound.args("--json"), capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks["bundle"] == {
        "name": "bundle",
        "ok": False,
        "detail": f"evidence_digest_mismatch: {EVIDENCE}/{CERTS} does not match its evidence_digest",
    }
    assert checks[f"evidence.{REPORT}"]["ok"] is True


@pytest.mark.parametrize("which", ["bundle", "key", "trusted_root"])
def test_a_missing_input_exits_3_and_names_it(
    bound: Bundle, capsys: pytest.CaptureFixture[str], tmp_path: Path, which: str
) -> None:
    gone = tmp_path / "gone"
    paths = {"bundle": bound.path, "key": bound.key, "trusted_root": bound.ark}
    paths[which] = gone
    args = [
        "attest", "bind-check", str(paths["bundle"]), "--key", str(paths["key"]),
        "--trusted-root", str(paths["trusted_root"]), "--json",
    ]  # fmt: skip
    code, out, err = _run(args, capsys)
    assert (code, out) == (3, "")
    assert err == f"affidavit: missing: {gone} does not exist\n"


def test_a_bundle_that_is_a_file_or_a_key_that_is_a_folder_is_missing(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    as_bundle = ["attest", "bind-check", str(bound.key), "--key", str(bound.key)]
    assert _run(as_bundle, capsys) == (3, "", f"affidavit: missing: {bound.key} does not exist\n")
    as_key = ["attest", "bind-check", str(bound.path), "--key", str(bound.path)]
    assert _run(as_key, capsys) == (3, "", f"affidavit: missing: {bound.path} does not exist\n")
    folder = [*bound.args()[:-1], str(bound.path)]  # --trusted-root the bundle folder
    assert _run(folder, capsys) == (3, "", f"affidavit: missing: {bound.path} does not exist\n")


def test_a_trusted_root_that_is_not_an_ark_is_a_usage_error(
    bound: Bundle, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    not_pem = tmp_path / "roots.txt"
    not_pem.write_text("these are not certificates\n")
    code, out, err = _run([*bound.args()[:-1], str(not_pem)], capsys)
    assert (code, out) == (2, "")
    assert "Invalid value for --trusted-root:" in err
    # a certificate that is no root: the ARK file's check names what was wrong
    vek = tmp_path / "vek.pem"
    chain = (bound.path / "evidence" / CERTS).read_bytes()
    vek.write_bytes(x509.load_pem_x509_certificates(chain)[0].public_bytes(Encoding.PEM))
    code, out, err = _run([*bound.args()[:-1], str(vek)], capsys)
    assert (code, out) == (2, "")
    assert f"Invalid value for --trusted-root: {vek}: SEV-VCEK is not a root" in " ".join(
        err.replace("│", " ").split()
    )


def test_a_bundle_without_its_log_key_rejects_naming_the_error(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    (bound.path / LOG_KEY).unlink()
    code, out, err = _run(bound.args("--json"), capsys)
    assert (code, err) == (1, "")
    doc = _json(out)
    assert doc["verdict"] == "reject"
    assert _by_name(doc)["bundle"] == {
        "name": "bundle",
        "ok": False,
        "detail": f"FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{bound.path / LOG_KEY}'",
    }
    code, out, _ = _run(bound.args(), capsys)
    assert code == 1
    assert out.splitlines() == [
        f"skip trust.amd_roots: {bound.notice()}",
        f"FAIL bundle: FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{bound.path / LOG_KEY}'",
        "verdict: REJECT",
    ]


def test_a_damaged_entry_fails_the_bundle_check(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = bound.path / ENTRIES
    lines = entries.read_bytes().splitlines(keepends=True)
    entries.write_bytes(b"".join(lines[:-1]))  # the last entry cut off: a checkpoint dangles
    code, out, _ = _run(bound.args("--json"), capsys)
    assert code == 1
    doc = _json(out)
    assert doc["verdict"] == "reject"
    assert _by_name(doc)["bundle"]["ok"] is False


def test_a_key_file_that_is_no_key_rejects(
    bound: Bundle, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junk = tmp_path / "junk.key"
    shutil.copy(bound.ark, junk)
    junk.chmod(0o600)
    code, out, _ = _run([*bound.args("--json")[:4], str(junk), "--json"], capsys)
    assert code == 1
    bundle = _by_name(_json(out))["bundle"]
    assert bundle["ok"] is False
    assert str(bundle["detail"]).startswith("ValueError: ")


def test_certs_gives_the_chain_for_a_report_kept_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = _bundle(tmp_path, chain=False)
    code, out, _ = _run(bare.args("--json"), capsys)
    assert code == 1  # no chain: the report cannot be judged
    checks = _by_name(_json(out))
    assert checks[f"evidence.{REPORT}"]["ok"] is False

    code, out, err = _run(bare.args("--json", "--certs", str(tmp_path / "chain.pem")), capsys)

    assert (code, err) == (0, "")
    checks = _by_name(_json(out))
    assert checks[f"evidence.{REPORT}"]["ok"] is True
    assert str(checks[f"evidence.{REPORT}"]["detail"]).endswith(" with the certificates of --certs")
    assert checks[f"binding.{REPORT}"]["ok"] is True


def test_a_chain_the_record_kept_is_the_one_judged(
    bound: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--certs cannot replace what the record kept: a stranger's chain changes nothing."""
    stranger = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    other = tmp_path / "other.pem"
    other.write_bytes(
        x509.load_der_x509_certificate(stranger.vek).public_bytes(Encoding.PEM) + stranger.chain
    )
    code, out, _ = _run(bound.args("--json", "--certs", str(other)), capsys)
    assert code == 0
    detail = str(_by_name(_json(out))[f"evidence.{REPORT}"]["detail"])
    assert detail.startswith("verified at its collection time ") and "--certs" not in detail


def test_certs_missing_or_not_certificates(
    bound: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.pem"
    code, _, err = _run(bound.args("--certs", str(missing)), capsys)
    assert code == 3 and f"missing: {missing} does not exist" in err
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"not a certificate")
    code, _, err = _run(bound.args("--certs", str(junk)), capsys)
    assert code == 2 and str(junk) in err and "--certs" in err


def test_without_a_key_the_sessions_own_evidence_is_judged_and_the_mode_said(
    bound: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--key``: the binding is checked from the clear entries, the report at the time of
    the stream's first signed evidence.archived entry (seq 1, the report's own here)."""
    args = [a for a in bound.args("--json") if a not in ("--key", str(bound.key))]
    code, out, err = _run(args, capsys)
    assert (code, err) == (0, "")
    checks = _by_name(_json(out))
    assert list(checks) == [
        "trust.amd_roots", "bundle", "evidence.link", f"evidence.{REPORT}", f"binding.{REPORT}",
    ]  # fmt: skip
    assert checks["evidence.link"]["ok"] is None
    assert str(checks[f"evidence.{REPORT}"]["detail"]).endswith(
        f"the time of stream {STREAM}'s first signed evidence.archived entry (seq 1): no key "
        "links the file to its own entry"
    )


@pytest.mark.parametrize("position", [0, 31])
def test_without_a_key_one_wrong_byte_of_report_data_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], position: int
) -> None:
    bundle = _bundle(tmp_path, wrong_byte=position)
    args = [a for a in bundle.args("--json") if a not in ("--key", str(bundle.key))]
    code, out, _ = _run(args, capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks[f"evidence.{REPORT}"]["ok"] is True
    assert checks[f"binding.{REPORT}"]["ok"] is False


def test_without_a_key_evidence_no_signed_entry_covers_is_not_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle(tmp_path, unsigned_from=2)  # the evidence entries: an unsigned tail
    args = [a for a in bundle.args("--json") if a not in ("--key", str(bundle.key))]
    code, out, _ = _run(args, capsys)
    assert code == 1
    checks = _by_name(_json(out))
    assert checks[f"evidence.{REPORT}"] == {
        "name": f"evidence.{REPORT}",
        "ok": False,
        "detail": f"not judged: no evidence.archived entry of stream {STREAM} is covered by a "
        "signed checkpoint, so no collection time is the log's word",
    }
    assert f"binding.{REPORT}" not in checks
