"""``affidavit attest verify`` end to end on real NVIDIA evidence, with a policy file and a
signed published-measurements file; and the policy and published modules' rules alone."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation.binding import binding_digest, report_data
from attestation.policy import Policy, PolicyError, apply_policy, load_policy
from attestation.published import (
    FORMAT,
    PublishedError,
    SignatureMismatch,
    check_published,
    load_published,
    sign_published,
)
from attestation.verdict import Verdict

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
NV = VECTORS / "nvidia-h100" / "nvtrust"
NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
NOW = "2025-01-01T00:00:00Z"


@pytest.fixture
def nv() -> Path:
    if not NV.is_dir():
        reason = f"{NV} is absent: the public attestation vectors live in ../shared/vectors"
        print(reason)
        pytest.skip(reason)
    return NV


def _published(tmp: Path, **gpu: list[str]) -> tuple[Path, Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()  # a throwaway release key: the real one is not here
    doc = {
        "format": FORMAT,
        "version": "0.0.0-test",
        "image_digest": "sha256:" + "0" * 64,
        "model_weights_digest": "sha256:" + "1" * 64,
        "kernel_cmdline": "console=ttyS0",
        "gpu": gpu,
    }
    path = tmp / "0.0.0-test.json"
    path.write_text(json.dumps(doc))
    path.with_name(path.name + ".sig").write_text(sign_published(path.read_bytes(), key))
    pub = tmp / "release.pub"
    pub.write_text(base64.b64encode(key.public_key().public_bytes_raw()).decode())
    return path, pub, key


def _verify(nv: Path, *extra: str) -> list[str]:
    return [
        "attest", "verify", "--kind", "nvidia",
        "--evidence", str(nv / "hopperAttestationReport.hex"),
        "--certs", str(nv / "hopperCertChain.pem"), "--now", NOW, *extra,
    ]  # fmt: skip


def test_verify_prints_each_check_and_accepts_genuine_gpu_evidence(
    nv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_verify(nv, "--nonce", NONCE)) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("ok   report_signature") for line in out)
    assert any(line.startswith("ok   nonce") for line in out)
    assert any(line.startswith("skip rim.driver") for line in out)  # offline: said, not passed
    assert out[-1].startswith("verdict: accept") and "not checked" in out[-1]
    assert main(_verify(nv, "--nonce", NONCE, "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "accept" and doc["kind"] == "nvidia"
    assert {"name", "ok", "detail"} <= set(doc["checks"][0])
    assert doc["facts"]["driver_version"] == "550.90.07"


def test_verify_rejects_a_wrong_nonce_and_usage_and_missing_inputs(
    nv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_verify(nv, "--nonce", "00" * 32)) == 1
    assert "FAIL nonce" in capsys.readouterr().out
    assert main(_verify(nv, "--nonce", "zz")) == 2
    assert main([*_verify(nv)[:4], "--evidence", str(tmp_path / "nope.hex")]) == 3
    assert main(_verify(nv, "--now", "2025-01-01T00:00:00")) == 2  # no offset: ambiguous
    assert "no UTC offset" in capsys.readouterr().err
    assert main(_verify(nv, "--now", "yesterday")) == 2
    bad = tmp_path / "policy.json"
    bad.write_text('{"allow_debug": true, "colour": "red"}')
    assert main(_verify(nv, "--policy", str(bad))) == 2
    assert "colour" in capsys.readouterr().err


def test_verify_against_a_signed_published_file(
    nv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, pub, _ = _published(tmp_path, driver_versions=["550.90.07"])
    fresh = ("--nonce", NONCE)  # without one, the default policy refuses GPU evidence
    assert main(_verify(nv, *fresh, "--published", str(path), "--release-key", str(pub))) == 0
    out = capsys.readouterr().out
    assert "ok   published.signature" in out and "ok   published.nvidia" in out
    (tmp_path / "other").mkdir()
    other, other_pub, _ = _published(tmp_path / "other", driver_versions=["999.0"])
    assert main(_verify(nv, "--published", str(other), "--release-key", str(other_pub))) == 1
    assert "FAIL published.nvidia" in capsys.readouterr().out
    path.write_text(path.read_text().replace("550.90.07", "550.90.08"))  # after signing
    assert main(_verify(nv, "--published", str(path), "--release-key", str(pub))) == 1
    assert "FAIL published.signature" in capsys.readouterr().out


def test_load_published_believes_nothing_unsigned(tmp_path: Path) -> None:
    path, _, key = _published(tmp_path, driver_versions=["1"])
    assert load_published(path, key.public_key()).version == "0.0.0-test"
    with pytest.raises(SignatureMismatch):
        load_published(path, Ed25519PrivateKey.generate().public_key())
    path.write_text(json.dumps({"format": FORMAT}))
    path.with_name(path.name + ".sig").write_text(sign_published(path.read_bytes(), key))
    with pytest.raises(PublishedError, match="version"):
        load_published(path, key.public_key())


def test_policy_rules_each_add_a_named_check(tmp_path: Path) -> None:
    snp = Verdict("snp", facts={
        "debug": True, "vmpl": 1, "measurement": "ab" * 48,
        "report_data": "cd" * 32 + "00" * 32, "reported_tcb": {"bl": 2, "snp": 5},
    })  # fmt: skip
    snp.add("report_signature", True, "genuine")
    apply_policy(snp, Policy(allowed_vmpl=(0,), min_tcb={"snp": 8}, measurements=("ef" * 48,)))
    failed = {c.name for c in snp.failed}
    assert failed == {"policy.debug", "policy.vmpl", "policy.min_tcb", "policy.measurement"}
    assert not snp.accepted
    tdx = Verdict(
        "tdx", facts={"debug": False, "tcb_status": "OutOfDate", "advisory_ids": ["INTEL-SA-1"]}
    )
    tdx.add("quote_signature", True, "genuine")
    apply_policy(tdx, Policy())
    assert [c.name for c in tdx.failed] == ["policy.tcb_status"]
    assert "INTEL-SA-1" in tdx.failed[0].detail
    apply_policy(tdx, Policy(tcb_status=("UpToDate", "OutOfDate")))
    assert tdx.checks[-1].ok
    nonce = bytes(range(32))
    bound = Verdict("snp", facts={"report_data": report_data("log+key", b"\1" * 32, nonce).hex()})
    bound.add("report_signature", True, "genuine")
    apply_policy(
        bound, Policy(nonce=nonce.hex(), report_data=binding_digest("log+key", b"\1" * 32).hex())
    )
    assert bound.accepted, [c.line() for c in bound.checks]
    path = tmp_path / "p.json"
    path.write_text('{"allowed_vmpl": [0, 1], "measurements": ["AB"]}')
    with pytest.raises(PolicyError, match="measurements"):
        load_policy(path)


def test_published_checks_name_what_was_promised(tmp_path: Path) -> None:
    _, _, key = _published(tmp_path)
    from attestation.published import Published

    promised = Published.model_validate(
        {
            "format": FORMAT, "version": "1.0", "image_digest": "sha256:" + "0" * 64,
            "model_weights_digest": "sha256:" + "0" * 64, "kernel_cmdline": "",
            "snp": [{"vcpus": 4, "vcpu_type": "EPYC-v4", "measurement": "ab" * 48}],
            "tdx": [{"mrtd": "cd" * 48, "rtmr0": "ee" * 48}],
        }
    )  # fmt: skip
    ok = check_published(Verdict("snp", facts={"measurement": "ab" * 48}), promised)
    assert ok.checks[-1].ok and "4 × EPYC-v4" in ok.checks[-1].detail
    assert not check_published(Verdict("snp", facts={"measurement": "00" * 48}), promised).accepted
    tdx = check_published(Verdict("tdx", facts={"mrtd": "cd" * 48, "rtmr0": "ff" * 48}), promised)
    assert tdx.checks[-1].ok is False  # the RTMR differs
    gpu = check_published(Verdict("nvidia", facts={}), promised)
    assert gpu.checks[-1].ok is None  # nothing published: not checked, not passed
    del key


def test_verify_snp_and_tdx_vectors_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    snp, tdx = VECTORS / "amd-sev-snp", VECTORS / "intel-tdx" / "dcap-qvl"
    if not snp.is_dir() or not tdx.is_dir():
        reason = f"{VECTORS} is absent: the public attestation vectors live in ../shared/vectors"
        print(reason)
        pytest.skip(reason)
    virtee = snp / "virtee-sev"
    args = ["attest", "verify", "--kind", "snp", "--evidence", str(virtee / "report_milan.hex"),
            "--certs", str(virtee / "vcek_milan.der"), "--certs", str(virtee / "cert_chain_milan.pem"),
            "--now", "2025-06-01T00:00:00Z", "--json"]  # fmt: skip
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["facts"]["version"] == 2
    gsg = snp / "go-sev-guest"  # genuine, but a debug guest: the default policy refuses it
    args = ["attest", "verify", "--kind", "snp", "--evidence", str(gsg / "attestation.bin"),
            "--certs", str(gsg / "vcek.der"), "--certs", str(gsg / "ask_ark_milan.pem"),
            "--now", "2025-06-01T00:00:00Z"]  # fmt: skip
    assert main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    # and its firmware (1.49.3, SNP SVN 5) is older than the Milan floor
    assert [x.split(":")[0] for x in lines if x.startswith("FAIL")] == [
        "FAIL policy.debug", "FAIL policy.min_tcb", "FAIL policy.min_committed_tcb",
        "FAIL policy.min_launch_tcb",
    ]  # fmt: skip
    quote = tdx / "tdx_quote"
    args = ["attest", "verify", "--kind", "tdx", "--evidence", str(quote),
            "--collateral", str(tdx / "tdx_quote_collateral.json"),
            "--now", "2025-07-01T00:00:00Z"]  # fmt: skip
    assert main(args) == 0
    assert "ok   policy.tcb_status: TCB UpToDate" in capsys.readouterr().out
    assert main([*args[:-2], "--now", "2026-01-01T00:00:00Z"]) == 1  # the collateral expired


def test_online_says_what_it_could_not_do_here(
    nv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_verify(nv, "--nonce", NONCE, "--online", "--json")) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["ocsp"]["ok"] is None and "no network" in checks["ocsp"]["detail"]
