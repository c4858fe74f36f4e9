"""A test double of AMD's SEV-SNP chain and reports: a throwaway ARK → ASK → VCEK chain
shaped like AMD's (RSA-PSS, a P-384 VCEK with the TCB and hwID extensions) and synthetic
version-5 reports signed by it. Nothing here is AMD's; verifiers accept it only when told to
trust its root (``trusted_roots``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attestation.certs import spki_sha256
from attestation.snp import REPORT_SIZE, SIGNED_SIZE

_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
_AMD = "1.3.6.1.4.1.3704.1"


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test double, not AMD"),
        ]
    )


def _der_int(value: int) -> bytes:
    body = value.to_bytes((value.bit_length() + 8) // 8 or 1, "big")
    return bytes([0x02, len(body)]) + body


def _ia5(text: str) -> bytes:
    return bytes([0x16, len(text)]) + text.encode()


@dataclass(frozen=True)
class FakeAmd:
    """A throwaway ARK → ASK → VCEK chain shaped like AMD's (RSA-PSS, P-384 VCEK)."""

    vek_key: ec.EllipticCurvePrivateKey
    vek: bytes  # DER
    chain: bytes  # PEM: ASK then ARK
    roots: dict[str, str]
    ark_key: rsa.RSAPrivateKey | None = None  # signs the CRLs (``amd_crl``)

    @property
    def ark(self) -> bytes:
        """The ARK alone (PEM): what ``--trusted-root`` takes."""
        return self.chain[self.chain.index(b"-----BEGIN", 1) :]

    def crl(
        self,
        *,
        revoked: tuple[int, ...] = (),
        this_update: datetime = datetime(2025, 5, 1, tzinfo=UTC),
        next_update: datetime = datetime(2025, 7, 1, tzinfo=UTC),
        signer: rsa.RSAPrivateKey | None = None,
        issuer: str | None = None,
        pem: bool = False,
    ) -> bytes:
        """A CRL shaped like AMD's (issued and RSA-PSS-signed by the ARK) listing ``revoked``
        serials; ``signer`` or ``issuer`` another key or name, for the negative tests."""
        assert self.ark_key is not None
        ark = x509.load_pem_x509_certificate(self.ark)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(_name(issuer) if issuer else ark.subject)
            .last_update(this_update)
            .next_update(next_update)
        )
        for serial in revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(this_update)
                .build()
            )
        crl = builder.sign(signer or self.ark_key, hashes.SHA384(), rsa_padding=_PSS)
        return crl.public_bytes(Encoding.PEM if pem else Encoding.DER)

    def serial(self, which: str) -> int:
        """The serial number of the ``ask`` or the ``vek``."""
        if which == "vek":
            return x509.load_der_x509_certificate(self.vek).serial_number
        return x509.load_pem_x509_certificates(self.chain)[0].serial_number


def fake_amd(
    product: str,
    tcb: dict[str, int],
    hwid: bytes | None,
    *,
    vek_curve: ec.EllipticCurve | None = None,
    ask_issuer: str | None = None,
    vek_issuer: str | None = None,
    ark_validity: tuple[datetime, datetime] | None = None,
    vek_cn: str = "SEV-VCEK",
    csp_id: str | None = None,
    ask_pkcs1: bool = False,
    ask_ec: bool = False,
    vek_extensions: dict[str, bytes] | None = None,
    ark_forged: bool = False,
) -> FakeAmd:
    """The chain, well formed unless an option breaks one thing in it (for the negative
    tests): ``vek_curve`` another curve for the VCEK's key (AMD's is P-384); ``ask_issuer``
    or ``vek_issuer`` an issuer name other than the signer's subject, the signature still
    made by the signer's key; ``ark_validity`` the ARK's window (the others keep theirs).
    ``vek_cn`` and ``csp_id`` (a VLEK's cloud provider) make a VLEK of it, with no hwID.
    ``ask_pkcs1``: the ARK signs the ASK with PKCS#1 v1.5, not PSS; ``ask_ec``: the ASK's key
    is an EC key (it signs the VCEK with ECDSA). ``vek_extensions``: more of AMD's extensions
    on the VCEK, as raw values by OID suffix (``"3.1"``: the BOOT_LOADER SVN). ``ark_forged``:
    the ARK carries its key but its self-signature is made by another one."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    ark_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ask_key: Any = (
        ec.generate_private_key(ec.SECP384R1())
        if ask_ec
        else rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    vek_key = ec.generate_private_key(vek_curve or ec.SECP384R1())

    def cert(
        subject: str,
        issuer: str,
        key: Any,
        signer: Any,
        exts: list[Any],
        validity: tuple[datetime, datetime] | None = None,
        pss: bool = True,
    ) -> Any:
        not_before, not_after = validity or (start, start + timedelta(days=3650))
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(subject))
            .issuer_name(_name(issuer))
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
        )
        for ext in exts:
            builder = builder.add_extension(ext, critical=False)
        if not isinstance(signer, rsa.RSAPrivateKey):
            return builder.sign(signer, hashes.SHA384())
        return builder.sign(signer, hashes.SHA384(), rsa_padding=_PSS if pss else None)

    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048) if ark_forged else None
    ark = cert(
        f"ARK-{product}",
        f"ARK-{product}",
        ark_key.public_key(),
        forger or ark_key,
        [],
        ark_validity,
    )
    ask = cert(
        f"SEV-{product}",
        ask_issuer or f"ARK-{product}",
        ask_key.public_key(),
        ark_key,
        [],
        pss=not ask_pkcs1,
    )
    oids = {"bl": 1, "tee": 2, "snp": 3, "ucode": 8, "fmc": 9}
    exts = [x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.2"), _ia5(product))]
    if hwid is not None:  # None: a VCEK without the hwID extension
        exts.append(x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.4"), hwid))
    if csp_id is not None:
        exts.append(x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.5"), _ia5(csp_id)))
    exts += [
        x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.3.{oids[k]}"), _der_int(v))
        for k, v in tcb.items()
    ]
    exts += [
        x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.{suffix}"), value)
        for suffix, value in (vek_extensions or {}).items()
    ]
    vek = cert(vek_cn, vek_issuer or f"SEV-{product}", vek_key.public_key(), ask_key, exts)
    return FakeAmd(
        vek_key=vek_key,
        vek=vek.public_bytes(Encoding.DER),
        chain=ask.public_bytes(Encoding.PEM) + ark.public_bytes(Encoding.PEM),
        roots={product: spki_sha256(ark)},
        ark_key=ark_key,
    )


#: Turin TCB_VERSION: fmc 0, bl 1, tee 2, snp 3, ucode 7 (bytes 4-6 reserved)
TURIN_TCB = {"fmc": 1, "bl": 2, "tee": 3, "snp": 4, "ucode": 0x55}
CHIP_ID = bytes(range(0xA0, 0xA8)) + bytes(56)  # Turin: an 8-byte hwID, CHIP_ID[0:8]


def v5_report(
    key: ec.EllipticCurvePrivateKey,
    *,
    cpuid_family: int = 0x1A,
    measurement: bytes = bytes(range(100, 148)),
    report_data: bytes = bytes(range(64)),
    policy: int = 0x30000,
    chip_id: bytes = CHIP_ID,
    vmpl: int = 0,
    platform_info: int = 0x25,
    host_data: bytes = b"H" * 32,
    id_key_digest: bytes = b"K" * 48,
    author_key_digest: bytes = b"A" * 48,
    firmware: tuple[int, int, int] = (1, 55, 21),
    tcbs: dict[str, bytes] | None = None,
) -> bytes:
    """A synthetic version-5 report (a test double): each field a recognisable value, or the
    one given. Its defaults are what the appliance's own report holds: guest policy 0x30000
    (not debug, no migration agent, ABI 0.0), VMPL 0 (direct boot), firmware 1.55.21.
    ``tcbs`` replaces a TCB_VERSION (``reported``, ``current``, ``committed``, ``launch``) by
    its 8 bytes, Turin layout."""
    r = bytearray(REPORT_SIZE)
    struct.pack_into("<IIQ", r, 0x000, 5, 7, policy)  # version, guest_svn, policy
    r[0x010:0x020] = b"F" * 16  # family_id
    r[0x020:0x030] = b"I" * 16  # image_id
    struct.pack_into("<II", r, 0x030, vmpl, 1)  # vmpl, signature_algo
    tcb = bytes([1, 2, 3, 4, 0, 0, 0, 0x55])  # Turin layout
    r[0x038:0x040] = bytes([1, 2, 3, 4, 0, 0, 0, 0x66])  # current_tcb
    struct.pack_into("<QI", r, 0x040, platform_info, 0b00001)  # signer_info: VCEK
    r[0x050:0x090] = report_data
    r[0x090:0x0C0] = measurement
    r[0x0C0:0x0E0] = host_data
    r[0x0E0:0x110] = id_key_digest
    r[0x110:0x140] = author_key_digest
    r[0x140:0x160] = b"R" * 32  # report_id
    r[0x160:0x180] = b"M" * 32  # report_id_ma
    r[0x180:0x188] = tcb  # reported_tcb
    r[0x188:0x18B] = bytes([cpuid_family, 0x02, 0x01])  # cpuid fam, model, stepping
    r[0x1A0:0x1E0] = chip_id
    r[0x1E0:0x1E8] = bytes([1, 2, 3, 4, 0, 0, 0, 0x60])  # committed_tcb
    major, minor, build = firmware
    r[0x1E8:0x1F0] = bytes([build, minor, major, 0, 20, 55, 1, 0])  # current, committed b/m/M
    r[0x1F0:0x1F8] = bytes([1, 2, 3, 4, 0, 0, 0, 0x50])  # launch_tcb
    offsets = {"current": 0x038, "reported": 0x180, "committed": 0x1E0, "launch": 0x1F0}
    for which, raw in (tcbs or {}).items():
        r[offsets[which] : offsets[which] + 8] = raw
    struct.pack_into("<QQ", r, 0x1F8, 0x1122334455667788, 0x99AABBCCDDEEFF00)  # mit vectors
    der = key.sign(bytes(r[:SIGNED_SIZE]), ec.ECDSA(hashes.SHA384()))
    sig_r, sig_s = decode_dss_signature(der)
    r[SIGNED_SIZE : SIGNED_SIZE + 72] = sig_r.to_bytes(72, "little")
    r[SIGNED_SIZE + 72 : SIGNED_SIZE + 144] = sig_s.to_bytes(72, "little")
    return bytes(r)


def vek_with_extensions(extensions: dict[str, bytes], cn: str | None = "SEV-VCEK") -> bytes:
    """A certificate (DER) carrying AMD's extensions as the raw values given (OID suffix
    after 1.3.6.1.4.1.3704.1, e.g. ``"3.1"`` → value): for the extension parser's tests,
    which read the extensions only (its signer is a throwaway key). ``cn`` None: a subject
    with no common name."""
    key = ec.generate_private_key(ec.SECP384R1())
    start = datetime(2025, 1, 1, tzinfo=UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            _name(cn)
            if cn is not None
            else x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "No CN")])
        )
        .issuer_name(_name("SEV-Test"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=1))
    )
    for suffix, value in extensions.items():
        oid = x509.ObjectIdentifier(f"{_AMD}.{suffix}")
        builder = builder.add_extension(x509.UnrecognizedExtension(oid, value), critical=False)
    return builder.sign(key, hashes.SHA384()).public_bytes(Encoding.DER)
