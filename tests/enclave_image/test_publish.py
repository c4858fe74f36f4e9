"""``affidavit image measure`` end to end: a tiny image folder (a fake kernel, a real initrd
from ``enclave_image.initrd``) measured against the sev-snp-measure OVMF vector, published
and signed with a throwaway key, then read back the way ``affidavit attest verify
--published`` reads it; its measurement equals ``launch_digest`` computed directly."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation.certs import load_certs
from attestation.measure import launch_digest
from attestation.published import (
    SignatureMismatch,
    check_published,
    load_published,
    read_public_key,
    sign_published,
)
from attestation.verdict import Verdict
from enclave_image.initrd import write_initrd
from enclave_image.publish import (
    PublishError,
    compare_image,
    image_digest,
    measure_image,
    public_key_text,
    read_image_dir,
    read_private_key,
    write_published,
)
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd, v5_report

OVMF = (
    Path(__file__).resolve().parents[2].parent
    / "shared/vectors/attestation/measurement/sev-snp-measure/ovmf_AmdSev_suffix.bin"
)
CMDLINE = "console=ttyS0 root=/dev/dm-0 ro"
WEIGHTS = "ab" * 32


@pytest.fixture
def ovmf() -> Path:
    if not OVMF.is_file():
        reason = f"{OVMF} is absent: the sev-snp-measure vectors live in ../shared/vectors"
        print(reason)
        pytest.skip(reason)
    return OVMF


def make_image(folder: Path, *, weights: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "vmlinuz").write_bytes(b"MZ not really a kernel\0" * 100)
    tree = folder.parent / f"{folder.name}-tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin/init").write_text("#!/bin/sh\n")
    write_initrd(tree, folder / "initrd.img", epoch=0)
    (folder / "cmdline.txt").write_text(CMDLINE + "\n")
    if weights:
        (folder / "model-weights.sha256").write_text(f"{WEIGHTS}  model.safetensors\n")
    return folder


def write_key(path: Path, form: str) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()  # throwaway: the release key never enters the repo
    if form == "pem":
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    else:
        raw = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        path.write_text(base64.b64encode(raw).decode() + "\n")
    return key


@pytest.mark.parametrize("form", ["pem", "raw-base64"])
def test_measure_publishes_what_attest_verify_accepts(
    tmp_path: Path, ovmf: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image(tmp_path / "image")
    key = write_key(tmp_path / "release.key", form)
    out = tmp_path / "measurements"
    argv = ["image", "measure", str(image), "--ovmf", str(ovmf), "--vcpus", "1", "--vcpus", "4"]
    argv += ["--vcpu-type", "EPYC-v4", "--version", "0.1.0", "--release-key"]
    argv += [str(tmp_path / "release.key"), "--out", str(out), "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)

    # what `affidavit attest verify --published FILE --release-key release.pub` does
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (tmp_path / "release.pub").write_text(base64.b64encode(pub).decode() + "\n")
    assert printed["release_public_key"] == base64.b64encode(pub).decode()
    published = load_published(out / "0.1.0.json", read_public_key(tmp_path / "release.pub"))

    assert published.version == "0.1.0" and published.kernel_cmdline == CMDLINE
    assert published.model_weights_digest == f"sha256:{WEIGHTS}"
    assert published.firmware == {"ovmf_sha256": hashlib.sha256(ovmf.read_bytes()).hexdigest()}
    assert [(s.vcpus, s.vcpu_type) for s in published.snp] == [(1, "EPYC-v4"), (4, "EPYC-v4")]
    for launch in published.snp:
        direct = launch_digest(
            ovmf,
            vcpus=launch.vcpus,
            vcpu_type="EPYC-v4",
            kernel=image / "vmlinuz",
            initrd=image / "initrd.img",
            append=CMDLINE,
        )
        assert launch.measurement == direct
    assert published.snp[0].measurement != published.snp[1].measurement
    assert printed["snp"] == [s.model_dump() for s in published.snp]

    # the image digest, as docs/image.md defines it, computed literally
    framed = b"affidavit/image/v1\0"
    for part in (
        (image / "vmlinuz").read_bytes(),
        (image / "initrd.img").read_bytes(),
        CMDLINE.encode(),
    ):
        framed += struct.pack(">Q", len(part)) + part
    assert published.image_digest == "sha256:" + hashlib.sha256(framed).hexdigest()

    # a report whose measurement is one of these passes the published.snp check
    facts = {"measurement": published.snp[1].measurement, "policy": "0x30000"}
    verdict = Verdict(kind="snp", facts=facts)
    check_published(verdict, published)
    assert verdict.accepted

    # a flipped byte is refused; another key is refused
    data = (out / "0.1.0.json").read_bytes()
    (out / "0.1.0.json").write_bytes(data.replace(b"0.1.0", b"0.1.1", 1))
    with pytest.raises(SignatureMismatch):
        load_published(out / "0.1.0.json", key.public_key())
    (out / "0.1.0.json").write_bytes(data)
    with pytest.raises(SignatureMismatch):
        load_published(out / "0.1.0.json", Ed25519PrivateKey.generate().public_key())

    # a release is not rewritten by accident
    assert main(argv) == 2
    assert main([*argv, "--replace"]) == 0


def test_weights_digest_option_and_conflicts(tmp_path: Path, ovmf: Path) -> None:
    bare = read_image_dir(make_image(tmp_path / "bare", weights=False))
    with pytest.raises(PublishError, match="--weights-digest"):
        measure_image(bare, ovmf=ovmf, launches=[(1, "EPYC-v4")], version="1")
    given = measure_image(
        bare,
        ovmf=ovmf,
        launches=[(1, "EPYC-v4")],
        version="1",
        weights_digest="sha256:" + "cd" * 32,
    )
    assert given.model_weights_digest == "sha256:" + "cd" * 32
    full = read_image_dir(make_image(tmp_path / "full"))
    with pytest.raises(PublishError, match="disagrees"):
        measure_image(
            full, ovmf=ovmf, launches=[(1, "EPYC-v4")], version="1", weights_digest="cd" * 32
        )
    with pytest.raises(PublishError, match="version"):
        measure_image(full, ovmf=ovmf, launches=[(1, "EPYC-v4")], version="../x")


def test_image_digest_is_framed(tmp_path: Path) -> None:
    for name, data in [("k1", b"ab"), ("i1", b"c"), ("k2", b"a"), ("i2", b"bc")]:
        (tmp_path / name).write_bytes(data)
    one = image_digest(tmp_path / "k1", tmp_path / "i1", "x")
    two = image_digest(tmp_path / "k2", tmp_path / "i2", "x")
    assert one != two  # kernel||initrd alone would be the same bytes


def test_cli_errors(tmp_path: Path, ovmf: Path) -> None:
    image = make_image(tmp_path / "image")
    write_key(tmp_path / "k", "pem")
    base = ["image", "measure", str(image), "--ovmf", str(ovmf), "--vcpus", "2"]
    base += ["--vcpu-type", "EPYC-v4", "--version", "1", "--out", str(tmp_path / "m")]
    assert main([*base, "--release-key", str(tmp_path / "absent")]) == 3
    (tmp_path / "bad").write_text("not a key\n")
    assert main([*base, "--release-key", str(tmp_path / "bad")]) == 2
    with pytest.raises(PublishError):
        read_private_key(tmp_path / "bad")
    assert main([*base, "--release-key", str(tmp_path / "k"), "--vcpu-type", "Pentium"]) == 2
    (image / "cmdline.txt").unlink()
    assert main([*base, "--release-key", str(tmp_path / "k")]) == 3
    assert not (tmp_path / "m").exists()
    missing_ovmf = [*base[:4], str(tmp_path / "no-ovmf"), *base[5:]]
    (image / "cmdline.txt").write_text("a\nb\n")
    assert main([*missing_ovmf, "--release-key", str(tmp_path / "k")]) == 2  # cmdline first
    (image / "cmdline.txt").write_text("a\n")
    assert main([*missing_ovmf, "--release-key", str(tmp_path / "k")]) == 3


def test_the_release_public_key_is_committed_and_is_what_verify_pins() -> None:
    """Acceptance 5: the release public key is in the repository (its private half is not:
    no PEM or raw private key anywhere under measurements/)."""
    from attestation.cli import RELEASE_KEY
    from attestation.published import read_public_key

    repo = Path(__file__).resolve().parents[2]
    assert repo / "measurements" / "release.pub" == RELEASE_KEY
    key = read_public_key(RELEASE_KEY)
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert base64.b64encode(raw).decode() == RELEASE_KEY.read_text().strip()
    for path in (repo / "measurements").iterdir():
        text = path.read_bytes()
        assert b"PRIVATE KEY" not in text, path


def test_measure_refuses_a_test_build_unless_told(
    tmp_path: Path, ovmf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A test build (``image build --test-model tiny``: its ``inputs.json`` says so) carries
    the tiny model, not the release's: ``measure`` exits 1 and writes nothing, unless
    ``--allow-test-model``; ``compare`` labels it."""
    from enclave_image.build import write_inputs

    image = make_image(tmp_path / "image")
    write_inputs(image, {"profile": "full"}, model={"name": "affidavit-tiny"}, test_model="tiny")
    write_key(tmp_path / "k", "pem")
    out = tmp_path / "m"
    argv = ["image", "measure", str(image), "--ovmf", str(ovmf), "--vcpus", "1"]
    argv += ["--vcpu-type", "EPYC-v4", "--version", "1", "--release-key", str(tmp_path / "k")]
    argv += ["--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "refusing to measure" in err and "TEST build" in err and "--allow-test-model" in err
    assert not out.exists()
    with pytest.raises(PublishError, match="TEST build"):
        measure_image(read_image_dir(image), ovmf=ovmf, launches=[(1, "EPYC-v4")], version="1")

    assert main([*argv, "--allow-test-model"]) == 0
    assert "WARNING" in capsys.readouterr().err and (out / "1.json").is_file()
    pub = tmp_path / "k.pub"
    key = read_private_key(tmp_path / "k")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pub.write_text(base64.b64encode(raw).decode() + "\n")
    compare = ["image", "compare", str(image), str(out / "1.json"), "--ovmf", str(ovmf)]
    assert main([*compare, "--release-key", str(pub)]) == 0  # a label, not a failed check
    assert "skip test_model: the rebuilt image is a TEST build" in capsys.readouterr().out

    # the same folder as a release build's (test_model null) is measured as before
    write_inputs(image, {"profile": "full"}, model={"name": "smollm2-135m"}, test_model=None)
    assert main([*argv, "--replace"]) == 0


def test_the_launch_is_recorded_and_compare_recomputes_with_it(tmp_path: Path, ovmf: Path) -> None:
    """Issue 17 line 2: the published file records the guest policy, VMM type and guest
    features it measured, and ``compare`` recomputes with the file's, not a default."""
    image = read_image_dir(make_image(tmp_path / "image"))
    key = write_key(tmp_path / "k", "pem")
    published = measure_image(image, ovmf=ovmf, launches=[(2, "EPYC-Milan")], version="2.0.0")
    assert (published.guest_policy, published.vmm_type, published.guest_features) == (
        "0x30000",
        "QEMU",
        "0x1",
    )
    written = json.loads(write_published(published, tmp_path / "m", key).path.read_text())
    assert {k: written[k] for k in ("guest_policy", "vmm_type", "guest_features")} == {
        "guest_policy": "0x30000",
        "vmm_type": "QEMU",
        "guest_features": "0x1",
    }
    assert written["kernel_cmdline"] == CMDLINE

    restricted = measure_image(
        image, ovmf=ovmf, launches=[(2, "EPYC-Milan")], version="2.0.1", guest_features=0x21
    )
    assert restricted.guest_features == "0x21"
    assert restricted.snp[0].measurement != published.snp[0].measurement
    assert all(c.ok is not False for c in compare_image(image, restricted, ovmf=ovmf))
    # a file claiming 0x1 for the 0x21 measurement: only the launch differs
    lying = restricted.model_copy(update={"guest_features": "0x1"})
    fails = [c.name for c in compare_image(image, lying, ovmf=ovmf) if c.ok is False]
    assert fails == ["snp[2 x EPYC-Milan]"]
    with pytest.raises(PublishError, match="vmm type"):
        measure_image(image, ovmf=ovmf, launches=[(1, "EPYC")], version="1", vmm_type="xen")  # type: ignore[arg-type]


def test_a_file_from_before_the_launch_fields_still_reads(tmp_path: Path, ovmf: Path) -> None:
    """Older published files have no guest_policy, vmm_type or guest_features: they load,
    compare as QEMU with guest features 0x1, and add no guest-policy check."""
    image = read_image_dir(make_image(tmp_path / "image"))
    key = write_key(tmp_path / "k", "pem")
    doc = measure_image(image, ovmf=ovmf, launches=[(1, "EPYC-v4")], version="0.9.0").model_dump(
        mode="json", exclude_defaults=True
    )
    for name in ("guest_policy", "vmm_type", "guest_features"):
        del doc[name]
    path = tmp_path / "0.9.0.json"
    path.write_text(json.dumps(doc))
    path.with_name("0.9.0.json.sig").write_text(sign_published(path.read_bytes(), key))
    old = load_published(path, key.public_key())
    assert (old.guest_policy, old.vmm_type, old.guest_features) == (None, None, None)
    assert all(c.ok for c in compare_image(image, old, ovmf=ovmf) if c.name.startswith("snp"))
    verdict = Verdict(kind="snp", facts={"measurement": old.snp[0].measurement, "policy": "0x0"})
    check_published(verdict, old)
    assert [c.name for c in verdict.checks] == ["published.snp"] and verdict.accepted


@pytest.mark.parametrize(
    ("policy", "held"),
    [
        (0x30000, True),  # the published one
        (0xB0000, False),  # debug allowed (bit 19)
        (0x70000, False),  # a migration agent allowed (bit 18)
        (0x20000, False),  # SMT not allowed: stricter, but not the launch the release names
        (0x30001, False),  # another minimum ABI
    ],
)
def test_attest_verify_holds_the_report_to_the_published_guest_policy(
    tmp_path: Path, ovmf: Path, policy: int, held: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """``attest verify --published``: the VMM picks the guest policy and the launch digest
    does not cover it, so the report's must be exactly the published ``guest_policy``."""
    image = read_image_dir(make_image(tmp_path / "image"))
    key = write_key(tmp_path / "k", "pem")
    published = measure_image(image, ovmf=ovmf, launches=[(1, "EPYC-v4")], version="3.0.0")
    path = write_published(published, tmp_path / "m", key).path
    (tmp_path / "release.pub").write_text(public_key_text(key) + "\n")
    chain = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    report = v5_report(
        chain.vek_key, measurement=bytes.fromhex(published.snp[0].measurement), policy=policy
    )
    (tmp_path / "report.bin").write_bytes(report)
    vek = load_certs(chain.vek)[0].public_bytes(serialization.Encoding.PEM)
    (tmp_path / "certs.pem").write_bytes(vek + chain.chain)
    ark = next(c for c in load_certs(chain.chain) if c.subject == c.issuer)
    (tmp_path / "ark.pem").write_bytes(ark.public_bytes(serialization.Encoding.PEM))
    argv = ["attest", "verify", "--kind", "snp", "--evidence", str(tmp_path / "report.bin")]
    argv += ["--certs", str(tmp_path / "certs.pem"), "--published", str(path)]
    argv += ["--release-key", str(tmp_path / "release.pub"), "--trusted-root"]
    argv.append(str(tmp_path / "ark.pem"))
    capsys.readouterr()
    main(argv)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "published.guest_policy" in x)
    assert line.startswith("ok  " if held else "FAIL"), out
    assert f"{policy:#x}" in line
    assert "ok   published.snp: measurement matches 3.0.0" in out
