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


def fake_amd(product: str, tcb: dict[str, int], hwid: bytes) -> FakeAmd:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    ark_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ask_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    vek_key = ec.generate_private_key(ec.SECP384R1())

    def cert(subject: str, issuer: str, key: Any, signer: Any, exts: list[Any]) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(subject))
            .issuer_name(_name(issuer))
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + timedelta(days=3650))
        )
        for ext in exts:
            builder = builder.add_extension(ext, critical=False)
        return builder.sign(signer, hashes.SHA384(), rsa_padding=_PSS)

    ark = cert(f"ARK-{product}", f"ARK-{product}", ark_key.public_key(), ark_key, [])
    ask = cert(f"SEV-{product}", f"ARK-{product}", ask_key.public_key(), ark_key, [])
    oids = {"bl": 1, "tee": 2, "snp": 3, "ucode": 8, "fmc": 9}
    exts = [
        x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.2"), _ia5(product)),
        x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.4"), hwid),
    ] + [
        x509.UnrecognizedExtension(x509.ObjectIdentifier(f"{_AMD}.3.{oids[k]}"), _der_int(v))
        for k, v in tcb.items()
    ]
    vek = cert("SEV-VCEK", f"SEV-{product}", vek_key.public_key(), ask_key, exts)
    return FakeAmd(
        vek_key=vek_key,
        vek=vek.public_bytes(Encoding.DER),
        chain=ask.public_bytes(Encoding.PEM) + ark.public_bytes(Encoding.PEM),
        roots={product: spki_sha256(ark)},
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
    policy: int = 0x30000 | (1 << 19),
) -> bytes:
    """A synthetic version-5 report (a test double): each field a recognisable value, or the
    measurement and report_data given."""
    r = bytearray(REPORT_SIZE)
    struct.pack_into("<IIQ", r, 0x000, 5, 7, policy)  # version, guest_svn, policy
    r[0x010:0x020] = b"F" * 16  # family_id
    r[0x020:0x030] = b"I" * 16  # image_id
    struct.pack_into("<II", r, 0x030, 2, 1)  # vmpl, signature_algo
    tcb = bytes([1, 2, 3, 4, 0, 0, 0, 0x55])  # Turin layout
    r[0x038:0x040] = bytes([1, 2, 3, 4, 0, 0, 0, 0x66])  # current_tcb
    struct.pack_into("<QI", r, 0x040, 0x25, 0b00001)  # platform_info, signer_info (VCEK)
    r[0x050:0x090] = report_data
    r[0x090:0x0C0] = measurement
    r[0x0C0:0x0E0] = b"H" * 32  # host_data
    r[0x0E0:0x110] = b"K" * 48  # id_key_digest
    r[0x110:0x140] = b"A" * 48  # author_key_digest
    r[0x140:0x160] = b"R" * 32  # report_id
    r[0x160:0x180] = b"M" * 32  # report_id_ma
    r[0x180:0x188] = tcb  # reported_tcb
    r[0x188:0x18B] = bytes([cpuid_family, 0x02, 0x01])  # cpuid fam, model, stepping
    r[0x1A0:0x1E0] = CHIP_ID
    r[0x1E0:0x1E8] = bytes([1, 2, 3, 4, 0, 0, 0, 0x60])  # committed_tcb
    r[0x1E8:0x1F0] = bytes([21, 55, 1, 0, 20, 55, 1, 0])  # current b/m/M, committed b/m/M
    r[0x1F0:0x1F8] = bytes([1, 2, 3, 4, 0, 0, 0, 0x50])  # launch_tcb
    struct.pack_into("<QQ", r, 0x1F8, 0x1122334455667788, 0x99AABBCCDDEEFF00)  # mit vectors
    der = key.sign(bytes(r[:SIGNED_SIZE]), ec.ECDSA(hashes.SHA384()))
    sig_r, sig_s = decode_dss_signature(der)
    r[SIGNED_SIZE : SIGNED_SIZE + 72] = sig_r.to_bytes(72, "little")
    r[SIGNED_SIZE + 72 : SIGNED_SIZE + 144] = sig_s.to_bytes(72, "little")
    return bytes(r)
