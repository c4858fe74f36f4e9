"""The appliance's TEE: the state disk's key and the attestation report, from ``/dev/sev-guest``.

Both requests are ioctls on the SEV-SNP guest driver, with the structs of the Linux uapi header
``include/uapi/linux/sev-guest.h`` written out in ``ctypes`` (Python has no binding for it):

- ``SNP_GET_DERIVED_KEY``: the AMD-SP derives a key from the chip's VCEK root key, with the
  launch measurement and the guest policy mixed in, so only this image, launched with this
  policy, on this chip gets the same key again: the state disk survives a reboot, and nothing
  else can open it.
- ``SNP_GET_REPORT``: an attestation report carrying our 64-byte ``report_data``.

``test-insecure`` is the key source for test boots under QEMU without a TEE: a fixed, public
key. The word sits on the measured command line, so a production measurement never includes
it, and nothing here ever falls back to it.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Literal

__all__ = [
    "KEY_SOURCES",
    "SNP_GET_DERIVED_KEY",
    "SNP_GET_REPORT",
    "SNP_REPORT_SIZE",
    "TEST_INSECURE_KEY",
    "KeySource",
    "SnpDerivedKeyReq",
    "SnpDerivedKeyResp",
    "SnpGuestRequestIoctl",
    "SnpReportReq",
    "SnpReportResp",
    "TeeError",
    "disk_key",
    "ioc_iowr",
    "snp_derived_key",
    "snp_report",
]

KeySource = Literal["snp", "test-insecure"]
KEY_SOURCES: tuple[KeySource, ...] = ("snp", "test-insecure")

#: The fixed key of ``affidavit.keysource=test-insecure``: public, so a test boot is never
#: confidential; it exists so that QEMU without a TEE can exercise the same disk path.
TEST_INSECURE_KEY = hashlib.sha256(b"affidavit/state-disk/test-insecure/v1").digest()

# -- include/uapi/linux/sev-guest.h ----------------------------------------------------------


class SnpReportReq(ctypes.Structure):
    """``struct snp_report_req``: 96 bytes."""

    _fields_ = [
        ("user_data", ctypes.c_uint8 * 64),
        ("vmpl", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint8 * 28),
    ]


class SnpReportResp(ctypes.Structure):
    """``struct snp_report_resp``: the firmware's MSG_REPORT_RSP in 4000 bytes."""

    _fields_ = [("data", ctypes.c_uint8 * 4000)]


class SnpDerivedKeyReq(ctypes.Structure):
    """``struct snp_derived_key_req``: 32 bytes."""

    _fields_ = [
        ("root_key_select", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
        ("guest_field_select", ctypes.c_uint64),
        ("vmpl", ctypes.c_uint32),
        ("guest_svn", ctypes.c_uint32),
        ("tcb_version", ctypes.c_uint64),
    ]


class SnpDerivedKeyResp(ctypes.Structure):
    """``struct snp_derived_key_resp``: the firmware's MSG_KEY_RSP in 64 bytes."""

    _fields_ = [("data", ctypes.c_uint8 * 64)]


class SnpGuestRequestIoctl(ctypes.Structure):
    """``struct snp_guest_request_ioctl``: 32 bytes on x86-64 (``exitinfo2``: the firmware's
    error in the low 32 bits, the hypervisor's in the high 32)."""

    _fields_ = [
        ("msg_version", ctypes.c_uint8),
        ("req_data", ctypes.c_uint64),
        ("resp_data", ctypes.c_uint64),
        ("exitinfo2", ctypes.c_uint64),
    ]


def ioc_iowr(kind: str, number: int, size: int) -> int:
    """Linux's ``_IOWR(type, nr, size)``: direction 3, size in bits 16-29."""
    return (3 << 30) | (size << 16) | (ord(kind) << 8) | number


SNP_GET_REPORT = ioc_iowr("S", 0x0, ctypes.sizeof(SnpGuestRequestIoctl))
SNP_GET_DERIVED_KEY = ioc_iowr("S", 0x1, ctypes.sizeof(SnpGuestRequestIoctl))

SNP_REPORT_SIZE = 1184  # the ATTESTATION_REPORT structure
_RESP_HEADER = 32  # MSG_*_RSP: status (u32), then size or reserved, then the payload at 32
ROOT_KEY_VCEK = 0
FIELD_GUEST_POLICY = 1 << 0
FIELD_MEASUREMENT = 1 << 3
#: The derived key mixes in the guest policy and the launch measurement, not the TCB version
#: or the SVN: a firmware update must not lose the disk, another image must not open it.
DISK_KEY_FIELDS = FIELD_GUEST_POLICY | FIELD_MEASUREMENT


class TeeError(Exception):
    """The TEE could not give what was asked (the message says which ioctl and why)."""


def _request(device: Path, command: int, req: ctypes.Structure, resp: ctypes.Structure) -> None:
    ioctl = SnpGuestRequestIoctl(
        msg_version=1,
        req_data=ctypes.addressof(req),
        resp_data=ctypes.addressof(resp),
    )
    name = "SNP_GET_REPORT" if command == SNP_GET_REPORT else "SNP_GET_DERIVED_KEY"
    try:
        fd = os.open(device, os.O_RDWR)
    except OSError as exc:
        raise TeeError(f"cannot open {device}: {exc.strerror}") from None
    try:
        fcntl.ioctl(fd, command, ioctl)
    except OSError as exc:
        fw, vmm = ioctl.exitinfo2 & 0xFFFFFFFF, ioctl.exitinfo2 >> 32
        raise TeeError(
            f"{name} on {device} failed: {exc.strerror} (firmware error {fw:#x}, vmm {vmm:#x})"
        ) from None
    finally:
        os.close(fd)


def _status(data: bytes, what: str) -> None:
    status = int.from_bytes(data[:4], "little")
    if status != 0:
        raise TeeError(f"{what}: the AMD-SP answered status {status:#x}")


def snp_derived_key(device: Path) -> bytes:
    """The 32-byte key the AMD-SP derives for this image (VCEK root, measurement, policy)."""
    req = SnpDerivedKeyReq(root_key_select=ROOT_KEY_VCEK, guest_field_select=DISK_KEY_FIELDS)
    resp = SnpDerivedKeyResp()
    _request(device, SNP_GET_DERIVED_KEY, req, resp)
    data = bytes(resp.data)
    _status(data, "SNP_GET_DERIVED_KEY")
    return data[_RESP_HEADER : _RESP_HEADER + 32]


def snp_report(device: Path, report_data: bytes) -> bytes:
    """A signed SNP attestation report (1184 bytes) carrying ``report_data`` (64 bytes)."""
    if len(report_data) != 64:
        raise ValueError("report_data must be 64 bytes")
    req = SnpReportReq()
    ctypes.memmove(req.user_data, report_data, 64)
    resp = SnpReportResp()
    _request(device, SNP_GET_REPORT, req, resp)
    data = bytes(resp.data)
    _status(data, "SNP_GET_REPORT")
    size = int.from_bytes(data[4:8], "little")
    if size != SNP_REPORT_SIZE:
        raise TeeError(f"SNP_GET_REPORT: a report of {size} bytes, not {SNP_REPORT_SIZE}")
    return data[_RESP_HEADER : _RESP_HEADER + size]


def disk_key(source: KeySource, device: Path) -> bytes:
    """The state disk's key from ``source``; ``TeeError`` when the TEE cannot give it."""
    if source == "test-insecure":
        return TEST_INSECURE_KEY
    if not device.exists():
        raise TeeError(f"keysource=snp but {device} does not exist (not an SEV-SNP guest?)")
    return snp_derived_key(device)
