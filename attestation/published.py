"""Published measurements: what a release promises, signed, for auditors to hold evidence to.

A release publishes ``measurements/<version>.json`` and beside it ``<version>.json.sig``, the
detached Ed25519 signature (base64, one line) over the file's exact bytes. An auditor pins
the release public key (``measurements/release.pub``: base64 of the raw 32-byte key) and
checks the signature before believing a byte of the file. The format (``docs/attestation.md``):

    {"format": "affidavit-measurements/1", "version": "…",
     "image_digest": "sha256:…", "model_weights_digest": "sha256:…",
     "kernel_cmdline": "…", "firmware": {"ovmf_sha256": "…"},
     "guest_policy": "0x30000", "vmm_type": "QEMU", "guest_features": "0x1",
     "snp": [{"vcpus": 4, "vcpu_type": "EPYC-v4", "measurement": "<96 hex>"}],
     "tdx": [{"mrtd": "<96 hex>", "rtmr0": "…", "rtmr1": "…", "rtmr2": "…"}],
     "gpu": {"driver_versions": ["550.90.07"], "vbios_versions": ["96.00.9F.00.01"]}}

``guest_policy``, ``vmm_type`` and ``guest_features`` are the SEV-SNP launch the release
measured: the guest policy the VMM launches with, and the VMM and VMSA features the launch
digests were computed for. Files written before they existed lack them: they are optional
on read (an auditor then assumes QEMU and 0x1, the only launch measured then), and
``enclave_image.publish`` always writes them.

``check_published`` adds ``published.*`` checks to a verdict: the evidence's measurement is
one the release promised, and an SNP report's guest policy is the published one.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attestation.verdict import Verdict

__all__ = [
    "FORMAT",
    "GpuState",
    "Published",
    "PublishedError",
    "SignatureMismatch",
    "SnpLaunch",
    "TdxLaunch",
    "check_published",
    "load_published",
    "read_public_key",
    "sign_published",
]

FORMAT = "affidavit-measurements/1"
_HEX48 = r"^[0-9a-f]{96}$"
_DIGEST = r"^sha256:[0-9a-f]{64}$"
_HEX_INT = r"^0x[0-9a-f]{1,16}$"


class PublishedError(ValueError):
    """A published file that cannot be read, saying why."""


class SignatureMismatch(PublishedError):
    """A published file whose detached signature does not verify: not to be believed."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SnpLaunch(_Model):
    vcpus: int = Field(ge=1)
    vcpu_type: str
    measurement: str = Field(pattern=_HEX48)


class TdxLaunch(_Model):
    mrtd: str = Field(pattern=_HEX48)
    rtmr0: str | None = Field(None, pattern=_HEX48)
    rtmr1: str | None = Field(None, pattern=_HEX48)
    rtmr2: str | None = Field(None, pattern=_HEX48)


class GpuState(_Model):
    driver_versions: tuple[str, ...] = ()
    vbios_versions: tuple[str, ...] = ()


class Published(_Model):
    format: str = Field(pattern=f"^{FORMAT}$")
    version: str = Field(min_length=1)
    image_digest: str = Field(pattern=_DIGEST)
    model_weights_digest: str = Field(pattern=_DIGEST)
    kernel_cmdline: str
    firmware: dict[str, str] = Field(default_factory=dict)
    #: The SNP guest policy the release is launched with (hex): the report must carry it.
    guest_policy: str | None = Field(None, pattern=_HEX_INT)
    #: The VMM the SNP launch digests were computed for (its initial vCPU state).
    vmm_type: Literal["QEMU", "ec2", "gce"] | None = None
    #: The VMSA SEV_FEATURES the SNP launch digests were computed with (hex).
    guest_features: str | None = Field(None, pattern=_HEX_INT)
    snp: tuple[SnpLaunch, ...] = ()
    tdx: tuple[TdxLaunch, ...] = ()
    gpu: GpuState | None = None


def read_public_key(path: Path | str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(Path(path).read_text().strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (OSError, ValueError, binascii.Error) as exc:
        raise PublishedError(
            f"release key {path}: not a base64 Ed25519 public key ({exc})"
        ) from None


def sign_published(data: bytes, key: Ed25519PrivateKey) -> str:
    """The detached signature line for a published file's exact bytes."""
    return base64.b64encode(key.sign(data)).decode("ascii") + "\n"


def load_published(
    path: Path | str, key: Ed25519PublicKey, signature: Path | str | None = None
) -> Published:
    """The published file, only if its detached signature (``<path>.sig``) verifies."""
    path = Path(path)
    sig_path = Path(signature) if signature is not None else path.with_name(path.name + ".sig")
    try:
        data = path.read_bytes()
        sig = base64.b64decode(sig_path.read_text().strip(), validate=True)
    except (OSError, ValueError, binascii.Error) as exc:
        raise PublishedError(f"published {path}: {exc}") from None
    try:
        key.verify(sig, data)
    except InvalidSignature:
        raise SignatureMismatch(
            f"published {path}: the signature {sig_path} does not verify with the release key"
        ) from None
    try:
        return Published.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise PublishedError(f"published {path}: {where}: {first['msg']}") from None


def check_published(verdict: Verdict, published: Published) -> Verdict:
    """Is what the evidence measured among what the release promised?"""
    facts = verdict.facts
    name = f"published.{verdict.kind}"
    if verdict.kind == "snp":
        measured = facts.get("measurement")
        promised = [p for p in published.snp if p.measurement == measured]
        detail = (
            f"measurement matches {published.version} ({promised[0].vcpus} × "
            f"{promised[0].vcpu_type})"
            if promised
            else f"measurement {measured} is not one {published.version} publishes"
        )
        verdict.add(name, bool(promised), detail)
        if published.guest_policy is not None:
            _check_guest_policy(verdict, published, facts.get("policy"))
    elif verdict.kind == "tdx":
        match = [
            p
            for p in published.tdx
            if p.mrtd == facts.get("mrtd")
            and all(
                getattr(p, r) is None or getattr(p, r) == facts.get(r)
                for r in ("rtmr0", "rtmr1", "rtmr2")
            )
        ]
        verdict.add(
            name,
            bool(match),
            f"MRTD and RTMRs match {published.version}"
            if match
            else f"MRTD {facts.get('mrtd')} (with its RTMRs) is not one {published.version} publishes",
        )
    elif verdict.kind == "nvidia":
        gpu = published.gpu
        if gpu is None:
            verdict.add(name, None, f"{published.version} publishes no GPU state")
            return verdict
        driver, vbios = facts.get("driver_version"), facts.get("vbios_version")
        ok = (not gpu.driver_versions or driver in gpu.driver_versions) and (
            not gpu.vbios_versions or vbios in gpu.vbios_versions
        )
        verdict.add(
            name, ok, f"driver {driver}, VBIOS {vbios}: " + ("published" if ok else "not published")
        )
    return verdict


def _check_guest_policy(verdict: Verdict, published: Published, reported: object) -> None:
    """The report's guest policy is exactly the published one: the launch digest does not
    cover the policy (the VMM chooses it), so a looser one (debug, a migration agent, an
    older ABI) would otherwise pass with a published measurement."""
    promised = int(published.guest_policy or "0", 16)
    try:
        policy = int(str(reported), 16)
    except ValueError:
        verdict.add(
            "published.guest_policy", False, f"the report's policy {reported!r} is not read"
        )
        return
    same = policy == promised
    verdict.add(
        "published.guest_policy",
        same,
        f"guest policy {policy:#x} is the one {published.version} publishes"
        if same
        else f"guest policy {policy:#x}, {published.version} publishes {promised:#x}",
    )
