"""Intel's collateral for a TDX quote: reading it, and checking that it is Intel's and current.

Reading: the collateral as a mapping or JSON text (the shape of dcap-qvl's
``QuoteCollateralV3``), the TCB info and QE identity as the **exact** JSON text Intel signed
(taken byte for byte out of a PCS response when given one, never re-serialised), their
signatures, issuer chains and CRLs. Checking (``_CollateralChecks``, mixed into
``attestation.tdx``'s verifier): each document's signature over its exact text, its issuer
chain up to the pinned root, its validity window, the root CA's and the PCK CA's CRLs, and
whether the PCK chain is revoked. What the collateral says about the platform's TCB is judged
in ``attestation.tdx_tcb``. Nothing here fetches collateral or reads the clock.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.certs import load_certs
from attestation.tdx_certs import (
    TCB_SIGNING_CN,
    _Anchor,
    _build_chain,
    _Chain,
    _cn,
    _cn_of,
    _expired,
    _is_ca,
    _iso,
    _p256_key,
    _p256_verify,
    _pick_leaf,
)
from attestation.tdx_quote import SIGNATURE_LENGTH


class _Bad(ValueError):
    """A collateral member that is missing or not what Intel publishes."""


def _exact_member(text: str, key: str) -> str | None:
    """The exact text of top-level member ``key``'s value in the JSON object ``text``.

    Walks the object with the standard decoder's ``raw_decode`` so the substring's offsets
    are the decoder's own: the bytes returned are the bytes in the document, never a
    re-serialisation. None when ``text`` is not an object or has no such member.
    """
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in ws:
            i += 1
        return i

    i = skip(0)
    if i >= n or text[i] != "{":
        return None
    i = skip(i + 1)
    try:
        while i < n and text[i] != "}":
            name, i = decoder.raw_decode(text, i)
            i = skip(i)
            if not isinstance(name, str) or i >= n or text[i] != ":":
                return None
            start = skip(i + 1)
            _, end = decoder.raw_decode(text, start)
            if name == key:
                return text[start:end]
            i = skip(end)
            if i < n and text[i] == ",":
                i = skip(i + 1)
    except (json.JSONDecodeError, RecursionError):  # nested past the decoder's stack
        return None
    return None


def _text(value: Any, name: str) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"{name}: not UTF-8 text") from None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list):
        raise _Bad(
            f"{name}: parsed JSON, not the exact text Intel signed: pass the text as published"
        )
    raise _Bad(f"{name}: a {type(value).__name__}, not text")


def _signature(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        try:
            raw = bytes.fromhex(value.strip())
        except ValueError:
            raise _Bad(f"{name}: not hex") from None
    elif isinstance(value, bytes | bytearray):
        raw = bytes(value)
        if len(raw) == 2 * SIGNATURE_LENGTH:
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                raw = bytes.fromhex(raw.decode("ascii"))
    else:
        raise _Bad(f"{name}: a {type(value).__name__}, not hex text or bytes")
    if len(raw) != SIGNATURE_LENGTH:
        raise _Bad(f"{name}: {len(raw)} bytes, not a 64-byte r || s")
    return raw


def _pem_chain(value: Any, name: str) -> list[x509.Certificate]:
    blob = value.encode() if isinstance(value, str) else value
    if not isinstance(blob, bytes | bytearray):
        raise _Bad(f"{name}: a {type(value).__name__}, not PEM")
    try:
        certs = load_certs(bytes(blob))
    except ValueError as exc:
        raise _Bad(f"{name}: the certificates do not parse: {exc}") from None
    if not certs:
        raise _Bad(f"{name}: no certificates")
    return certs


def _crl(value: Any, name: str) -> x509.CertificateRevocationList:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-----BEGIN"):
            blob = text.encode()
        else:
            try:
                blob = bytes.fromhex(text)
            except ValueError:
                raise _Bad(f"{name}: neither PEM nor hex DER") from None
    elif isinstance(value, bytes | bytearray):
        blob = bytes(value)
    else:
        raise _Bad(f"{name}: a {type(value).__name__}, not a CRL")
    try:
        if blob.lstrip().startswith(b"-----BEGIN"):
            crl = x509.load_pem_x509_crl(blob)
        else:
            crl = x509.load_der_x509_crl(blob)
        # cryptography reads these only when asked: read now, so a malformed one is this
        # member's problem, not a crash inside a later check (found by fuzzing)
        crl.issuer  # noqa: B018
        crl.extensions  # noqa: B018
        for revoked in crl:
            revoked.extensions  # noqa: B018
    except (
        ValueError,
        TypeError,
        UnsupportedAlgorithm,
        x509.DuplicateExtension,
        x509.InvalidVersion,  # not a ValueError (found by fuzzing)
    ) as exc:
        raise _Bad(f"{name}: does not parse as a CRL: {exc}") from None
    return crl


@dataclass
class _Signed:
    """One signed collateral document: the exact text, its signature, its issuer chain."""

    name: str  # "tcb_info" or "qe_identity"
    member: str  # "tcbInfo" or "enclaveIdentity", in Intel's PCS responses
    text: str | None = None
    signature: bytes | None = None
    chain: list[x509.Certificate] | None = None
    problem: str | None = None  # why text/signature/chain is missing or unusable
    doc: dict[str, Any] | None = None  # the parsed text (only for reading its values)
    parse_problem: str | None = None
    authentic: bool = False  # signature, chain and pin all held


def _load_signed(members: Mapping[str, Any], name: str, member: str) -> _Signed:
    signed = _Signed(name, member)
    try:
        if name not in members:
            raise _Bad(f"the collateral has no {name}")
        text = _text(members[name], name)
        embedded_signature: str | None = None
        # Intel's PCS response itself ({"tcbInfo": {...}, "signature": "..."}): take the
        # exact substring Intel signed.
        inner = _exact_member(text, member)
        if inner is not None:
            sig = _exact_member(text, "signature")
            # the decoder has just read exactly this text as one JSON value
            embedded_signature = json.loads(sig) if sig is not None else None
            text = inner
        signed.text = text
        sig_value = members.get(f"{name}_signature", embedded_signature)
        if sig_value is None:
            raise _Bad(f"the collateral has no {name}_signature")
        signed.signature = _signature(sig_value, f"{name}_signature")
        chain_key = f"{name}_issuer_chain"
        if chain_key not in members:
            raise _Bad(f"the collateral has no {chain_key}")
        signed.chain = _pem_chain(members[chain_key], chain_key)
    except _Bad as exc:
        signed.problem = str(exc)
    if signed.text is not None:
        try:
            doc = json.loads(signed.text)
        except (ValueError, RecursionError) as exc:
            signed.parse_problem = f"{name} is not JSON: {exc}"
        else:
            if isinstance(doc, dict):
                signed.doc = doc
            else:
                signed.parse_problem = f"{name} is not a JSON object"
    return signed


def _collateral_members(collateral: Mapping[str, Any] | bytes | str) -> Mapping[str, Any]:
    if isinstance(collateral, Mapping):
        return collateral
    if isinstance(collateral, bytes | bytearray | str):
        try:
            members = json.loads(collateral)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise ValueError(f"collateral: not JSON: {exc}") from None
        if not isinstance(members, dict):
            raise ValueError("collateral: not a JSON object")
        return members
    raise ValueError(f"collateral: a {type(collateral).__name__}, not a mapping or JSON")


def _get(doc: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise _Bad(f"{where} has no {key}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Bad(f"{where}.{key} is not a {kind.__name__}")
    return value


def _hex(doc: Mapping[str, Any], key: str, size: int, where: str) -> bytes:
    value = _get(doc, key, str, where)
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise _Bad(f"{where}.{key} is not hex") from None
    if len(raw) != size:
        raise _Bad(f"{where}.{key} is {len(raw)} bytes, not {size}")
    return raw


def _when(doc: Mapping[str, Any], key: str, where: str) -> datetime:
    value = _get(doc, key, str, where)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _Bad(f"{where}.{key} {value!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise _Bad(f"{where}.{key} {value!r} has no time zone")
    return when


class _CollateralChecks:
    """The collateral's authenticity checks, mixed into ``attestation.tdx._Verifier``.

    The verifier sets the attributes below; ``root`` is set here once a collateral chain
    shows the pinned root.
    """

    now: datetime
    anchor: _Anchor
    root: x509.Certificate | None
    pck_chain: _Chain | None
    pck_leaf: x509.Certificate | None
    signers_seen: list[x509.Certificate]
    add: Callable[[str, bool | None, str], None]

    def check_authenticity(
        self, members: Mapping[str, Any], window: list[tuple[datetime, datetime, str]]
    ) -> tuple[_Signed, _Signed]:
        """The TCB info and QE identity (read, signature, chain, validity), the CRLs and the
        PCK chain's revocation: whether the collateral is Intel's and current."""
        tcb = _load_signed(members, "tcb_info", "tcbInfo")
        qe = _load_signed(members, "qe_identity", "enclaveIdentity")
        self.check_signed(tcb, window)
        self.check_signed(qe, window)
        self.signers_seen = [c for s in (tcb, qe) for c in (s.chain or []) if c.subject != c.issuer]
        pck_ca = (
            self.pck_chain.path[1:2] if self.pck_chain is not None and self.pck_chain.ok else []
        )
        self.check_crls(members, pck_ca, window)
        return tcb, qe

    def check_signed(self, signed: _Signed, window: list[tuple[datetime, datetime, str]]) -> None:
        prefix = f"collateral.{signed.name}"
        member = signed.member
        if signed.problem is not None or signed.text is None or signed.signature is None:
            why = signed.problem or f"no {signed.name}"
            self.add(f"{prefix}_signature", False, why)
            self.add(f"{prefix}_chain", False, why)
            self.add(f"{prefix}_validity", False, why)
            return
        assert signed.chain is not None
        leaf = _pick_leaf(signed.chain)
        chain = _build_chain(leaf, signed.chain, self.anchor)
        if chain.pinned and self.root is None:
            self.root = chain.path[-1]
        key = _p256_key(leaf)
        sig_ok = key is not None and _p256_verify(key, signed.signature, signed.text.encode())
        size = len(signed.text.encode())
        self.add(
            f"{prefix}_signature",
            sig_ok,
            f"ECDSA P-256/SHA-256 over the exact {member} text ({size} bytes) verifies with "
            f"{_cn(leaf)}'s key"
            if sig_ok
            else f"the signature over the exact {member} text ({size} bytes) does not verify "
            f"with {_cn(leaf)}'s key",
        )
        problems = [chain.problem] if chain.problem else []
        if not chain.pinned:
            problems.append(chain.pin_detail)
        if _cn(leaf) != TCB_SIGNING_CN or _is_ca(leaf):
            problems.append(f"the signer {_cn(leaf)} is not the {TCB_SIGNING_CN!r} certificate")
        elif len(chain.path) != 2:
            problems.append("the signer is not issued directly by the root")
        problems += [f"not valid at {_iso(self.now)}: {e}" for e in _expired(chain.path, self.now)]
        names = " → ".join(_cn(c) for c in chain.path)
        self.add(
            f"{prefix}_chain",
            not problems,
            f"{names}: signed by the next, ending at {self.anchor.source}, valid at "
            f"{_iso(self.now)}"
            if not problems
            else f"{names}: " + "; ".join(problems),
        )
        signed.authentic = sig_ok and not problems
        if signed.doc is None:
            self.add(f"{prefix}_validity", False, signed.parse_problem or f"{member} unreadable")
            return
        try:
            issued = _when(signed.doc, "issueDate", member)
            next_update = _when(signed.doc, "nextUpdate", member)
        except _Bad as exc:
            self.add(f"{prefix}_validity", False, str(exc))
            return
        window.append((issued, next_update, member))
        ok = issued <= self.now <= next_update
        self.add(
            f"{prefix}_validity",
            ok,
            f"{member} issued {_iso(issued)}, next update {_iso(next_update)}: "
            + ("current at " if ok else "expired or not yet issued at ")
            + _iso(self.now),
        )

    def check_crls(
        self,
        members: Mapping[str, Any],
        signers: list[x509.Certificate],
        window: list[tuple[datetime, datetime, str]],
    ) -> None:
        root = self.root
        root_crl: x509.CertificateRevocationList | None = None
        pck_crl: x509.CertificateRevocationList | None = None

        # The root CA's CRL: signed by the pinned root; lists revoked intermediate CAs.
        if "root_ca_crl" not in members:
            self.add(
                "collateral.root_ca_crl", None, "the collateral has no root_ca_crl: not checked"
            )
        else:
            try:
                root_crl = _crl(members["root_ca_crl"], "root_ca_crl")
            except _Bad as exc:
                self.add("collateral.root_ca_crl", False, str(exc))
            else:
                if not self.crl_check(
                    "collateral.root_ca_crl",
                    root_crl,
                    [root] if root else [],
                    window,
                    root.subject if root else None,
                ):
                    root_crl = None  # not authentic or not current: it vouches for nothing

        # The PCK CA's CRL: signed by the CA that issued the PCK certificate.
        if "pck_crl" not in members:
            self.add("collateral.pck_crl", None, "the collateral has no pck_crl: not checked")
        else:
            try:
                pck_crl = _crl(members["pck_crl"], "pck_crl")
            except _Bad as exc:
                self.add("collateral.pck_crl", False, str(exc))
            else:
                candidates = list(signers)
                if "pck_crl_issuer_chain" in members:
                    try:
                        extra = _pem_chain(members["pck_crl_issuer_chain"], "pck_crl_issuer_chain")
                    except _Bad:
                        extra = []
                    for cert in extra:
                        if cert.subject == cert.issuer:
                            continue
                        if _build_chain(cert, extra, self.anchor).ok:
                            candidates.append(cert)
                expected = self.pck_leaf.issuer if self.pck_leaf is not None else None
                if not self.crl_check("collateral.pck_crl", pck_crl, candidates, window, expected):
                    pck_crl = None  # not authentic, not current, or another CA's list

        self.check_revocation(root_crl, pck_crl)

    def crl_check(
        self,
        name: str,
        crl: x509.CertificateRevocationList,
        candidates: list[x509.Certificate],
        window: list[tuple[datetime, datetime, str]],
        expected: x509.Name | None,
    ) -> bool:
        label = _cn_of(crl.issuer)
        problems: list[str] = []
        if expected is not None and crl.issuer != expected:
            problems.append(f"it is {label}'s, not {_cn_of(expected)}'s, as this quote needs")
        signer = None
        for cert in candidates:
            key = cert.public_key()
            if (
                cert.subject == crl.issuer
                and isinstance(key, ec.EllipticCurvePublicKey)
                and crl.is_signature_valid(key)
            ):
                signer = cert
                break
        if signer is None:
            problems.append(
                f"no trusted certificate named {label} verifies its signature"
                if candidates
                else f"no trusted {label} certificate to check it with"
            )
        this_update, next_update = crl.last_update_utc, crl.next_update_utc
        if next_update is None:
            problems.append("it has no nextUpdate")
        else:
            window.append((this_update, next_update, name.removeprefix("collateral.")))
            if not this_update <= self.now <= next_update:
                problems.append(
                    f"issued {_iso(this_update)}, next update {_iso(next_update)}: not current "
                    f"at {_iso(self.now)}"
                )
        self.add(
            name,
            not problems,
            f"{label}'s CRL ({len(crl)} revoked) is signed by {label} and current at "
            f"{_iso(self.now)} (next update {_iso(next_update) if next_update else '?'})"
            if not problems
            else f"{label}'s CRL: " + "; ".join(problems),
        )
        return not problems

    def check_revocation(
        self,
        root_crl: x509.CertificateRevocationList | None,
        pck_crl: x509.CertificateRevocationList | None,
    ) -> None:
        if root_crl is None and pck_crl is None:
            self.add("pck_chain.revocation", None, "no usable CRL: revocation not checked")
            return
        revoked: list[str] = []
        looked: list[str] = []
        path = self.pck_chain.path if self.pck_chain is not None else []
        if pck_crl is not None and path:
            looked.append(f"{_cn(path[0])} in {_cn_of(pck_crl.issuer)}'s CRL")
            if pck_crl.get_revoked_certificate_by_serial_number(path[0].serial_number):
                revoked.append(f"{_cn(path[0])} (serial {path[0].serial_number:x})")
        if root_crl is not None:
            for cert in [*path[1:], *self.signers_seen]:
                if cert.subject == cert.issuer or cert.issuer != root_crl.issuer:
                    continue
                looked.append(f"{_cn(cert)} in the root CA's CRL")
                if root_crl.get_revoked_certificate_by_serial_number(cert.serial_number):
                    revoked.append(f"{_cn(cert)} (serial {cert.serial_number:x})")
        missing = (
            "" if pck_crl is not None else "; the PCK certificate itself not checked (no PCK CRL)"
        )
        self.add(
            "pck_chain.revocation",
            not revoked,
            ("not revoked: " + ", ".join(dict.fromkeys(looked)) + missing)
            if not revoked
            else "revoked: " + ", ".join(dict.fromkeys(revoked)),
        )
