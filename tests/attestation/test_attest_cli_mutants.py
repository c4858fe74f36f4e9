"""``affidavit attest verify`` / ``policy`` in process: every usage error, missing input and
output line word for word, so a broken check in ``attestation/cli.py`` fails here in a second.

The evidence is real: NVIDIA's public H100 vector, and SEV-SNP reports signed by the test
double of AMD's chain (``snp_double``), trusted with ``--trusted-root``.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation import cli as attest_cli
from attestation.published import FORMAT, sign_published
from attestation.verdict import Verdict
from tests.attestation.kds_double import stand_in_kds
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
NV = VECTORS / "nvidia-h100" / "nvtrust"
NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
NOW = "2025-06-01T00:00:00Z"
#: the tail of REPORT_DATA in ``v5_report``'s reports (bytes 0x20 to 0x3f)
REPORT_NONCE = bytes(range(0x20, 0x40)).hex()


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


@pytest.fixture
def nv() -> Path:
    if not NV.is_dir():
        pytest.skip(f"{NV} is absent: the public attestation vectors live in ../shared/vectors")
    return NV


def _nvidia(nv: Path, *extra: str) -> list[str]:
    return [
        "attest", "verify", "--kind", "nvidia",
        "--evidence", str(nv / "hopperAttestationReport.hex"),
        "--certs", str(nv / "hopperCertChain.pem"), "--now", "2025-01-01T00:00:00Z", *extra,
    ]  # fmt: skip


def _snp(tmp: Path, amd: FakeAmd, *extra: str, report: bytes | None = None) -> list[str]:
    (tmp / "report.bin").write_bytes(v5_report(amd.vek_key) if report is None else report)
    (tmp / "vek.der").write_bytes(amd.vek)
    (tmp / "chain.pem").write_bytes(amd.chain)
    (tmp / "ark.pem").write_bytes(amd.ark)
    return [
        "attest", "verify", "--kind", "snp", "--evidence", str(tmp / "report.bin"),
        "--certs", str(tmp / "vek.der"), "--certs", str(tmp / "chain.pem"),
        "--trusted-root", str(tmp / "ark.pem"), "--now", NOW, *extra,
    ]  # fmt: skip


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


# --- --now ----------------------------------------------------------------------------------


def test_parse_now_reads_an_offset_and_answers_in_utc() -> None:
    assert attest_cli.parse_now("2025-01-01T01:30:00+01:00") == datetime(
        2025, 1, 1, 0, 30, tzinfo=UTC
    )
    when = attest_cli.parse_now("2025-01-01T00:00:00Z")
    assert when == datetime(2025, 1, 1, tzinfo=UTC) and when.tzinfo is UTC
    before = datetime.now(UTC)
    now = attest_cli.parse_now(None)
    assert before <= now <= datetime.now(UTC) + timedelta(seconds=1) and now.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yesterday", "'yesterday' is not an RFC 3339 time"),
        ("2025-01-01T00:00:00", "'2025-01-01T00:00:00' has no UTC offset"),
    ],
)
def test_parse_now_refuses_word_for_word(text: str, message: str) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        attest_cli.parse_now(text)
    assert caught.value.format_message() == f"Invalid value for --now: {message}"


# --- usage errors (2), each named by its option -------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kind", "sgx"], "Invalid value for --kind: 'sgx': snp, tdx or nvidia"),
        (["--kind", "SNP"], "Invalid value for --kind: 'SNP': snp, tdx or nvidia"),
        (["--trusted-root", "ark.pem"], "Invalid value for --trusted-root: is for --kind snp only"),
        (["--crl", "ark.crl"], "Invalid value for --crl/--fetch-crl: is for --kind snp only"),
        (["--fetch-crl"], "Invalid value for --crl/--fetch-crl: is for --kind snp only"),
        (["--nonce", "zz"], "Invalid value for --nonce: 'zz' is not hex"),
        (["--now", "2025-01-01T00:00:00"], "Invalid value for --now: '2025-01-01T00:00:00' has"),
    ],
)
def test_nvidia_usage_errors_are_named_by_their_option(
    nv: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = _nvidia(nv)
    if extra[0] == "--kind":
        args[args.index("nvidia")] = extra[1]
    else:
        args += extra
    assert main(args) == 2
    err = _err(capsys)
    assert f"Error: {message}" in err
    assert capsys.readouterr().out == ""


def test_snp_usage_errors_are_named_by_their_option(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rim = tmp_path / "driver.swidtag"
    rim.write_text("<x/>")
    assert main(_snp(tmp_path, amd, "--rim", str(rim))) == 2
    assert "Error: Invalid value for --rim: is for --kind nvidia only" in _err(capsys)
    crl = tmp_path / "ark.crl"
    crl.write_bytes(amd.crl())
    assert main(_snp(tmp_path, amd, "--crl", str(crl), "--fetch-crl")) == 2
    assert "Invalid value for --crl: give --crl FILE or --fetch-crl, not both" in _err(capsys)
    (tmp_path / "vek-only.der").write_bytes(amd.vek)
    not_ark = tmp_path / "not-ark.pem"
    not_ark.write_bytes(
        amd.chain.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    )
    args = _snp(tmp_path, amd)
    args[args.index(str(tmp_path / "ark.pem"))] = str(not_ark)
    assert main(args) == 2
    err = _err(capsys)
    assert f"Error: Invalid value for --trusted-root: {not_ark}" in err and "None" not in err


def test_a_rim_that_is_not_a_rim_is_a_usage_error_named_by_rim(
    nv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rim = tmp_path / "driver.swidtag"
    rim.write_text("not xml")
    assert main(_nvidia(nv, "--rim", str(rim))) == 2  # read, not refused for its kind
    assert f"Error: Invalid value for --rim: {rim}: not an XML RIM: " in _err(capsys)


def test_fetch_crl_needs_a_vek_naming_its_product(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _snp(tmp_path, amd, "--fetch-crl", "--kds", "http://127.0.0.1:9")
    assert main(args) == 3  # nothing listens on the discard port: KDS did not answer
    assert _err(capsys).startswith("affidavit: missing: AMD's CRL: ")
    with pytest.raises(typer.BadParameter) as caught:
        attest_cli._fetch_crl([amd.chain], "http://127.0.0.1:9")
    assert caught.value.format_message() == (
        "Invalid value for --certs: no VCEK/VLEK naming its product"
    )


# --- missing inputs (3) and bad files (2) --------------------------------------------------


@pytest.mark.parametrize("option", ["--evidence", "--certs", "--collateral", "--trusted-root"])
def test_a_missing_input_is_exit_3_naming_it(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    args = _snp(tmp_path, amd)
    gone = tmp_path / "gone.bin"
    if option in args:
        args[args.index(option) + 1] = str(gone)
    else:
        args += [option, str(gone)]
    assert main(args) == 3
    assert _err(capsys) == f"affidavit: missing: {gone} does not exist\n"
    assert capsys.readouterr().out == ""


def test_a_missing_release_key_or_crl_is_exit_3(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published, _ = _published(tmp_path)
    gone = tmp_path / "gone.pub"
    assert main(_snp(tmp_path, amd, "--published", str(published), "--release-key", str(gone))) == 3
    assert _err(capsys) == f"affidavit: missing: {gone} does not exist\n"
    assert main(_snp(tmp_path, amd, "--crl", str(tmp_path / "gone.crl"))) == 3
    assert _err(capsys) == f"affidavit: missing: {tmp_path / 'gone.crl'} does not exist\n"


def test_a_bad_policy_or_published_file_is_exit_2(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text('{"max_vmpl": 9}')
    assert main(_snp(tmp_path, amd, "--policy", str(policy))) == 2
    err = _err(capsys)
    assert err.startswith("affidavit: error: ") and "max_vmpl" in err
    published, pub = _published(tmp_path)
    published.write_text("{}")  # signature no longer matches: a problem, not usage
    assert main(_snp(tmp_path, amd, "--published", str(published), "--release-key", str(pub))) == 1
    out = capsys.readouterr().out
    assert "FAIL published.signature: " in out
    published.with_name(published.name + ".sig").unlink()
    assert main(_snp(tmp_path, amd, "--published", str(published), "--release-key", str(pub))) == 2
    assert _err(capsys).startswith("affidavit: error: ")


def _published(tmp: Path) -> tuple[Path, Path]:
    key = Ed25519PrivateKey.generate()
    doc = {
        "format": FORMAT,
        "version": "0.0.0-test",
        "image_digest": "sha256:" + "0" * 64,
        "model_weights_digest": "sha256:" + "1" * 64,
        "kernel_cmdline": "console=ttyS0",
    }
    path = tmp / "0.0.0-test.json"
    path.write_text(json.dumps(doc))
    path.with_name(path.name + ".sig").write_text(sign_published(path.read_bytes(), key))
    pub = tmp / "release.pub"
    pub.write_text(base64.b64encode(key.public_key().public_bytes_raw()).decode())
    return path, pub


# --- the verdict, as text and as JSON ------------------------------------------------------


def test_an_accepted_verdict_names_what_was_not_checked(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published, pub = _published(tmp_path)  # signed, but not publishing this launch
    assert main(_snp(tmp_path, amd, "--published", str(published), "--release-key", str(pub))) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"ok   published.signature: {published} is signed by the release key" in lines
    assert lines[lines.index(lines[-2]) - 1].startswith("ok   published.signature: ")
    args = _snp(tmp_path, amd)
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("skip trust.amd_roots: ")
    skips = sum(1 for line in lines if line.startswith("skip "))
    assert skips >= 1
    assert lines[-1] == f"verdict: accept ({skips} not checked: see the skip lines)"
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["verdict", "checks", "kind", "facts"]
    assert doc["verdict"] == "accept" and doc["kind"] == "snp"
    names = [c["name"] for c in doc["checks"]]
    assert names[0] == "trust.amd_roots" and names[-1] == "policy.min_launch_tcb"
    assert isinstance(doc["facts"], dict) and doc["facts"]


def test_a_rejected_verdict_says_reject(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = bytearray(v5_report(amd.vek_key))
    report[0x50] ^= 1  # a signed byte changed: the signature no longer holds
    assert main(_snp(tmp_path, amd, report=bytes(report))) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("verdict: REJECT")
    assert main([*_snp(tmp_path, amd, report=bytes(report)), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "reject"


def test_certificates_that_do_not_parse_are_a_rejection_that_still_says_the_roots(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _snp(tmp_path, amd)
    (tmp_path / "vek.der").write_bytes(b"\x30\x03junk")  # verify_evidence raises ValueError
    assert main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("skip trust.amd_roots: NOT checked: ")
    assert lines[1].startswith("FAIL parse: ")
    assert lines[-1] == "verdict: REJECT (1 not checked: see the skip lines)"
    cut = args.index("--trusted-root")
    del args[cut : cut + 2]
    assert main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("FAIL parse: ") and lines[-1] == "verdict: REJECT"


def test_the_nonce_becomes_the_policys_for_snp_not_for_nvidia(
    amd: FakeAmd, nv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_snp(tmp_path, amd, "--nonce", "ab" * 32), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    failed = [c["name"] for c in doc["checks"] if c["ok"] is False]
    assert failed == ["policy.nonce"]
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"nonce": "cd" * 32}))
    assert main([*_snp(tmp_path, amd, "--nonce", REPORT_NONCE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert next(c for c in doc["checks"] if c["name"] == "policy.nonce")["ok"] is True
    # a policy's own nonce is kept over --nonce
    assert main([*_snp(tmp_path, amd, "--nonce", REPORT_NONCE, "--policy", str(policy))]) == 1
    assert "FAIL policy.nonce: " in capsys.readouterr().out
    assert main([*_nvidia(nv, "--nonce", NONCE), "--json"]) == 0
    names = [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]]
    assert "policy.nonce" not in names and "nonce" in names


# --- attest policy and the sub-app ---------------------------------------------------------


def test_policy_show_lines_and_json_word_for_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attestation.policy import REASONS, Policy

    assert main(["attest", "policy", "--show"]) == 0
    out = capsys.readouterr().out.splitlines()
    first = next(iter(Policy.model_fields))
    value = json.dumps(Policy().model_dump(mode="json")[first])
    assert out[:2] == [f"{first} = {value}", f"    why: {REASONS[first]}"]
    assert len(out) == 2 * len(Policy.model_fields)
    path = tmp_path / "fleet.json"
    path.write_text('{"max_vmpl": 1}')
    assert main(["attest", "policy", "--show", "--json", "--policy", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["policy", "file", "members"]
    assert doc["file"] == str(path)
    members = {m["name"]: m for m in doc["members"]}
    assert members["max_vmpl"] == {
        "name": "max_vmpl", "value": 1, "default": 0, "from_file": True,
        "why": REASONS["max_vmpl"],
    }  # fmt: skip
    assert [m["name"] for m in doc["members"]] == list(Policy.model_fields)
    assert main(["attest", "policy", "--show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["file"] is None


def test_policy_refusals_word_for_word(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "nope.json"
    assert main(["attest", "policy", "--show", "--policy", str(gone)]) == 3
    assert _err(capsys) == f"affidavit: missing: {gone} does not exist\n"
    bad = tmp_path / "bad.json"
    bad.write_text('{"max_vmpl": 9}')
    assert main(["attest", "policy", "--show", "--policy", str(bad)]) == 2
    err = _err(capsys)
    assert err.startswith("affidavit: error: ") and "max_vmpl" in err
    assert main(["attest", "policy"]) == 2
    assert "Error: Invalid value for --show: say --show" in _err(capsys)


def test_register_adds_attest_with_its_three_commands() -> None:
    app = typer.Typer()
    app.callback()(lambda: None)
    attest = attest_cli.register(app)
    root = typer.main.get_command(app)
    group = getattr(root, "commands", {})["attest"]
    assert sorted(getattr(group, "commands", {})) == ["bind-check", "policy", "verify"]
    assert group.help == (
        "Attestation: verify evidence, check a bundle's binding, collect (in the appliance)."
    )
    assert group.no_args_is_help is True
    assert isinstance(attest, typer.Typer) and attest.info.name == "attest"


# --- the JSON as printed, and the KDS asked for the CRL ------------------------------------


def test_the_json_verdict_is_indented_by_two_and_writes_what_json_cannot_as_text(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_snp(tmp_path, amd), "--json"]) == 0
    out = _out_only(capsys)
    assert out == json.dumps(json.loads(out), indent=2) + "\n"
    verdict = Verdict("snp")
    verdict.add("parse", True, "read")
    verdict.facts["when"] = datetime(2025, 1, 1, tzinfo=UTC)
    verdict.facts["raw"] = b"\x01"
    attest_cli._print(verdict, True)
    doc = json.loads(_out_only(capsys))
    assert doc["facts"] == {"when": "2025-01-01 00:00:00+00:00", "raw": "b'\\x01'"}


def test_the_json_policy_is_indented_by_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attest", "policy", "--show", "--json"]) == 0
    out = _out_only(capsys)
    assert out == json.dumps(json.loads(out), indent=2) + "\n"


def _out_only(capsys: pytest.CaptureFixture[str]) -> str:
    got = capsys.readouterr()
    assert got.err == ""
    return got.out


def test_fetch_crl_ignores_proxy_settings_in_the_environment(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KDS is asked directly: a proxy named in the environment (nothing listens there) is not
    used, as httpx would with ``trust_env``."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with stand_in_kds() as kds:
        kds.documents["/vcek/v1/Turin/crl"] = amd.crl()
        assert main(_snp(tmp_path, amd, "--fetch-crl", "--kds", kds.url)) == 0
        assert kds.asked == ["/vcek/v1/Turin/crl"]
    assert "ok   chain.revocation: ARK-Turin's CRL" in capsys.readouterr().out


class _SlowDocuments(dict[str, bytes]):
    """A KDS that answers after 5.5 s: longer than httpx's default timeout of 5 s."""

    def get(self, key: str, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        time.sleep(5.5)
        return super().get(key, default)


def test_fetch_crl_waits_for_a_slow_kds(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with stand_in_kds() as kds:
        kds.documents = _SlowDocuments({"/vcek/v1/Turin/crl": amd.crl()})
        assert main(_snp(tmp_path, amd, "--fetch-crl", "--kds", kds.url)) == 0
    assert "ok   chain.revocation: ARK-Turin's CRL" in capsys.readouterr().out


class _SlowerDocuments(dict[str, bytes]):
    """A KDS that answers after 1.5 s."""

    def get(self, key: str, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        time.sleep(1.5)
        return super().get(key, default)


def test_fetch_crl_gives_up_at_its_timeout(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The KDS request has a deadline (``KDS_TIMEOUT_S``, here cut to 0.5 s): a KDS slower
    than it is a CRL that could not be had, not a wait for ever."""
    import attestation.cli

    monkeypatch.setattr(attestation.cli, "KDS_TIMEOUT_S", 0.5)
    with stand_in_kds() as kds:
        kds.documents = _SlowerDocuments({"/vcek/v1/Turin/crl": amd.crl()})
        code = main(_snp(tmp_path, amd, "--fetch-crl", "--kds", kds.url))
    err = _err(capsys)
    assert code == 3, err
    assert "AMD's CRL" in err and "ReadTimeout" in err, err


def test_no_key_certificate_is_a_usage_error_named_by_certs(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _snp(tmp_path, amd)
    cut = args.index("--certs")
    del args[cut : cut + 4]
    assert main(args) == 2
    assert "Error: Invalid value for --certs: no VCEK or VLEK among the certificates" in _err(
        capsys
    )


def test_a_parse_failure_keeps_its_kind_in_json(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _snp(tmp_path, amd)
    (tmp_path / "vek.der").write_bytes(b"\x30\x03junk")
    assert main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "snp" and doc["verdict"] == "reject"


# --- the details of what was refused, and the RIMs handed on -------------------------------


def test_a_published_file_whose_signature_does_not_match_is_named_word_for_word(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published, pub = _published(tmp_path)
    published.write_text("{}")  # the signature no longer matches
    assert main(_snp(tmp_path, amd, "--published", str(published), "--release-key", str(pub))) == 1
    lines = _out_only(capsys).splitlines()
    assert (
        f"FAIL published.signature: published {published}: the signature {published}.sig "
        "does not verify with the release key"
    ) in lines
    assert lines[-1].startswith("verdict: REJECT")


def test_a_parse_failure_says_what_did_not_parse(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _snp(tmp_path, amd)
    (tmp_path / "vek.der").write_bytes(b"\x30\x03junk")
    assert main([*args, "--json"]) == 1
    doc = json.loads(_out_only(capsys))
    parse = next(c for c in doc["checks"] if c["name"] == "parse")
    assert parse["ok"] is False
    assert parse["detail"].startswith("error parsing asn1 value: ")


def test_the_rims_given_are_compared_with_the_gpus_measurements(
    nv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.attestation.test_nvidia_rim_unit import DRIVER_VERSION, RimTestChain

    rim = tmp_path / "driver.swidtag"
    rim.write_bytes(RimTestChain().sign({7: True}, DRIVER_VERSION))  # not NVIDIA's root
    assert main(_nvidia(nv, "--rim", str(rim))) == 1
    lines = _out_only(capsys).splitlines()
    assert f"FAIL rim.driver: {rim}: not compared: its signature does not verify" in lines
    assert any(line.startswith(f"FAIL rim.signature: {rim} (driver 545.00): ") for line in lines)
    assert not any(line.startswith("skip rim.driver") for line in lines)


def test_the_commands_own_defaults_are_offline_text_and_no_crl(
    nv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Called as Python functions (typer passes every option, so only a direct call reads the
    functions' own defaults): offline, no CRL fetched, text, and ``policy`` needs ``--show``."""
    with pytest.raises(typer.Exit) as done:
        attest_cli.attest_verify(
            evidence=nv / "hopperAttestationReport.hex",
            kind="nvidia",
            certs=[nv / "hopperCertChain.pem"],
            now="2025-01-01T00:00:00Z",
            nonce=NONCE,
        )
    assert done.value.exit_code == 0  # not refused as --fetch-crl for --kind nvidia
    lines = _out_only(capsys).splitlines()
    assert lines[-1] == "verdict: accept (3 not checked: see the skip lines)"  # text, not JSON
    assert any(line.startswith("skip ocsp: not checked offline: ") for line in lines)
    with pytest.raises(typer.BadParameter) as caught:
        attest_cli.attest_policy()
    assert caught.value.format_message() == "Invalid value for --show: say --show"
    attest_cli.attest_policy(show=True)
    assert _out_only(capsys).startswith("allow_debug = false\n    why: ")  # text, not JSON


def test_now_takes_utc_as_z_or_z_in_lower_case() -> None:
    """RFC 3339 §5.6: the ``T`` and ``Z`` may be lower case."""
    from datetime import UTC, datetime

    from attestation.cli import parse_now

    midnight = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_now("2025-01-01T00:00:00Z") == midnight
    assert parse_now("2025-01-01t00:00:00z") == midnight
    assert parse_now("2025-01-01T01:00:00+01:00") == midnight
