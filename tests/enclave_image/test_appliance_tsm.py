"""enclave_image.appliance_tsm: boot evidence through configfs-tsm, else ``/dev/sev-guest``.

There is no TEE here, so the kernel's side of the interface is a test double
(``ConfigfsTsmDouble``): it keeps each entry's attributes as the kernel does (``generation``
counts the writes, ``outblob`` is made when read, from what ``inblob`` holds) and answers
with a report signed by the test double of AMD's chain, and the host's certificate table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attestation.snp import parse_report
from attestation.snp_cert_table import build_cert_table, read_cert_table
from enclave_image.appliance_tee import TeeError
from enclave_image.appliance_tsm import MAX_BLOB, Collected, collect_evidence, tsm_report
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report


class ConfigfsTsmDouble:
    """The kernel's configfs-tsm, standing in for a TEE guest driver (``provider``)."""

    def __init__(
        self,
        provider: str | None,
        make: Callable[[bytes], bytes],
        aux: bytes | None = b"",
    ) -> None:
        self.provider, self.make, self.aux = provider, make, aux
        self.entries: dict[Path, tuple[int, bytes]] = {}  # entry: (generation, inblob)
        self.created: list[Path] = []
        self.on_read: Callable[[Path, str], None] = lambda entry, name: None

    def mkdir(self, entry: Path) -> None:
        if entry in self.entries:
            raise FileExistsError(17, "File exists")
        self.entries[entry] = (0, b"")
        self.created.append(entry)

    def write(self, path: Path, data: bytes) -> None:
        generation, inblob = self.entries[path.parent]
        self.entries[path.parent] = (generation + 1, data if path.name == "inblob" else inblob)

    def read(self, path: Path) -> bytes:
        self.on_read(path.parent, path.name)
        generation, inblob = self.entries[path.parent]
        if path.name == "generation":
            return b"%d\n" % generation
        if self.provider is None:
            raise OSError(6, "No such device or address")  # ENXIO: no guest driver
        if path.name == "provider":
            return f"{self.provider}\n".encode()
        if path.name == "outblob":
            return self.make(inblob)
        if path.name == "auxblob":
            if self.aux is None:
                raise OSError(95, "Operation not supported")
            return self.aux
        raise FileNotFoundError(2, "No such file or directory")

    def rmdir(self, entry: Path) -> None:
        del self.entries[entry]


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _reports(tmp_path: Path) -> Path:
    reports = tmp_path / "tsm" / "report"
    reports.mkdir(parents=True)
    return reports


def test_an_snp_report_and_the_hosts_certificates_through_configfs_tsm(
    amd: FakeAmd, tmp_path: Path
) -> None:
    table = build_cert_table([("vcek", amd.vek)])
    double = ConfigfsTsmDouble(
        "sev_guest",
        lambda data: v5_report(amd.vek_key, report_data=data),
        table,
    )
    data = bytes(range(64))

    got = collect_evidence(
        data, reports=_reports(tmp_path), sev_guest=tmp_path / "absent", files=double
    )

    assert got is not None
    assert (got.kind, got.via) == ("sev-snp", "configfs-tsm")
    assert bytes(parse_report(got.report).report_data) == data  # what inblob carried
    assert [c.name for c in read_cert_table(got.aux)] == ["vcek"]
    assert double.entries == {}  # the entry is removed again
    [entry] = double.created
    assert entry.parent == tmp_path / "tsm" / "report"


def test_a_tdx_guest_through_the_same_interface(tmp_path: Path) -> None:
    quote = b"\x04\x00\x02\x00" + bytes(600)
    double = ConfigfsTsmDouble("tdx_guest", lambda data: quote + data, aux=None)

    got = tsm_report(bytes(64), reports=_reports(tmp_path), files=double)

    assert got == Collected("tdx", quote + bytes(64), b"", "configfs-tsm")


def test_a_report_rewritten_while_it_was_read_is_refused(amd: FakeAmd, tmp_path: Path) -> None:
    double = ConfigfsTsmDouble("sev_guest", lambda data: v5_report(amd.vek_key, report_data=data))

    def meddle(entry: Path, name: str) -> None:
        if name == "outblob":  # another writer of the same entry, between our two reads
            double.write(entry / "inblob", bytes(64))

    double.on_read = meddle
    with pytest.raises(TeeError, match=r"was written while it was read \(generation 1 → 2\)"):
        tsm_report(bytes(range(64)), reports=_reports(tmp_path), files=double)
    assert double.entries == {}


@pytest.mark.parametrize(
    ("provider", "blob", "message"),
    [
        ("sev_guest", bytes(1000), "sev_guest: a report of 1000 bytes, not 1184"),
        ("sev_guest", bytes(MAX_BLOB + 1), "outblob is larger than 1048576 bytes"),
        ("tdx_guest", b"", "tdx_guest: an empty report"),
        ("arm_cca_guest", b"x", "configfs-tsm provider 'arm_cca_guest' is not one this"),
    ],
)
def test_what_a_driver_hands_back_is_bounded_and_named(
    provider: str, blob: bytes, message: str, tmp_path: Path
) -> None:
    double = ConfigfsTsmDouble(provider, lambda data: blob)
    with pytest.raises(TeeError, match=message):
        tsm_report(bytes(64), reports=_reports(tmp_path), files=double)


def test_the_interface_without_a_driver_falls_back_to_the_device(tmp_path: Path) -> None:
    """A kernel that loaded ``tsm`` but no guest driver (a VM without a TEE): the device
    path is tried next; with no device either, there is nothing to collect."""
    double = ConfigfsTsmDouble(None, lambda data: b"")
    reports = _reports(tmp_path)
    assert (
        collect_evidence(bytes(64), reports=reports, sev_guest=tmp_path / "no", files=double)
        is None
    )
    assert double.entries == {} and len(double.created) == 1
    # no configfs-tsm at all and no device: nothing asked of either
    assert collect_evidence(bytes(64), reports=tmp_path / "none", sev_guest=tmp_path / "no") is None


def test_the_device_is_asked_when_configfs_tsm_is_absent(tmp_path: Path) -> None:
    """``/dev/sev-guest`` as a plain file: the SNP_GET_REPORT ioctl is made on it and fails
    as it does on anything that is not the driver, naming the ioctl."""
    device = tmp_path / "sev-guest"
    device.write_bytes(b"")
    with pytest.raises(TeeError, match=r"SNP_GET_REPORT on .*sev-guest failed"):
        collect_evidence(bytes(64), reports=tmp_path / "none", sev_guest=device)


def test_report_data_must_be_64_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="64 bytes"):
        tsm_report(
            bytes(32), reports=_reports(tmp_path), files=ConfigfsTsmDouble("sev_guest", bytes)
        )
