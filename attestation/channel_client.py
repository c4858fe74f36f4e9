"""The client side of the attested channel: check the appliance, then talk only to its key.

``attest`` draws a fresh 32-byte nonce, opens ONE TLS connection to the appliance (no CA
vouches for its key, so the certificate is not checked by the handshake: the evidence
vouches for it), asks ``GET /attestation?nonce=HEX`` on that connection and keeps the
certificate the connection presented. It then checks, one named check at a time:

1. each piece of evidence with the verifier of its kind (``attestation.evidence``; the GPU's
   verifier is given our nonce), held to the policy (``attestation.policy``) and to the
   signed published measurements (``attestation.published``: ``published.signature``,
   ``published.<kind>``);
2. ``channel.nonce``: the reply answers our nonce, and the evidence carries it
   (``report_data``'s second half; the GPU's own nonce);
3. ``channel.tls_key``: the TLS key the reply names is the key of the connection it came on;
4. ``channel.binding``: ``report_data``'s first half is ``attestation.binding`` v2 over the
   reply's log key, sealing key and that TLS key (a reply without SEV-SNP or TDX evidence
   binds nothing, and fails here).

Only when every check made held (``Attested.ok``) do ``client``, ``async_client`` and
``clients`` return HTTP clients, and those trust that one certificate and nothing else
(``pinned_context``): a server with any other key fails the TLS handshake, before a byte of
a request is written, and the clients never fall back to anything.

Pinning a self-signed leaf that is not a CA (the appliance's certificate says ``CA:FALSE``
and cannot sign others, ``attestation.tls_identity``): OpenSSL (3.0 here) accepts it as its
own trust anchor when it is the very certificate in the store; ``VERIFY_X509_PARTIAL_CHAIN``
is set as well, so the certificate counts as an anchor whatever OpenSSL thinks of it as an
issuer. A certificate with another key (even one with the same subject) fails verification
("self-signed certificate"), and a certificate signed by the pinned key would need the
pinned one to be a CA, which it is not. ``tests/attestation/test_channel_client.py`` holds
this to the installed OpenSSL.

The official SDKs take these clients as they are (``http_client=``): ``openai`` 3.x and
``anthropic`` 2.x use ``httpx2`` (anthropic accepts only ``httpx2`` clients), so the clients
are ``httpx2.Client`` and ``httpx2.AsyncClient``. Their ``base_url`` is left unset (the SDK
sets its own), ``trust_env`` is off (no proxy from the environment stands between), and their
timeout is httpx2's default, which the SDKs replace with their own::

    from openai import OpenAI
    from anthropic import Anthropic
    from attestation.channel_client import client

    URL = "https://appliance.example:8443"
    openai = OpenAI(base_url=URL + "/s/SESSION/v1", api_key=TOKEN,
                    http_client=client(URL, Path("measurements/0.1.0.json")))
    anthropic = Anthropic(base_url=URL + "/s/SESSION", api_key=TOKEN,
                          http_client=client(URL, Path("measurements/0.1.0.json")))

Each call attests afresh (its own nonce); ``pinned_client(attested)`` builds one from an
``Attested`` already checked. The base install suffices (no torch); ``httpx2`` is imported
when a connection is made.
"""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from attestation.channel import (
    MAX_REPLY_BYTES,
    NONCE_SIZE,
    AttestationReply,
    Piece,
    ReplyError,
    decode,
    parse_reply,
)
from attestation.evidence import TrustedRoots, mark_trusted_roots, read_file, verify_evidence
from attestation.verdict import Check, Verdict

if TYPE_CHECKING:
    import httpx2

    from attestation.policy import Policy
    from attestation.published import Published

__all__ = [
    "ATTESTATION_PATH",
    "Attested",
    "NotAttested",
    "ReplyError",
    "Unreachable",
    "async_client",
    "attest",
    "check_url",
    "client",
    "clients",
    "pinned_async_client",
    "pinned_client",
    "pinned_context",
]

ATTESTATION_PATH = "/attestation"
_CPU = ("snp", "tdx")


class Unreachable(ConnectionError):
    """The endpoint did not answer: refused, timed out, no TLS, closed mid-reply."""


class NotAttested(Exception):
    """The appliance was not attested: ``reason`` names the first failing check (or says why
    there was nothing to check); ``verdicts`` are what was checked, possibly none."""

    def __init__(self, verdicts: Sequence[Verdict], reason: str) -> None:
        super().__init__(reason)
        self.verdicts = list(verdicts)
        self.reason = reason


@dataclass(frozen=True)
class Attested:
    """What ``attest`` found: the endpoint, the certificate its connection presented (and its
    SPKI digest), the reply, and one verdict per piece of evidence (channel checks included)."""

    url: str
    cert_der: bytes
    spki_sha256: bytes
    reply: AttestationReply
    verdicts: tuple[Verdict, ...]
    #: The version of the published file the evidence was held to (None: it did not verify).
    release: str | None = None

    @property
    def checks(self) -> list[Check]:
        return [check for verdict in self.verdicts for check in verdict.checks]

    @property
    def ok(self) -> bool:
        """Every verdict accepted: every check made held (a ``None`` check is a notice)."""
        return bool(self.verdicts) and all(v.accepted for v in self.verdicts)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if c.ok is False), None)

    def refusal(self) -> str:
        """Why this is not attested, naming the first failing check ("" when it is)."""
        if self.ok:
            return ""
        failed = self.first_failure
        if failed is None:
            return "no check was made"
        return f"{failed.name}: {failed.detail}"


def check_url(url: str) -> str:
    """``url`` without its trailing slash: ``https://HOST[:PORT][/PATH]``, no query, no
    fragment, no user (``ValueError`` saying which otherwise)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ValueError(f"{url!r}: the attested channel is https only")
    if not parts.hostname or parts.query or parts.fragment or parts.username is not None:
        raise ValueError(f"{url!r}: give https://HOST[:PORT][/PATH], no query, fragment or user")
    return url.rstrip("/")


def pinned_context(cert_der: bytes) -> ssl.SSLContext:
    """A client TLS context (TLS 1.3) that trusts ``cert_der`` alone, names no host: a server
    presenting any other certificate fails the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # the key is what is checked, and the certificate names none
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=cert_der)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def _unverified_context() -> ssl.SSLContext:
    """For the one attestation request: any certificate, which the evidence then vouches for
    (or not)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _fetch(url: str, nonce: bytes, timeout: float) -> tuple[bytes, bytes]:
    """The reply body (at most ``MAX_REPLY_BYTES``) and the DER certificate of the connection
    it came on. ``timeout`` bounds each step (connect, each read); the whole exchange may take
    three times that, so a server dripping bytes cannot hold the client."""
    import time

    import httpx2

    deadline = time.monotonic() + 3 * timeout

    target = httpx2.URL(url + ATTESTATION_PATH, params={"nonce": nonce.hex()})
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    try:
        with (
            httpx2.Client(verify=_unverified_context(), trust_env=False, timeout=timeout) as http,
            http.stream("GET", target, headers=headers) as response,
        ):
            stream = response.extensions.get("network_stream")
            tls = stream.get_extra_info("ssl_object") if stream is not None else None
            cert = tls.getpeercert(True) if tls is not None else None
            if not cert:
                raise Unreachable(f"{url}: the connection presented no certificate")
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                raise ReplyError(f"the reply is {encoding}-encoded (asked for identity)")
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > MAX_REPLY_BYTES:
                raise ReplyError(f"the reply is {length} bytes, over {MAX_REPLY_BYTES}")
            body = bytearray()
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > MAX_REPLY_BYTES:
                    raise ReplyError(f"the reply is over {MAX_REPLY_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise Unreachable(f"{url}: the reply took over {3 * timeout:g} s")
            if response.status_code != 200:
                raise ReplyError(
                    f"{ATTESTATION_PATH} answered {response.status_code}: {_said(bytes(body))}"
                )
            return bytes(body), cert
    except httpx2.TransportError as exc:
        raise Unreachable(f"{url}: {type(exc).__name__}: {exc or 'no answer'}") from None


def _said(body: bytes) -> str:
    """What a refusal says: an appliance's ``{"error": {"code", "message"}}`` as
    ``CODE: message`` (``no_tee``: it runs in no TEE), else its first 200 characters."""
    try:
        error = json.loads(body)["error"]
        return f"{str(error['code'])[:64]}: {str(error['message'])[:200]}"
    except (ValueError, TypeError, KeyError, RecursionError):
        return body[:200].decode("utf-8", "replace").strip()


def _load(
    published: Path, policy: Path | None, release_key: Path | None
) -> tuple[Published | None, str | None, Policy]:
    """The published file (None with the reason when its signature does not verify) and the
    policy. Raises ``Missing``, ``PublishedError`` or ``PolicyError``."""
    from attestation.cli import RELEASE_KEY
    from attestation.policy import Policy, load_policy
    from attestation.published import SignatureMismatch, load_published, read_public_key

    read_file(published)
    key_path = release_key or RELEASE_KEY
    read_file(key_path)
    if policy is not None:
        read_file(policy)
    rules = load_policy(policy) if policy is not None else Policy()
    try:
        return load_published(published, read_public_key(key_path)), None, rules
    except SignatureMismatch as exc:
        return None, str(exc), rules


def _verify_piece(
    index: int,
    piece: Piece,
    nonce: bytes,
    rules: Policy,
    promised: Published | None,
    untrusted: str | None,
    trusted: TrustedRoots | None,
    now: datetime,
) -> Verdict:
    from attestation.evidence import CertsNeeded
    from attestation.policy import apply_policy
    from attestation.published import check_published

    data = decode(piece.evidence, f"evidence[{index}].evidence")
    certs = [piece.certs.encode("utf-8")] if piece.certs else []
    collateral = piece.collateral.encode("utf-8") if piece.collateral is not None else None
    roots = trusted if piece.kind == "snp" else None
    try:
        verdict = verify_evidence(
            piece.kind,
            data,
            certs=certs,
            collateral=collateral,
            now=now,
            nonce=nonce if piece.kind == "nvidia" else None,
            trusted=roots,
        )
    except (CertsNeeded, ValueError) as exc:  # evidence that does not parse: a rejection
        verdict = Verdict(piece.kind)
        verdict.add("parse", False, str(exc))
        if roots is not None:
            mark_trusted_roots(verdict, roots)
    apply_policy(verdict, rules)  # the nonce is ``channel.nonce``'s, named so
    if promised is not None:
        verdict.add("published.signature", True, "the published file is signed by the release key")
        check_published(verdict, promised)
    else:
        verdict.add("published.signature", False, untrusted or "no published file")
    return verdict


def _channel_checks(
    verdict: Verdict, reply: AttestationReply, nonce: bytes, spki_sha256: bytes
) -> None:
    """``channel.nonce``, ``channel.tls_key`` and ``channel.binding`` on one verdict."""
    from attestation.binding import channel_digest

    facts = verdict.facts
    ours = nonce.hex()
    if verdict.kind == "nvidia":
        carried = str(facts.get("nonce", ""))
        where = "the GPU's evidence"
    else:
        carried = str(facts.get("report_data", ""))[2 * NONCE_SIZE :]
        where = "report_data"
    if reply.nonce != ours:
        verdict.add("channel.nonce", False, f"the reply answers nonce {reply.nonce}, not ours")
    else:
        verdict.add(
            "channel.nonce",
            carried == ours,
            f"{where} carries our nonce {ours[:16]}…"
            if carried == ours
            else f"{where} carries {carried or 'no nonce'}, not our nonce {ours}",
        )
    if verdict.kind == "nvidia":
        return
    claimed = reply.binding.tls_spki_sha256
    verdict.add(
        "channel.tls_key",
        claimed == spki_sha256.hex(),
        f"this connection's TLS key sha256:{spki_sha256.hex()} is the attested one"
        if claimed == spki_sha256.hex()
        else f"this connection's TLS key is sha256:{spki_sha256.hex()}, the reply attests "
        f"sha256:{claimed}",
    )
    expected = channel_digest(
        reply.binding.log_key,
        bytes.fromhex(reply.binding.sealing_key),
        bytes.fromhex(claimed),
    ).hex()
    bound = str(facts.get("report_data", ""))[: 2 * NONCE_SIZE]
    verdict.add(
        "channel.binding",
        bound == expected,
        "report_data binds the log key, the sealing key and the TLS key (binding v2)"
        if bound == expected
        else f"report_data begins {bound[:16] or '(not read)'}…, binding v2 of the reply's keys "
        f"is {expected[:16]}…",
    )


def attest(
    url: str,
    published: Path,
    policy: Path | None = None,
    *,
    release_key: Path | None = None,
    trusted: TrustedRoots | None = None,
    timeout: float = 10.0,
    now: datetime | None = None,
) -> Attested:
    """Ask the appliance at ``url`` (https) for fresh evidence over one connection and check it.

    ``published``: the signed published measurements (its ``.sig`` beside it), checked with
    ``release_key`` (default: ``measurements/release.pub``); ``policy``: a policy file
    (default: the default policy); ``trusted``: SEV-SNP test roots in place of AMD's (the
    verdict says so). The result's ``ok`` says whether everything held; it does not raise for
    a refusal.

    Raises:
        ValueError: ``url`` is not https.
        Missing: an input file is not there.
        PublishedError, PolicyError: an input file that cannot be read.
        Unreachable: the endpoint did not answer.
        ReplyError: the answer is not an attestation reply (too large, not JSON, not this
            format, not base64, not 200).
    """
    base = check_url(url)
    promised, untrusted, rules = _load(published, policy, release_key)
    nonce = secrets.token_bytes(NONCE_SIZE)
    body, cert_der = _fetch(base, nonce, timeout)
    reply = parse_reply(body)
    from attestation.tls_identity import spki_sha256_of

    try:
        spki = spki_sha256_of(cert_der)
    except ValueError as exc:
        raise ReplyError(f"the connection's certificate does not parse: {exc}") from None
    when = now or datetime.now(UTC)
    verdicts = [
        _verify_piece(i, piece, nonce, rules, promised, untrusted, trusted, when)
        for i, piece in enumerate(reply.evidence)
    ]
    for verdict in verdicts:
        _channel_checks(verdict, reply, nonce, spki)
    if not any(v.kind in _CPU for v in verdicts):
        verdicts[0].add(
            "channel.binding", False, "no SEV-SNP or TDX evidence: nothing binds the TLS key"
        )
    release = promised.version if promised is not None else None
    return Attested(base, cert_der, spki, reply, tuple(verdicts), release)


def _checked(attested: Attested) -> Attested:
    if not attested.ok:
        raise NotAttested(attested.verdicts, attested.refusal())
    return attested


def _attested(
    url: str,
    published: Path,
    policy: Path | None,
    release_key: Path | None,
    trusted: TrustedRoots | None,
    timeout: float,
    now: datetime | None,
) -> Attested:
    try:
        found = attest(
            url,
            published,
            policy,
            release_key=release_key,
            trusted=trusted,
            timeout=timeout,
            now=now,
        )
    except ReplyError as exc:
        raise NotAttested([], f"the reply: {exc}") from None
    return _checked(found)


def pinned_client(attested: Attested) -> httpx2.Client:
    """A client that talks only to the key ``attested`` checked (``NotAttested`` unless ok)."""
    import httpx2

    _checked(attested)
    return httpx2.Client(verify=pinned_context(attested.cert_der), trust_env=False)


def pinned_async_client(attested: Attested) -> httpx2.AsyncClient:
    """The async twin of ``pinned_client``."""
    import httpx2

    _checked(attested)
    return httpx2.AsyncClient(verify=pinned_context(attested.cert_der), trust_env=False)


def clients(
    url: str,
    published: Path,
    policy: Path | None = None,
    *,
    release_key: Path | None = None,
    trusted: TrustedRoots | None = None,
    timeout: float = 10.0,
    now: datetime | None = None,
) -> tuple[httpx2.Client, httpx2.AsyncClient]:
    """Attest ``url`` (``attest``'s options), then a sync and an async client pinned to its
    key. Raises ``NotAttested`` naming the first failing check (and what ``attest`` raises
    for missing or unreadable inputs, ``Unreachable`` when nothing answers)."""
    found = _attested(url, published, policy, release_key, trusted, timeout, now)
    return pinned_client(found), pinned_async_client(found)


def client(
    url: str,
    published: Path,
    policy: Path | None = None,
    *,
    release_key: Path | None = None,
    trusted: TrustedRoots | None = None,
    timeout: float = 10.0,
    now: datetime | None = None,
) -> httpx2.Client:
    """Attest ``url``, then an ``httpx2.Client`` pinned to its key, for ``http_client=``::

    OpenAI(base_url=URL + "/s/SESSION/v1", api_key=TOKEN, http_client=client(URL, PUBLISHED))
    """
    found = _attested(url, published, policy, release_key, trusted, timeout, now)
    return pinned_client(found)


def async_client(
    url: str,
    published: Path,
    policy: Path | None = None,
    *,
    release_key: Path | None = None,
    trusted: TrustedRoots | None = None,
    timeout: float = 10.0,
    now: datetime | None = None,
) -> httpx2.AsyncClient:
    """Attest ``url``, then an ``httpx2.AsyncClient`` pinned to its key (``AsyncOpenAI``,
    ``AsyncAnthropic``)."""
    found = _attested(url, published, policy, release_key, trusted, timeout, now)
    return pinned_async_client(found)
