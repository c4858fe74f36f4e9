"""attestation.snp_cert_table: the certificates a host hands an SEV-SNP guest beside its report
(configfs-tsm's ``auxblob``), read into the chain ``attest verify`` and ``bind-check`` take.
The chain is the test double of AMD's (``snp_double``): real certificates, real signatures."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.certs import load_certs
from attestation.snp import verify_snp
from attestation.snp_cert_table import (
    GUIDS,
    MAX_ROWS,
    CertTableError,
    TableCert,
    build_cert_table,
    chain_pem,
    read_cert_table,
)
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd, v5_report

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _ders(pem: bytes) -> list[bytes]:
    return [c.public_bytes(Encoding.DER) for c in load_certs(pem)]


def test_the_guids_are_the_ghcb_specifications() -> None:
    assert {str(g): n for g, n in GUIDS.items()} == {
        "63da758d-e664-4564-adc5-f4b93be8accd": "vcek",
        "a8074bc2-a25a-483e-aae6-39c045a0b8a1": "vlek",
        "4ab7b379-bbac-4fe4-a02f-05aef327c782": "ask",
        "c0b406a4-a803-4952-9743-3fb6014cd0ae": "ark",
    }


def test_a_hosts_table_gives_the_chain_a_report_verifies_under() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    ask, ark = _ders(amd.chain)
    # a host may list them in any order; the GUIDs say which is which
    table = build_cert_table([("ark", ark), ("vcek", amd.vek), ("ask", ask)])
    # the table's first row: the ARK's GUID (mixed-endian, as UEFI writes GUIDs), offset, length
    assert table[:16] == uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae").bytes_le
    assert int.from_bytes(table[16:20], "little") == 4 * 24  # three rows and the zero row
    assert int.from_bytes(table[20:24], "little") == len(ark)

    certs = read_cert_table(table)

    assert [(c.name, c.der) for c in certs] == [("ark", ark), ("vcek", amd.vek), ("ask", ask)]
    vcek, *rest = load_certs(chain_pem(certs))  # VCEK first, then ASK, ARK
    assert vcek.public_bytes(Encoding.DER) == amd.vek
    assert [c.public_bytes(Encoding.DER) for c in rest] == [ask, ark]
    chain = b"".join(c.public_bytes(Encoding.PEM) for c in rest)
    report = v5_report(amd.vek_key)
    verdict = verify_snp(report, amd.vek, chain, now=NOW, trusted_roots=amd.roots)
    assert verdict.accepted, [c.line() for c in verdict.failed]


@pytest.mark.parametrize("table", [b"", bytes(10), bytes(24), bytes(4096)])
def test_no_certificates_from_the_host(table: bytes) -> None:
    assert read_cert_table(table) == []


def test_a_row_this_code_does_not_know_is_kept_by_its_guid() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    table = bytearray(build_cert_table([("vcek", amd.vek)]))
    other = uuid.UUID("11111111-2222-3333-4444-555555555555")
    table[:16] = other.bytes_le
    [cert] = read_cert_table(bytes(table))
    assert cert.name == str(other) and cert.der == amd.vek


def _bad(table: bytes) -> str:
    with pytest.raises(CertTableError) as info:
        read_cert_table(table)
    return str(info.value)


def test_a_table_that_lies_about_its_certificates_is_refused_naming_the_row() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    good = build_cert_table([("vcek", amd.vek), ("ask", _ders(amd.chain)[0])])

    def row(n: int, offset: int, length: int) -> bytes:
        table = bytearray(good)
        table[n * 24 + 16 : n * 24 + 24] = offset.to_bytes(4, "little") + length.to_bytes(
            4, "little"
        )
        return bytes(table)

    past = row(1, len(good) - 10, 11)
    assert _bad(past) == (
        f"row 1 (ask): offset {len(good) - 10} and length 11 are outside the table's"
        f" certificates (bytes 72 to {len(good)})"
    )
    assert _bad(row(0, 0, 10)).startswith("row 0 (vcek): offset 0 and length 10 are outside")
    assert _bad(row(0, 3 * 24 - 1, 10)).startswith("row 0 (vcek): offset 71 ")  # into the rows
    assert _bad(row(0, 3 * 24, 0)).startswith("row 0 (vcek): offset 72 and length 0 ")
    # the offset right at the certificates, a length one byte short: not a certificate
    assert _bad(row(0, 3 * 24, len(amd.vek) - 1)).startswith(
        "row 0 (vcek) is not a DER certificate: "
    )
    # the rows never end
    assert _bad(good[:24]) == "row 1 runs past the table's 24 bytes"
    endless = bytearray(good[:24] * (MAX_ROWS + 1) + amd.vek)
    for n in range(MAX_ROWS + 1):
        endless[n * 24 + 16 : n * 24 + 20] = ((MAX_ROWS + 1) * 24).to_bytes(4, "little")
    assert _bad(bytes(endless)) == f"no terminating row within {MAX_ROWS} rows"


def test_exactly_the_most_rows_a_table_may_have() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    table = build_cert_table([("vcek", amd.vek)] * MAX_ROWS)
    assert len(read_cert_table(table)) == MAX_ROWS
    assert all(isinstance(x509.load_der_x509_certificate(c.der), x509.Certificate)
               for c in read_cert_table(table)[:1])  # fmt: skip


@pytest.mark.parametrize("table", [b" " * 24, b"X" * 24])
def test_only_nul_bytes_are_an_empty_table(table: bytes) -> None:
    assert _bad(table) == "row 1 runs past the table's 24 bytes"  # a row, never ended


def test_the_chain_is_the_endorsement_key_then_ask_then_ark_whatever_the_row_order() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    ask, ark = _ders(amd.chain)
    other = uuid.UUID("11111111-2222-3333-4444-555555555555")

    def pem(*ders: bytes) -> bytes:
        return b"".join(x509.load_der_x509_certificate(d).public_bytes(Encoding.PEM) for d in ders)

    def chain(*rows: tuple[str, bytes]) -> bytes:
        return chain_pem([TableCert(name, der) for name, der in rows])

    # exactly the PEM blocks, back to back, in the chain's order
    assert chain(("ask", ask), ("vcek", amd.vek), ("ark", ark)) == pem(amd.vek, ask, ark)
    assert chain(("ark", ark), ("ask", ask), ("vlek", amd.vek)) == pem(amd.vek, ask, ark)
    assert chain(("ask", ask), ("vlek", amd.vek)) == pem(amd.vek, ask)
    # a row this code does not know goes last, after the ARK, in its row order
    assert chain((str(other), amd.vek), ("ark", ark), ("ask", ask)) == pem(ask, ark, amd.vek)
