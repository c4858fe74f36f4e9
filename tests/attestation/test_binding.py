"""The whole path an auditor walks, end to end: a published measurements file (signed by a
throwaway release key) → SEV-SNP evidence carrying that measurement and the binding →
``attest collect`` keeping it in a session's record through the proxy → an exported bundle
→ ``attest bind-check`` and ``attest verify --published``.

The evidence is a test double (named so): a synthetic version-5 report signed by a test
chain (``snp_double``), since no TEE exists here. Its measurement is one we computed with
``attestation.measure`` (sev-snp-measure) from the public OVMF vector and our own kernel,
initrd and command line; its ``report_data`` binds the real appliance's log key and sealing
key. ``bind-check`` is given a verifier that trusts the test chain's root; everything else
(the proxy, the control plane, the record, the bundle) is the real thing."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation.bind_check import check_bundle
from attestation.binding import binding_digest, report_data
from attestation.measure import launch_digest
from attestation.published import FORMAT, sign_published
from attestation.snp import verify_snp
from attestation.verdict import Verdict
from harness.state import Home
from record.bundle import export_stream
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.attestation.snp_double import TURIN_TCB, FakeAmd, fake_amd, v5_report

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
OVMF = VECTORS / "measurement" / "sev-snp-measure" / "ovmf_AmdSev_suffix.bin"
CHIP = bytes(range(0xA0, 0xA8)) + bytes(56)


@dataclass
class Appliance:
    home: Home
    session: str
    log_key: str
    sealing: bytes
    chain: FakeAmd


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """The real proxy and control plane (its record, its keys), with no engine needed."""
    from harness.session import open_session
    from harness.up import running_appliance

    home = Home(tmp_path_factory.mktemp("binding") / "home")
    provider = {"api": "openai", "base_url": "http://127.0.0.1:9"}  # never called here
    with running_appliance(home, provider=provider, model="none") as up:
        session = open_session(home, None).session_id
        store = SQLiteStore(up.appliance.store, readonly=True)
        try:
            log_key = store.get_meta("log_key")
        finally:
            store.close()
        assert log_key is not None
        sealing = KeyPair.read(home.root / "appliance.key").recipient.public.public_bytes_raw()
        chain = fake_amd("Turin", TURIN_TCB, CHIP[:8])
        yield Appliance(home, session, log_key, sealing, chain)


def _measured(tmp: Path) -> str:
    if not OVMF.is_file():
        reason = f"{OVMF} is absent: the public attestation vectors live in ../shared/vectors"
        print(reason)
        pytest.skip(reason)
    kernel, initrd = tmp / "vmlinuz", tmp / "initrd.img"
    kernel.write_bytes(b"our kernel\n" * 100)
    initrd.write_bytes(b"our initrd\n" * 100)
    return launch_digest(
        OVMF, vcpus=4, vcpu_type="EPYC-v4", kernel=kernel, initrd=initrd,
        append="console=ttyS0 affidavit.verity=00", guest_features=0x1,
    )  # fmt: skip


def _test_chain_verifier(chain: FakeAmd) -> Any:
    def verify(
        kind: str, report: bytes, *, certs: list[bytes], collateral: Any, now: datetime
    ) -> Verdict:
        assert kind == "snp" and collateral is None
        return verify_snp(report, chain.vek, chain.chain, now=now, trusted_roots=chain.roots)

    return verify


def test_published_evidence_binding_bundle_end_to_end(appliance: Appliance, tmp_path: Path) -> None:
    measurement = _measured(tmp_path)
    nonce = bytes(range(32))
    data = report_data(appliance.log_key, appliance.sealing, nonce)
    report = v5_report(
        appliance.chain.vek_key, measurement=bytes.fromhex(measurement), report_data=data,
        policy=0x30000,  # not a debug guest
    )  # fmt: skip
    evidence, certs = tmp_path / "report.bin", tmp_path / "certs.pem"
    evidence.write_bytes(report)
    certs.write_bytes(appliance.chain.chain)
    (tmp_path / "vek.der").write_bytes(appliance.chain.vek)
    home = str(appliance.home.root)

    # inside the appliance: what to ask the TEE for, then keep what it gave
    assert main(["attest", "collect", appliance.session, "--print-report-data",
                 "--nonce", nonce.hex(), "--home", home]) == 0  # fmt: skip
    args = ["attest", "collect", appliance.session, "--kind", "snp", "--evidence", str(evidence),
            "--certs", str(certs), "--home", home]  # fmt: skip
    assert main([*args, "--json"]) == 0

    # evidence that binds another key is refused before anything is kept
    stranger = v5_report(appliance.chain.vek_key, report_data=bytes(64), policy=0x30000)
    other = tmp_path / "other.bin"
    other.write_bytes(stranger)
    assert main(["attest", "collect", appliance.session, "--kind", "snp", "--evidence",
                 str(other), "--home", home]) == 1  # fmt: skip

    # the auditor's side: the bundle, the binding, the published file
    bundle = tmp_path / "bundle"
    export_stream(appliance.home.appliance().store, appliance.session, bundle)
    assert sorted(p.name for p in (bundle / "evidence").iterdir())[0].startswith("snp-")
    user = KeyPair.read(appliance.home.user_key_file)
    checks, verdicts = check_bundle(bundle, user, verify=_test_chain_verifier(appliance.chain))
    assert all(c.ok for c in checks), [c.line() for c in checks]
    assert [c.name.split(".")[0] for c in checks] == ["bundle", "evidence", "binding"]
    (verdict,) = verdicts
    # an auditor without a key: the same report, the same binding, from the clear entries
    keyless, _ = check_bundle(bundle, None, verify=_test_chain_verifier(appliance.chain))
    assert [(c.name.split(".")[0], c.ok) for c in keyless] == [
        ("bundle", True), ("evidence", None), ("evidence", True), ("binding", True),
    ], [c.line() for c in keyless]  # fmt: skip
    assert verdict.facts["measurement"] == measurement
    assert (
        verdict.facts["report_data"][:64]
        == binding_digest(appliance.log_key, appliance.sealing).hex()
    )

    key = Ed25519PrivateKey.generate()  # a throwaway release key
    published = tmp_path / "0.0.0-test.json"
    published.write_text(json.dumps({
        "format": FORMAT, "version": "0.0.0-test", "image_digest": "sha256:" + "a" * 64,
        "model_weights_digest": "sha256:" + "b" * 64, "kernel_cmdline": "console=ttyS0",
        "snp": [{"vcpus": 4, "vcpu_type": "EPYC-v4", "measurement": measurement}],
    }))  # fmt: skip
    published.with_name(published.name + ".sig").write_text(
        sign_published(published.read_bytes(), key)
    )
    release = tmp_path / "release.pub"
    release.write_text(base64.b64encode(key.public_key().public_bytes_raw()).decode())
    from attestation.policy import Policy, apply_policy
    from attestation.published import check_published, load_published

    promised = load_published(published, key.public_key())
    check_published(verdict, promised)
    apply_policy(verdict, Policy(nonce=nonce.hex()))
    assert verdict.accepted, [c.line() for c in verdict.checks]

    # the real AMD roots do not trust the test chain: the CLI, as an auditor runs it, says so
    assert main(["attest", "verify", "--kind", "snp", "--evidence", str(evidence),
                 "--certs", str(tmp_path / "vek.der"), "--certs", str(certs),
                 "--published", str(published), "--release-key", str(release),
                 "--now", datetime.now(UTC).isoformat()]) == 1  # fmt: skip


def test_bind_check_fails_on_a_bundle_signed_by_another_log_key(
    appliance: Appliance, tmp_path: Path
) -> None:
    data = report_data("affidavit-log+00000000+AAAA", appliance.sealing)  # not this log's key
    report = v5_report(appliance.chain.vek_key, report_data=data, policy=0x30000)
    # collect refuses it (the binding is checked first), so keep it the way a forger would:
    # through the control plane directly
    from egress_proxy.control import ControlClient

    with ControlClient(appliance.home.appliance().control_socket) as client:
        client.archive_evidence(appliance.session, "sev-snp", "snp-forged.report", report)
    bundle = tmp_path / "bundle"
    export_stream(appliance.home.appliance().store, appliance.session, bundle)
    user = KeyPair.read(appliance.home.user_key_file)
    checks, _ = check_bundle(bundle, user, verify=_test_chain_verifier(appliance.chain))
    failed = [c.name for c in checks if not c.ok]
    assert failed == ["binding.snp-forged.report"], [c.line() for c in checks]
    assert (
        main(["attest", "bind-check", str(bundle), "--key", str(appliance.home.user_key_file)]) == 1
    )
