"""NVIDIA reference integrity manifests (RIMs): the GPU's expected measurements, checked offline.

A RIM is a SWID tag (ISO/IEC 19770-2, TCG RIM information model) that NVIDIA signs with an
enveloped XML-DSig signature (ECDSA P-384/SHA-384, C14N 1.1) carrying its certificate chain
in ``KeyInfo``. One RIM describes a driver release (``Meta/@colloquialVersion`` such as
``545.00``) or a VBIOS (``96.00.5E.00.01``); its ``Payload`` lists one ``Resource`` per
measurement index, each ``active`` or not, with ``alternatives`` SHA-384 values
(``Hash0``, ``Hash1``, … in the xmlenc#sha384 namespace). RIM index *i* is the SPDM
measurement block *i + 1* (NVIDIA's verifier numbers the blocks from 0).

The file is hostile input until its signature verifies: it is parsed with ``defusedxml`` (no
DTD, no entity expansion), the signature is checked with ``signxml`` against the embedded
leaf certificate, and the values compared are read from what ``signxml`` returns as signed,
never from the unverified tree. ``signxml``'s own chain check is not used: it holds chains to
the web PKI's rules (``cryptography``'s verifier), which NVIDIA's CoRIM root breaks (it
encodes its 2053 expiry as GeneralizedTime). The chain is walked here instead, as for the
GPU's device chain: each certificate signed by the next, every issuer a CA, all valid at the
verification time, ending at NVIDIA's pinned CoRIM signing root. A caller may name another root
(``trusted_root_spki``) for RIMs signed by a test chain; the command line never does.
"""

from __future__ import annotations

import base64
import binascii
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import defusedxml.ElementTree as DET
from cryptography import x509
from defusedxml import DefusedXmlException
from lxml.etree import LxmlError
from signxml.exceptions import SignXMLException
from signxml.verifier import SignatureConfiguration, VerifyResult, XMLVerifier

from attestation.certs import load_certs, spki_sha256

# the same chain walk as the GPU's device chain (nvidia.py imports this module only lazily)
from attestation.nvidia_chain import build_chain, cert_name, pick_leaf, self_signed
from attestation.verdict import Verdict

__all__ = [
    "NVIDIA_RIM_ROOT_SPKI_SHA256",
    "ReferenceMeasurement",
    "Rim",
    "RimError",
    "RimKind",
    "RimSignature",
    "check_rims",
    "parse_rim",
    "verify_rim_signature",
]

#: SHA-256 of the SubjectPublicKeyInfo (DER) of "CN=NVIDIA CoRIM signing Root CA, O=NVIDIA,
#: C=US", the self-signed ECDSA P-384 root of every RIM signing chain (valid 2023-03-16 to
#: 2053-03-08). Derived from ``verifier/certs/verifier_RIM_root.pem`` in NVIDIA's
#: ``nv-local-gpu-verifier`` package (2.7.3), the same file as
#: https://github.com/NVIDIA/nvtrust/blob/main/guest_tools/gpu_verifiers/local_gpu_verifier/src/verifier/certs/verifier_RIM_root.pem
#: (SHA-256 afe8d01ab79b451fc6401a00bd8d3cba283e67339bd902e14bb41171eacb99d1; last changed in
#: nvtrust commit 08a50685e45b0c050274d35f3d1eff884ea0708e).
NVIDIA_RIM_ROOT_SPKI_SHA256 = "dec1dc316477aa851eebdf51327ae9f864bc8d89254657ed1e7eb9168af1e1a3"

SWID_NS = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
SHA384_NS = "http://www.w3.org/2001/04/xmlenc#sha384"
DSIG_NS = "http://www.w3.org/2000/09/xmldsig#"
#: The measurement index NVIDIA's verifier leaves out when the GPU reports NVDEC0 disabled.
NVDEC0_INDEX = 35
NVDEC0_DISABLED = b"\x55"
_VBIOS_VERSION = re.compile(r"^[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}$")

RimKind = Literal["driver", "vbios"]


class RimError(ValueError):
    """A RIM file that cannot be read as one, naming the file and what is wrong."""


@dataclass(frozen=True)
class ReferenceMeasurement:
    """One ``Resource``: the values measurement ``index`` may take (when ``active``)."""

    index: int
    active: bool
    alternatives: tuple[bytes, ...]
    size: int
    name: str


@dataclass(frozen=True)
class Rim:
    """A parsed RIM; ``source`` names where it came from (the file, in messages)."""

    source: str
    kind: RimKind
    version: str  # Meta/@colloquialVersion
    product: str  # Meta/@product, e.g. GH100
    measurements: tuple[ReferenceMeasurement, ...]
    certificates: tuple[x509.Certificate, ...]  # KeyInfo's chain, as embedded (unverified)
    raw: bytes

    @property
    def active(self) -> dict[int, ReferenceMeasurement]:
        return {m.index: m for m in self.measurements if m.active}


@dataclass(frozen=True)
class RimSignature:
    """The outcome of checking one RIM's signature; ``signed`` is the RIM as signed."""

    ok: bool
    detail: str
    signed: Rim | None


def _child(parent: ET.Element, tag: str, source: str) -> ET.Element:
    found = parent.find(f"{{{SWID_NS}}}{tag}")
    if found is None:
        raise RimError(f"{source}: no {tag} element in the SWID tag")
    return found


def _measurement(element: ET.Element, source: str) -> ReferenceMeasurement:
    attrs = element.attrib
    where = f"{source}: Resource {attrs.get('name') or attrs.get('index', '?')}"
    try:
        index, count, size = int(attrs["index"]), int(attrs["alternatives"]), int(attrs["size"])
    except KeyError as exc:
        raise RimError(f"{where}: no {exc.args[0]} attribute") from None
    except ValueError as exc:
        raise RimError(f"{where}: {exc}") from None
    if attrs.get("active") not in ("True", "False"):
        raise RimError(f"{where}: active is {attrs.get('active')!r}, not True or False")
    if count < 1 or index < 0:
        raise RimError(f"{where}: index {index} with {count} alternatives")
    values: list[bytes] = []
    for n in range(count):
        text = attrs.get(f"{{{SHA384_NS}}}Hash{n}")
        if text is None:
            raise RimError(f"{where}: alternatives is {count} but Hash{n} is missing")
        try:
            values.append(bytes.fromhex(text))
        except ValueError:
            raise RimError(f"{where}: Hash{n} is not hex") from None
    return ReferenceMeasurement(
        index, attrs["active"] == "True", tuple(values), size, attrs.get("name", "")
    )


def _certificates(root: ET.Element, source: str) -> tuple[x509.Certificate, ...]:
    found = root.findall(
        f"{{{DSIG_NS}}}Signature/{{{DSIG_NS}}}KeyInfo//{{{DSIG_NS}}}X509Certificate"
    )
    certs: list[x509.Certificate] = []
    for n, element in enumerate(found):
        try:
            der = base64.b64decode("".join((element.text or "").split()), validate=True)
            certs.extend(load_certs(der))
        except (binascii.Error, ValueError) as exc:
            raise RimError(f"{source}: KeyInfo certificate {n + 1} does not parse: {exc}") from None
    return tuple(certs)


def parse_rim(data: bytes, source: str) -> Rim:
    """Read a RIM (no DTD, no entities); ``RimError`` names ``source`` and what is wrong.

    Nothing read here is trusted: ``verify_rim_signature`` returns the signed RIM.
    """
    try:
        root = DET.fromstring(data, forbid_dtd=True)
    except (ET.ParseError, DefusedXmlException, ValueError) as exc:
        raise RimError(f"{source}: not an XML RIM: {exc}") from None
    if root.tag != f"{{{SWID_NS}}}SoftwareIdentity":
        raise RimError(f"{source}: the root element is {root.tag}, not a SWID SoftwareIdentity")
    meta = _child(root, "Meta", source)
    version = meta.get("colloquialVersion")
    if not version:
        raise RimError(f"{source}: Meta has no colloquialVersion")
    payload = _child(root, "Payload", source)
    measurements = tuple(
        _measurement(r, source)
        for r in payload.findall(f"{{{SWID_NS}}}Resource")
        if r.get("type") == "Measurement"
    )
    indexes = [m.index for m in measurements]
    if len(set(indexes)) != len(indexes):
        twice = sorted({i for i in indexes if indexes.count(i) > 1})
        raise RimError(f"{source}: measurement index {twice[0]} appears twice")
    kind: RimKind = "vbios" if _VBIOS_VERSION.match(version) else "driver"
    return Rim(
        source,
        kind,
        version,
        meta.get("product", ""),
        measurements,
        _certificates(root, source),
        bytes(data),
    )


def _chain(
    rim: Rim, now: datetime, trusted_root_spki: str
) -> tuple[x509.Certificate | None, str | None, str]:
    """The signing leaf, what is wrong with its chain (None: nothing), and the path's names."""
    if not rim.certificates:
        return None, "KeyInfo carries no X509Certificate", ""
    leaf = pick_leaf(list(rim.certificates))
    path, problem = build_chain(leaf, list(rim.certificates), None)
    names = " → ".join(cert_name(c) for c in path)
    if problem is not None:
        return leaf, problem, names
    top = path[-1]
    if not self_signed(top) or spki_sha256(top) != trusted_root_spki:
        pinned = trusted_root_spki == NVIDIA_RIM_ROOT_SPKI_SHA256
        return (
            leaf,
            (
                f"the chain ends at {cert_name(top)} (SPKI SHA-256 {spki_sha256(top)}), not at the "
                + ("pinned NVIDIA CoRIM signing Root CA" if pinned else "trusted RIM root")
                + f" ({trusted_root_spki})"
            ),
            names,
        )
    expired = [
        f"{cert_name(c)} (valid {c.not_valid_before_utc:%Y-%m-%d} to {c.not_valid_after_utc:%Y-%m-%d})"
        for c in path
        if not c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]
    if expired:
        return leaf, f"not valid at {now:%Y-%m-%dT%H:%M:%SZ}: " + ", ".join(expired), names
    return leaf, None, names


def verify_rim_signature(
    rim: Rim, now: datetime, *, trusted_root_spki: str = NVIDIA_RIM_ROOT_SPKI_SHA256
) -> RimSignature:
    """Check ``rim``'s XML-DSig signature and its chain to NVIDIA's pinned RIM root at ``now``.

    ``trusted_root_spki`` (the SHA-256, hex, of a root's SubjectPublicKeyInfo) replaces
    NVIDIA's root for RIMs signed by a test chain.
    """
    if now.tzinfo is None:
        raise ValueError("now: a time without a time zone")
    what = f"{rim.source} ({rim.kind} {rim.version})"
    leaf, problem, names = _chain(rim, now, trusted_root_spki)
    if leaf is None or problem is not None:
        return RimSignature(False, f"{what}: {names + ': ' if names else ''}{problem}", None)
    config = SignatureConfiguration(verification_time=now, expect_references=1)
    try:
        # parse_rim refused any DTD; signxml's own parser does not resolve entities either
        result = XMLVerifier().verify(rim.raw, x509_cert=leaf, expect_config=config)
    except (SignXMLException, ValueError, LxmlError) as exc:  # lxml: its schema check (fuzzing)
        return RimSignature(False, f"{what}: the XML-DSig signature does not verify: {exc}", None)
    if not isinstance(result, VerifyResult):  # one reference expected, so never a list
        return RimSignature(False, f"{what}: the signature has more than one reference", None)
    # the values compared are those signed: the canonical bytes signxml checked the digest of
    try:
        signed = parse_rim(result.signed_data, rim.source)
    except RimError as exc:  # a signature over a part of the file only (wrapping)
        return RimSignature(False, f"{what}: what is signed is not the whole RIM: {exc}", None)
    signed = Rim(
        rim.source, signed.kind, signed.version, signed.product, signed.measurements,
        rim.certificates, rim.raw,
    )  # fmt: skip
    root = (
        "the pinned NVIDIA CoRIM signing root"
        if trusted_root_spki == NVIDIA_RIM_ROOT_SPKI_SHA256
        else "a trusted RIM root, not NVIDIA's"
    )
    return RimSignature(
        True,
        f"{what}: the enveloped XML-DSig signature verifies with {names} ({root}), "
        f"all valid at {now:%Y-%m-%dT%H:%M:%SZ}",
        signed,
    )


def _compare(
    rim: Rim, measurements: Mapping[int, bytes], reported: str | None, skip: frozenset[int]
) -> tuple[bool, str, dict[str, object]]:
    """One RIM against the evidence: its version, then every active index."""
    differ: dict[str, object] = {}
    for index, ref in sorted(rim.active.items()):
        if index in skip:
            continue
        got = measurements.get(index)
        if got is None or got not in ref.alternatives:
            differ[str(index)] = {
                "evidence": got.hex() if got is not None else None,
                "rim": [a.hex() for a in ref.alternatives],
            }
    version_ok = reported is not None and reported.lower() == rim.version.lower()
    compared = len(rim.active) - len(skip & set(rim.active))
    parts = [
        f"{rim.source}: {rim.kind} {rim.version}"
        + ("" if version_ok else f", but the evidence reports {reported or 'none'}")
    ]
    if differ:
        parts.append(
            f"{len(differ)} of {compared} active indexes differ: {', '.join(differ)} "
            "(RIM index i is SPDM block i + 1)"
        )
    else:
        parts.append(f"all {compared} active indexes match one of their alternatives")
    if skip & set(rim.active):
        parts.append(
            f"index {NVDEC0_INDEX} not compared: the GPU reports NVDEC0 disabled (0x55), "
            "and NVIDIA's verifier skips it then"
        )
    return version_ok and not differ, "; ".join(parts), differ


def check_rims(
    verdict: Verdict,
    rims: Sequence[Rim],
    *,
    measurements: Mapping[int, bytes],
    driver_version: str | None,
    vbios_version: str | None,
    nvdec0_status: bytes | None,
    now: datetime,
    trusted_root_spki: str = NVIDIA_RIM_ROOT_SPKI_SHA256,
) -> None:
    """Add ``rim.signature``, ``rim.driver``, ``rim.vbios`` (and ``rim.indexes`` with both).

    ``measurements`` maps SPDM block index to value, as the evidence reports them. At most one
    RIM of each kind (``ValueError`` otherwise); a kind with no RIM is "not checked".
    ``trusted_root_spki``: as ``verify_rim_signature``'s.
    """
    by_kind: dict[str, Rim] = {}
    for rim in rims:
        if rim.kind in by_kind:
            raise ValueError(
                f"two {rim.kind} RIMs given: {by_kind[rim.kind].source} and {rim.source}"
            )
        by_kind[rim.kind] = rim
    results = {
        kind: verify_rim_signature(rim, now, trusted_root_spki=trusted_root_spki)
        for kind, rim in by_kind.items()
    }
    verdict.add(
        "rim.signature",
        all(r.ok for r in results.values()),
        "; ".join(r.detail for r in results.values()),
    )
    by_rim_index = {index - 1: value for index, value in measurements.items()}
    skip = frozenset({NVDEC0_INDEX}) if nvdec0_status == NVDEC0_DISABLED else frozenset()
    reported = {"driver": driver_version, "vbios": vbios_version}
    mismatches: dict[str, object] = {}
    for kind in ("driver", "vbios"):
        name = f"rim.{kind}"
        if kind not in by_kind:
            verdict.add(
                name,
                None,
                f"no {kind} RIM given (--rim): the measurements were not compared with "
                f"NVIDIA's {kind} RIM ({kind} {reported[kind] or '?'})",
            )
            continue
        signed = results[kind].signed
        if signed is None:
            verdict.add(
                name, False, f"{by_kind[kind].source}: not compared: its signature does not verify"
            )
            continue
        ok, detail, differ = _compare(signed, by_rim_index, reported[kind], skip)
        verdict.add(name, ok, detail)
        if differ:
            mismatches[kind] = differ
    driver, vbios = results.get("driver"), results.get("vbios")
    if driver and vbios and driver.signed and vbios.signed:
        both = sorted(set(driver.signed.active) & set(vbios.signed.active))
        verdict.add(
            "rim.indexes",
            not both,
            "the driver and VBIOS RIMs measure disjoint indexes"
            if not both
            else f"the driver and VBIOS RIMs both measure index {', '.join(map(str, both))}",
        )
    if mismatches:
        verdict.facts["rim_mismatches"] = mismatches
