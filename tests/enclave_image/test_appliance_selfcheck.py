"""The guest checks itself at boot (``enclave_image.appliance``: ``self_check``, the proxy's
``--tee-status``, the self-test's refusal, the attested front), its pieces run on the host.

Real parts: the proxy runner (``enclave_image.appliance_proxy``) as a supervised process on
loopback, the harness CLI the self-test runs, ``harness.front.Front`` over TLS. The one double
is the TEE: the kernel's configfs-tsm (``ConfigfsTsmDouble``) answering with reports signed by
the test double of AMD's chain (``snp_double``), whose ARK the self-check is told to trust
(``GuestLayout.self_check_roots``; the guest trusts AMD's pinned roots). No engine runs here:
the pinned turn under the override is ``test_appliance``'s health test.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.certs import load_certs
from attestation.channel import ChannelIdentity, parse_reply
from attestation.evidence import TrustedRoots, verify_evidence
from attestation.snp_cert_table import build_cert_table
from egress_proxy.tee_status import read_tee_status
from enclave_image.appliance import (
    BootOptions,
    GuestLayout,
    Keys,
    Refused,
    StartError,
    keep_evidence,
    nvidia_devices,
    parse_cmdline,
    prepare_dirs,
    prepare_keys,
    self_check,
    selftest_turn,
    services,
    start_front,
    wait_for,
    write_appliance_json,
    write_engine_token,
)
from enclave_image.appliance_channel import GuestEvidence
from enclave_image.appliance_supervise import Supervisor
from enclave_image.appliance_tsm import collect_evidence
from harness.state import Home
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report
from tests.enclave_image.host_guest import host_layout
from tests.enclave_image.test_appliance_tsm import ConfigfsTsmDouble

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 6, 1, tzinfo=UTC)


def test_cmdline_unattested_allow_or_nothing() -> None:
    base = "affidavit.state=/dev/vde affidavit.keysource=snp"
    assert parse_cmdline(base).allow_unattested is False
    assert parse_cmdline(base + " affidavit.unattested=allow").allow_unattested is True
    for value in ("yes", "", "ALLOW", "allow,now"):
        with pytest.raises(Refused, match=f"affidavit.unattested={value}: the only value is"):
            parse_cmdline(f"{base} affidavit.unattested={value}")


@dataclass
class Guest:
    layout: GuestLayout
    keys: Keys
    sup: Supervisor
    said: list[str]
    amd: FakeAmd
    ark: Path


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    """A guest's layout on the host with its proxy running (no engine: nothing here asks it)."""
    tmp = tmp_path_factory.mktemp("guest")
    model = tmp / "model"
    model.mkdir()
    (model / "m.gguf").write_bytes(b"GGUF")  # the model disk as model.json names it
    (model / "model.json").write_text(json.dumps({"name": "m", "path": "m.gguf"}))
    (tmp / "state").mkdir()
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    ark = tmp / "double-ark.pem"
    ark.write_bytes(amd.ark)
    layout = host_layout(
        tmp,
        tsm_reports=tmp / "tsm" / "report",
        model_dir=model,
        selftest_timeout=120,
        kds_url="http://127.0.0.1:9",  # never asked: the host's table carries the chain
        pci_devices=tmp / "pci",  # sysfs's PCI devices: none here (the host's may have a GPU)
    )
    layout.tsm_reports.mkdir(parents=True)
    prepare_dirs(layout)
    keys = prepare_keys(layout)
    write_appliance_json(layout)
    write_engine_token(layout)
    said: list[str] = []
    sup = Supervisor(said.append)
    sup.start_reaper()
    try:
        spec = services(layout)["proxy"]
        assert spec.argv[-2:] == ("--tee-status", str(layout.tee_status_file))
        sup.start(spec)
        wait_for("proxy", layout.url(layout.proxy_port) + "/metrics", 60, threading.Event())
        yield Guest(layout, keys, sup, said, amd, ark)
    finally:
        sup.stop_all(timeout=10)


def _double(guest: Guest) -> ConfigfsTsmDouble:
    """The kernel's configfs-tsm on an SNP guest (the TEE double): reports signed by the
    double's VCEK, with the host's certificate table (VCEK, ASK, ARK)."""
    ask, ark = (c.public_bytes(Encoding.DER) for c in load_certs(guest.amd.chain))
    table = build_cert_table([("vcek", guest.amd.vek), ("ask", ask), ("ark", ark)])
    return ConfigfsTsmDouble(
        "sev_guest", lambda data: v5_report(guest.amd.vek_key, report_data=data), table
    )


def _selftest(guest: Guest) -> list[str]:
    said: list[str] = []
    selftest_turn(guest.layout, guest.sup, said.append)
    return said


def test_the_services_carry_the_self_check(guest: Guest) -> None:
    def env(service: str, *tee: str) -> dict[str, str]:
        got = services(guest.layout, *tee)[service].env
        assert got is not None
        return got

    assert env("engine", "sev-snp")["AFFIDAVIT_TEE_TYPE"] == "sev-snp"
    assert env("engine")["AFFIDAVIT_TEE_TYPE"] == "none"
    assert "AFFIDAVIT_TEE_TYPE" not in env("proxy", "sev-snp")


def test_no_evidence_refuses_pinned_sessions_and_the_selftest_says_so(guest: Guest) -> None:
    layout = guest.layout
    layout.tee_status_file.unlink(missing_ok=True)
    # before PID 1 has checked: the proxy refuses already
    assert _selftest(guest) == ["selftest: refused: the appliance has not checked its evidence yet"]
    said: list[str] = []
    options = BootOptions(Path("/dev/vde"), "test-insecure")
    checked = self_check(layout, options, guest.keys, bytes(32), None, b"", said.append)
    assert not checked.attested and checked.tee_type == "none"
    assert said == [
        "selfcheck: FAILED: no evidence: keysource=test-insecure asks no TEE:"
        " pinned sessions are refused"
    ]
    status = read_tee_status(layout.tee_status_file)
    assert status is not None and not status.attested and not status.allow_unattested
    assert status.reason == "no evidence: keysource=test-insecure asks no TEE"
    assert stat.S_IMODE(layout.tee_status_file.stat().st_mode) == 0o644
    assert _selftest(guest) == [
        "selftest: refused: the appliance's check of its own evidence failed (no evidence:"
        " keysource=test-insecure asks no TEE); it runs with tee_type none, and only"
        " affidavit.unattested=allow on its kernel command line lets it pin sessions"
    ]
    # an SNP guest that found no TEE interface says where it looked
    said.clear()
    self_check(layout, replace(options, keysource="snp"), guest.keys, bytes(32), None, b"",
               said.append)  # fmt: skip
    assert said == [
        f"selfcheck: FAILED: no evidence: neither {layout.tsm_reports} nor {layout.sev_guest}"
        " is here: pinned sessions are refused"
    ]


def test_the_override_allows_pins_loudly(guest: Guest) -> None:
    layout = guest.layout
    said: list[str] = []
    options = BootOptions(Path("/dev/vde"), "test-insecure", allow_unattested=True)
    checked = self_check(layout, options, guest.keys, bytes(32), None, b"", said.append)
    assert not checked.attested
    assert said == [
        "selfcheck: FAILED: no evidence: keysource=test-insecure asks no TEE",
        "selfcheck: WARNING: unattested operation allowed by affidavit.unattested=allow:"
        " every reply says tee_type none",
    ]
    status = read_tee_status(layout.tee_status_file)
    assert status is not None and status.allow_unattested and status.tee_type == "none"
    # the pinned session opens (the turn itself needs the engine, which is not running here)
    home = Home(layout.home_dir)
    before = {s.session_id for s in home.sessions()}
    with pytest.raises(StartError, match=r"^selftest: turn \S+ exited 1$"):
        _selftest(guest)
    [opened] = [s for s in home.sessions() if s.session_id not in before]
    assert opened.pins is not None and opened.pins["strict_cache"] is True


def test_a_gpu_passed_through_is_said_neither_used_nor_attested(
    guest: Guest, tmp_path: Path
) -> None:
    """A stand-in for sysfs (no GPU here): an NVIDIA device beside another vendor's."""
    pci = tmp_path / "pci"
    for address, vendor in (("0000:00:02.0", "0x1af4"), ("0000:01:00.0", "0x10de")):
        (pci / address).mkdir(parents=True)
        (pci / address / "vendor").write_text(vendor + "\n")
    layout = replace(guest.layout, pci_devices=pci)
    said: list[str] = []
    options = BootOptions(Path("/dev/vde"), "test-insecure", allow_unattested=True)
    self_check(layout, options, guest.keys, bytes(32), None, b"", said.append)
    assert said[-1] == (
        "selfcheck: not checked here: gpu: NVIDIA device 0000:01:00.0 is present, but this"
        " image has no NVIDIA driver: it is neither used nor attested (docs/deploy.md)"
    )
    assert nvidia_devices(tmp_path / "absent") == []


def test_its_own_snp_evidence_checks_out_and_the_front_serves_fresh_evidence(
    guest: Guest,
) -> None:
    layout = replace(guest.layout, self_check_roots=guest.ark)
    said: list[str] = []
    nonce = os.urandom(32)
    double = _double(guest)
    evidence = collect_evidence(
        guest.keys.report_data(nonce), reports=layout.tsm_reports, files=double
    )
    assert evidence is not None and evidence.kind == "sev-snp"
    chain = keep_evidence(layout, guest.keys, evidence, said.append)
    assert len(load_certs(chain)) == 3  # VCEK, ASK, ARK from the host's table
    options = BootOptions(Path("/dev/vde"), "snp")
    said.clear()
    checked = self_check(layout, options, guest.keys, nonce, evidence, chain, said.append)
    assert checked.attested and checked.tee_type == "sev-snp", checked.reason
    assert said[0].startswith("selfcheck: attested (sev-snp): ")
    assert any(line.startswith("selfcheck: not checked here: launch_digest: ") for line in said)
    status = read_tee_status(layout.tee_status_file)
    assert status is not None and status.attested and status.tee_type == "sev-snp"
    # without the double's root (AMD's pinned roots, as in the guest) the same evidence fails
    said.clear()
    failed = self_check(guest.layout, options, guest.keys, nonce, evidence, chain, said.append)
    assert not failed.attested
    assert said[0].startswith("selfcheck: FAILED: chain.ark_pinned: ")
    assert said[0].endswith(": pinned sessions are refused")
    # another boot's nonce: the report is not this boot's
    stale = self_check(layout, options, guest.keys, bytes(32), evidence, chain, said.append)
    assert stale.reason is not None and stale.reason.startswith("binding: ")

    # the front: TLS with the state disk's key, /attestation from the TEE (the double)
    said.clear()
    source = GuestEvidence(chain, reports=layout.tsm_reports, sev_guest=layout.sev_guest,
                           files=double)  # fmt: skip
    front = start_front(layout, guest.keys, source, said.append)
    try:
        assert said[0].startswith(f"front: https://127.0.0.1:{layout.tls_port}: TLS key spki")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the client pins the key after the evidence
        ask = os.urandom(32)
        url = f"{front.url}/attestation?nonce={ask.hex()}"
        with urllib.request.urlopen(url, context=context, timeout=30) as got:
            reply = parse_reply(got.read())
        served = ssl.get_server_certificate(("127.0.0.1", layout.tls_port))
        from attestation.tls_identity import spki_sha256_of, tls_identity

        tls = tls_identity(layout.tls_dir)
        assert spki_sha256_of(ssl.PEM_cert_to_DER_cert(served)) == tls.spki_sha256
        assert stat.S_IMODE(layout.tls_dir.stat().st_mode) == 0o700
        [piece] = reply.evidence
        assert piece.kind == "snp" and piece.certs.encode() == chain
        identity = ChannelIdentity(guest.keys.log_key, guest.keys.sealing_raw, tls.spki_sha256)
        verdict = verify_evidence(
            "snp",
            base64.b64decode(piece.evidence),
            certs=[piece.certs.encode()],
            collateral=None,
            now=NOW,
            trusted=TrustedRoots(guest.ark, guest.amd.roots),
        )
        assert verdict.accepted, [c.line() for c in verdict.failed]
        assert verdict.facts["report_data"] == identity.report_data(ask).hex()

        # the sessions' routes go to the proxy on loopback; its /metrics stays inside
        def status(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(front.url + path, context=context, timeout=30) as got:
                    return got.status, got.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        code, said = status("/metrics")
        assert code == 404 and "is not served here" in said
        code, said = status("/s/no-such-session/v1/models")
        assert code in (401, 404) and "is not served here" not in said  # the proxy's answer
    finally:
        front.stop()
