"""NVIDIA reference integrity manifests (``attestation.nvidia_rim``): ``parse_rim`` with
``defusedxml``, then ``verify_rim_signature`` at a fixed time.

Typed error: ``ValueError`` (``RimError``, naming the file and what is wrong).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from attestation.nvidia_rim import DSIG_NS, SHA384_NS, SWID_NS, parse_rim, verify_rim_signature
from fuzz._attestation import NOW

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 40_000
#: The sample RIMs of NVIDIA's nv-local-gpu-verifier wheel, where a test run cached it.
_CACHE = Path(__file__).resolve().parents[1] / ".affidavit" / "test-cache" / "nv-local-gpu-verifier"


def _made() -> bytes:
    """A small RIM of this module's own making (structure only, never signed)."""
    return (
        f'<SoftwareIdentity xmlns="{SWID_NS}" xmlns:h="{SHA384_NS}" name="GH100">'
        '<Meta colloquialVersion="545.00" product="GH100"/><Payload>'
        '<Resource type="Measurement" index="0" active="True" alternatives="1" size="48" '
        f'h:Hash0="{"00" * 48}"/></Payload>'
        f'<Signature xmlns="{DSIG_NS}"><KeyInfo/></Signature></SoftwareIdentity>'
    ).encode()


def seeds() -> list[bytes]:
    found = [_made()]
    for wheel in sorted(_CACHE.glob("*/*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.endswith(".swidtag")]
            found += [archive.read(n) for n in names[:4] if archive.getinfo(n).file_size < MAX_LEN]
    return found


def target(data: bytes) -> None:
    try:
        rim = parse_rim(data, "fuzz.swidtag")
    except ValueError:
        return
    rim.active  # noqa: B018 - a derived field, read for what it might raise
    verify_rim_signature(rim, NOW)
