"""The launch measurement a guest should have: a typed wrapper over ``sev-snp-measure``.

``launch_digest`` computes what the AMD secure processor will record as the guest's launch
digest (SEV-SNP: the 48-byte MEASUREMENT of the attestation report; SEV and SEV-ES: the
32-byte launch digest) from the firmware (OVMF), the directly booted kernel, initrd and
command line, the vCPU count and signature, the VMM and the guest features. The arithmetic is
virtee/sev-snp-measure's (``sevsnpmeasure.guest.calc_launch_digest``), unchanged; this module
only checks the inputs first, the way that tool's command line does, and turns the library's
errors into one ``MeasureError`` that names the input at fault.

It never reads a report and never judges one: compare its result with the ``measurement``
fact of ``attestation.snp.verify_snp`` (or publish it, see ``attestation.published``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

__all__ = ["SEV_MODES", "VMM_TYPES", "MeasureError", "launch_digest", "vcpu_signature"]

Mode = Literal["snp", "seves", "sev"]
Vmm = Literal["QEMU", "ec2", "gce"]
SEV_MODES: tuple[Mode, ...] = ("snp", "seves", "sev")
VMM_TYPES: tuple[Vmm, ...] = ("QEMU", "ec2", "gce")


class MeasureError(ValueError):
    """A launch digest that cannot be computed; the message names the input at fault."""


def _library() -> tuple[Any, Any, Any, Any]:
    # sev-snp-measure ships no type information: its names are Any here, typed at our edge.
    try:
        from sevsnpmeasure import guest, sev_mode, vcpu_types, vmm_types  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - a base dependency
        raise MeasureError(
            f"sev-snp-measure is not installed ({exc}): pip install 'sev-snp-measure>=0.0.13'"
        ) from None
    return guest, sev_mode, vcpu_types, vmm_types


def vcpu_signature(
    *,
    vcpu_type: str | None = None,
    vcpu_sig: int | None = None,
    vcpu_family: int | None = None,
    vcpu_model: int | None = None,
    vcpu_stepping: int | None = None,
) -> int | None:
    """The 32-bit CPUID(1).EAX signature of the guest's vCPUs, from whichever form is given.

    ``vcpu_type`` is a QEMU CPU model name (``EPYC-v4``, ``EPYC-Milan``, …); ``vcpu_family``,
    ``vcpu_model`` and ``vcpu_stepping`` go together. Forms given together must agree.
    None when none is given.
    """
    _, _, vcpu_types, _ = _library()
    known: dict[str, int] = dict(vcpu_types.CPU_SIGS)
    found: dict[str, int] = {}
    if vcpu_type is not None:
        if vcpu_type not in known:
            raise MeasureError(
                f"vcpu_type {vcpu_type!r} is unknown; known types: {', '.join(sorted(known))}"
            )
        found["vcpu_type"] = known[vcpu_type]
    if vcpu_sig is not None:
        if not 0 <= vcpu_sig < 1 << 32:
            raise MeasureError(f"vcpu_sig {vcpu_sig:#x} is not a 32-bit CPUID signature")
        found["vcpu_sig"] = vcpu_sig
    fms = (vcpu_family, vcpu_model, vcpu_stepping)
    if any(v is not None for v in fms):
        if any(v is None for v in fms):
            raise MeasureError("vcpu_family, vcpu_model and vcpu_stepping go together")
        family, model, stepping = (int(v) for v in fms if v is not None)
        if not (0 <= family <= 0xFF + 0xF and 0 <= model <= 0xFF and 0 <= stepping <= 0xF):
            raise MeasureError(
                f"vcpu family/model/stepping {family}/{model}/{stepping} is out of range"
            )
        sig: int = vcpu_types.cpu_sig(family, model, stepping)
        found["vcpu_family/model/stepping"] = sig
    if len(set(found.values())) > 1:
        given = ", ".join(f"{k} → {v:#x}" for k, v in found.items())
        raise MeasureError(f"the vCPU signatures given disagree: {given}")
    return next(iter(found.values()), None)


def _file(path: Path | str | None, name: str) -> str | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise MeasureError(f"{name} {p} is not a file")
    return str(p)


def launch_digest(
    ovmf: Path | str,
    *,
    mode: Mode = "snp",
    vcpus: int | None = None,
    vcpu_type: str | None = None,
    vcpu_sig: int | None = None,
    vcpu_family: int | None = None,
    vcpu_model: int | None = None,
    vcpu_stepping: int | None = None,
    kernel: Path | str | None = None,
    initrd: Path | str | None = None,
    append: str | None = None,
    guest_features: int = 0x1,
    vmm_type: Vmm = "QEMU",
    ovmf_hash: str | None = None,
) -> str:
    """The expected launch digest, lower-case hex (96 digits for SNP, 64 for SEV/SEV-ES).

    Args:
        ovmf: the firmware image the VMM loads (its SEV metadata and footer table are read).
        mode: ``snp`` (SEV-SNP), ``seves`` (SEV-ES) or ``sev``.
        vcpus: the number of vCPUs (required for ``snp`` and ``seves``).
        vcpu_type / vcpu_sig / vcpu_family, vcpu_model, vcpu_stepping: the vCPU signature,
            in any one form (required for QEMU guests in ``snp`` and ``seves``).
        kernel, initrd, append: a directly booted kernel, its initrd and command line
            (measured through OVMF's SEV hashes table; initrd and append need a kernel).
        guest_features: the VMSA SEV_FEATURES value (``0x1``: SNP only; ``0x21``: also
            restricted injection… see sev-snp-measure's README).
        vmm_type: ``QEMU``, ``ec2`` or ``gce`` (their initial vCPU states differ).
        ovmf_hash: SNP only: a precomputed OVMF pages digest (96 hex digits) used instead of
            hashing ``ovmf``'s contents (the file is still read for its metadata).

    Raises:
        MeasureError: an input is missing, malformed or contradicts another, or the firmware
            cannot measure what was asked (e.g. a kernel without a SEV hashes table).
    """
    guest, sev_mode, _, vmm_types = _library()
    if mode not in SEV_MODES:
        raise MeasureError(f"mode {mode!r} is not one of {', '.join(SEV_MODES)}")
    if vmm_type not in VMM_TYPES:
        raise MeasureError(f"vmm_type {vmm_type!r} is not one of {', '.join(VMM_TYPES)}")
    ovmf_path = _file(ovmf, "ovmf")
    kernel_path = _file(kernel, "kernel")
    initrd_path = _file(initrd, "initrd")
    if kernel_path is None and (initrd_path is not None or append):
        raise MeasureError("initrd and append are measured only with a kernel: kernel is missing")
    if mode != "sev" and (vcpus is None or vcpus < 1):
        raise MeasureError(f"vcpus must be a positive count in mode {mode!r}, got {vcpus}")
    if guest_features < 0 or guest_features >= 1 << 64:
        raise MeasureError(f"guest_features {guest_features:#x} is not a 64-bit value")
    if ovmf_hash is not None:
        if mode != "snp":
            raise MeasureError(f"ovmf_hash is for mode 'snp' only, not {mode!r}")
        if not re.fullmatch(r"[0-9a-fA-F]{96}", ovmf_hash):
            raise MeasureError("ovmf_hash must be 96 hex digits (a SHA-384 digest)")
    sig = vcpu_signature(
        vcpu_type=vcpu_type,
        vcpu_sig=vcpu_sig,
        vcpu_family=vcpu_family,
        vcpu_model=vcpu_model,
        vcpu_stepping=vcpu_stepping,
    )
    missing_sig = mode != "sev" and sig is None and vmm_type == "QEMU"
    modes = {"snp": "SEV_SNP", "seves": "SEV_ES", "sev": "SEV"}
    try:
        digest: bytes = guest.calc_launch_digest(
            getattr(sev_mode.SevMode, modes[mode]),
            vcpus or 0,
            # SEV measures no VMSA; with the signature missing, run with 0 all the same, so a
            # firmware or kernel error (which sev-snp-measure finds first) is the one reported
            0 if mode == "sev" or missing_sig else sig,
            ovmf_path,
            kernel_path,
            initrd_path,
            append if append is not None else "",
            guest_features,
            ovmf_hash or "",
            vmm_types.VMMType[vmm_type],
        )
    except (RuntimeError, ValueError, KeyError, AssertionError, OSError) as exc:
        message = str(exc) or type(exc).__name__
        if "Kernel specified" in message:
            raise MeasureError(
                f"kernel given, but the firmware {ovmf_path} cannot measure it: {message}"
            ) from None
        raise MeasureError(f"ovmf {ovmf_path}: cannot be measured: {message}") from None
    if missing_sig:
        raise MeasureError(
            f"a QEMU guest in mode {mode!r} needs its vCPU signature: "
            "vcpu_type, vcpu_sig or vcpu_family/vcpu_model/vcpu_stepping"
        )
    return digest.hex()
