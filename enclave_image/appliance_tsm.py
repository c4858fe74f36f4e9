"""The appliance's attestation evidence through the kernel's configfs-tsm report interface.

Linux (6.7 and later, ``CONFIG_TSM_REPORTS``) gives one interface for every TEE's report:
``mkdir`` an entry under ``/sys/kernel/config/tsm/report``, write the 64 bytes of
``report_data`` to its ``inblob``, read the signed report from ``outblob`` and, for SEV-SNP,
the host's certificate table from ``auxblob``; ``provider`` names the guest driver
(``sev_guest``, ``tdx_guest``) and ``generation`` counts the writes, so a reader can tell
that the entry was not rewritten while it read (``Documentation/ABI/testing/configfs-tsm``).
The same code then serves an SEV-SNP guest and a TDX guest. Where the interface is absent
(an older kernel, configfs not mounted), an SEV-SNP guest falls back to the
``SNP_GET_REPORT`` ioctl on ``/dev/sev-guest`` (``appliance_tee``), which has no
certificate table.

The file operations go through :class:`ReportFiles`, so a test can stand a double in for
the kernel's side (there is no TEE here); the appliance uses the real files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from enclave_image.appliance_tee import SNP_REPORT_SIZE, TeeError, snp_report

__all__ = [
    "TSM_REPORTS",
    "Collected",
    "Configfs",
    "NoProvider",
    "ReportFiles",
    "collect_evidence",
    "tsm_report",
]

#: Where the kernel mounts the interface once configfs is mounted at /sys/kernel/config.
TSM_REPORTS = Path("/sys/kernel/config/tsm/report")
#: The guest drivers this appliance knows, and the record's name for their evidence.
PROVIDERS: dict[str, Literal["sev-snp", "tdx"]] = {"sev_guest": "sev-snp", "tdx_guest": "tdx"}
#: Bounds on what the kernel hands back: an SNP report is 1184 bytes, a TDX quote a few
#: KiB, a certificate table (VCEK, ASK, ARK) a few KiB; anything past this is not evidence.
MAX_BLOB = 1 << 20


class NoProvider(TeeError):
    """The interface is there (the ``tsm`` module loaded) but no guest driver serves it: not
    a TEE guest, or its driver did not load."""


class ReportFiles(Protocol):
    """The four operations an entry needs; the kernel's configfs does the work behind them."""

    def mkdir(self, entry: Path) -> None: ...
    def write(self, path: Path, data: bytes) -> None: ...
    def read(self, path: Path) -> bytes: ...
    def rmdir(self, entry: Path) -> None: ...


class Configfs:
    """The real files: an entry's attributes appear when the kernel creates it."""

    def mkdir(self, entry: Path) -> None:
        entry.mkdir()

    def write(self, path: Path, data: bytes) -> None:
        path.write_bytes(data)

    def read(self, path: Path) -> bytes:
        with path.open("rb") as f:
            return f.read(MAX_BLOB + 1)

    def rmdir(self, entry: Path) -> None:
        entry.rmdir()


@dataclass(frozen=True)
class Collected:
    """Evidence as the TEE gave it, and how it was asked for."""

    kind: Literal["sev-snp", "tdx"]
    report: bytes  # SNP: the 1184-byte report; TDX: the quote
    aux: bytes  # SNP through configfs-tsm: the host's certificate table (may be empty)
    via: Literal["configfs-tsm", "sev-guest ioctl"]


def _blob(files: ReportFiles, path: Path, *, optional: bool = False) -> bytes:
    try:
        data = files.read(path)
    except OSError as exc:
        if optional:  # no certificate table from this host: the report still stands
            return b""
        raise TeeError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BLOB:
        raise TeeError(f"{path} is larger than {MAX_BLOB} bytes")
    return data


def _generation(files: ReportFiles, entry: Path) -> int:
    text = _blob(files, entry / "generation").decode("ascii", "replace").strip()
    if not text.isdigit():
        raise TeeError(f"{entry / 'generation'}: {text!r} is not a count")
    return int(text)


def tsm_report(
    report_data: bytes, *, reports: Path = TSM_REPORTS, files: ReportFiles | None = None
) -> Collected:
    """A report carrying ``report_data`` (64 bytes) from whichever guest driver serves the
    interface; ``TeeError`` when it cannot be had, or the entry changed while it was read."""
    if len(report_data) != 64:
        raise ValueError("report_data must be 64 bytes")
    files = files or Configfs()
    entry = reports / f"affidavit-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        files.mkdir(entry)
    except OSError as exc:
        raise TeeError(f"cannot create a report entry in {reports}: {exc.strerror}") from None
    try:
        files.write(entry / "inblob", report_data)
        before = _generation(files, entry)
        try:
            provider = _blob(files, entry / "provider").decode("ascii", "replace").strip()
        except TeeError as exc:
            raise NoProvider(f"no TEE guest driver serves {reports}: {exc}") from None
        if not provider:
            raise NoProvider(f"no TEE guest driver serves {reports}")
        report = _blob(files, entry / "outblob")
        aux = _blob(files, entry / "auxblob", optional=True)
        after = _generation(files, entry)
    finally:
        # the kernel keeps nothing secret in it: a leftover entry is only clutter
        with contextlib.suppress(OSError):
            files.rmdir(entry)
    if before != after:
        raise TeeError(f"{entry} was written while it was read (generation {before} → {after})")
    kind = PROVIDERS.get(provider)
    if kind is None:
        raise TeeError(f"configfs-tsm provider {provider!r} is not one this appliance knows")
    if kind == "sev-snp" and len(report) != SNP_REPORT_SIZE:
        raise TeeError(f"{provider}: a report of {len(report)} bytes, not {SNP_REPORT_SIZE}")
    if not report:
        raise TeeError(f"{provider}: an empty report")
    return Collected(kind, report, aux, "configfs-tsm")


def collect_evidence(
    report_data: bytes,
    *,
    reports: Path = TSM_REPORTS,
    sev_guest: Path = Path("/dev/sev-guest"),
    files: ReportFiles | None = None,
) -> Collected | None:
    """The boot evidence: through configfs-tsm where the kernel offers it, else through
    ``/dev/sev-guest``; ``None`` when this guest has neither (no TEE)."""
    if reports.is_dir():
        try:
            return tsm_report(report_data, reports=reports, files=files)
        except NoProvider:
            pass  # the interface without a driver behind it: try the device
    if sev_guest.exists():
        return Collected("sev-snp", snp_report(sev_guest, report_data), b"", "sev-guest ioctl")
    return None
