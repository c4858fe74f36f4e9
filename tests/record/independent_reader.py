"""A bundle verifier and body decrypter written only from ``docs/record.md``.

It stands for "someone in another language": it imports nothing from ``record`` (nor
pydantic, nor ``rfc8785``), only the standard library and ``cryptography``'s primitives
(ChaCha20-Poly1305, X25519, Ed25519). HPKE (RFC 9180) is spelled out from the document's
§7.3 on top of those primitives, the canonical JSON of §3 is written out here, and every
section reference below is to the document. ``test_format_doc.py`` runs it over real bundles.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

# --- §1 notation, §3 canonical JSON --------------------------------------------------------------


class Bad(Exception):
    """A value that is not what the document allows; the message names it."""


def b64(text: Any, what: str) -> bytes:
    """Standard base64 with padding, canonical encoding only (§1)."""
    if not isinstance(text, str):
        raise Bad(f"{what} is not a base64 string")
    try:
        raw = binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
    except (UnicodeEncodeError, binascii.Error):
        raise Bad(f"{what} is not standard base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise Bad(f"{what} is not canonical base64")
    return raw


_JCS_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_JCS_ESCAPES["\r"] = "\\r"


def _jcs_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _JCS_ESCAPES:
            out.append(_JCS_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def jcs(value: Any) -> bytes:
    """RFC 8785 for the values the record canonicalises outside sealed plaintexts (§3).

    Strings, integers within ±(2^53 - 1), booleans, null, arrays and objects; a non-integer
    number is refused (it never occurs in an envelope or a clear body).
    """
    return _jcs(value).encode("utf-8")


def _jcs(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > 2**53 - 1:
            raise Bad(f"integer {value} is outside ±(2^53 - 1)")
        return str(value)
    if isinstance(value, str):
        return _jcs_string(value)
    if isinstance(value, list):
        return "[" + ",".join(_jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        names = sorted(value, key=lambda name: name.encode("utf-16-be"))  # §3 rule 2
        return "{" + ",".join(_jcs_string(k) + ":" + _jcs(value[k]) for k in names) + "}"
    raise Bad(f"{type(value).__name__} has no canonical form here")


def parse_json(data: bytes, what: str) -> Any:
    """Strict JSON: UTF-8, no duplicate member, no NaN/Infinity."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise Bad(f"{what}: member {k!r} appears twice")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise Bad(f"{what}: {name} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, Bad):
            raise
        raise Bad(f"{what}: not JSON ({exc})") from None


# --- §4 envelope, §5 bodies: a closed schema --------------------------------------------------

Check = Callable[[Any, str], None]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_INT = 2**53 - 1  # §1: every integer of the record lies within it


def t_int(minimum: int = 0) -> Check:
    """§1: every integer member is non-negative (at least ``minimum``) and at most 2^53 - 1."""

    def check(v: Any, where: str) -> None:
        if not _is_int(v) or not minimum <= v <= MAX_INT:
            raise Bad(f"{where} is not an integer in [{minimum}, 2^53 - 1]")

    return check


def t_str(v: Any, where: str) -> None:
    if not isinstance(v, str):
        raise Bad(f"{where} is not a string")


def t_bool(v: Any, where: str) -> None:
    if not isinstance(v, bool):
        raise Bad(f"{where} is not a boolean")


def t_bytes(v: Any, where: str) -> None:
    b64(v, where)


def t_object(v: Any, where: str) -> None:
    if not isinstance(v, dict):
        raise Bad(f"{where} is not an object")


def t_pattern(pattern: str, what: str) -> Check:
    rx = re.compile(pattern)

    def check(v: Any, where: str) -> None:
        if not isinstance(v, str) or rx.fullmatch(v) is None:
            raise Bad(f"{where} is not {what}")

    return check


def t_enum(*allowed: str) -> Check:
    def check(v: Any, where: str) -> None:
        if v not in allowed or not isinstance(v, str):
            raise Bad(f"{where} is not one of {allowed}")

    return check


def t_null_or(inner: Check) -> Check:
    def check(v: Any, where: str) -> None:
        if v is not None:
            inner(v, where)

    return check


def t_list(inner: Check, min_length: int = 0) -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, list) or len(v) < min_length:
            raise Bad(f"{where} is not an array of at least {min_length}")
        for i, item in enumerate(v):
            inner(item, f"{where}[{i}]")

    return check


def t_map_of_str(v: Any, where: str) -> None:
    t_object(v, where)
    for k, item in v.items():
        t_str(item, f"{where}.{k}")


def t_value(v: Any, where: str) -> None:
    pass


def t_record(members: dict[str, Check], optional: frozenset[str] = frozenset()) -> Check:
    """An object with exactly ``members``; the ``optional`` ones may be left out (§5.2)."""

    def check(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise Bad(f"{where} is not an object")
        extra = set(v) - set(members)
        if extra:
            raise Bad(f"{where}: unknown member(s) {sorted(extra)}")
        for name, inner in members.items():
            if name not in v:
                if name in optional:
                    continue
                raise Bad(f"{where}.{name} is missing")
            inner(v[name], f"{where}.{name}")

    return check


DIGEST = t_pattern(r"sha256:[0-9a-f]{64}", "a digest sha256:<64 lowercase hex>")
STREAM = t_pattern(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "a stream name")
UUID7 = t_pattern(
    r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", "a lowercase UUIDv7"
)
TIMESTAMP = t_pattern(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z", "RFC 3339 UTC"
)
OUTCOME = t_enum("COMMITTED", "FAILED", "UNKNOWN")
CLEAR_KINDS = ("stream.opened", "key.rotated")
HPKE_SUITE = "DHKEM(X25519,HKDF-SHA256)/HKDF-SHA256/ChaCha20Poly1305"


def t_bytes_of(size: int) -> Check:
    """§5.3: base64 of exactly ``size`` bytes."""

    def check(v: Any, where: str) -> None:
        if len(b64(v, where)) != size:
            raise Bad(f"{where} is not base64 of {size} bytes")

    return check


def t_plain_name(v: Any, where: str) -> None:
    """§5.4 ``evidence.archived.file``: non-empty, no ``/``, not starting with ``.``."""
    if not isinstance(v, str) or not v or "/" in v or v.startswith("."):
        raise Bad(f"{where} is not a plain file name")


_WRAPPED = t_record({"recipient": t_bytes_of(32), "sealed_key": t_bytes_of(80)})
_RETRIEVAL = t_record({"doc_id": t_str, "doc_version": t_str, "chunk_digest": DIGEST})
_PROVIDER = t_record(
    {"name": t_str, "endpoint": t_str, "api_version": t_null_or(t_str)},
    optional=frozenset({"api_version"}),
)


def _body(members: dict[str, Check]) -> tuple[dict[str, Check], frozenset[str]]:
    optional = {name for name, check in members.items() if check in _NULLABLE}
    return members, frozenset(optional)


_NULLABLE: set[Check] = set()  # the members that may be left out (§5.2)
_DEFAULT: dict[Check, Any] = {}  # what each of them reads as when it is


def _opt(inner: Check) -> Check:
    """An "or null" member (§5.2): may be null or left out, which reads as null."""
    check = t_null_or(inner)
    _NULLABLE.add(check)
    _DEFAULT[check] = None
    return check


def _defaulted(inner: Check, default: Any) -> Check:
    """A member with a default (§5.2): may be left out (it reads as ``default``), never null."""

    def check(v: Any, where: str) -> None:
        inner(v, where)

    _NULLABLE.add(check)
    _DEFAULT[check] = default
    return check


#: §5.3 and §5.4, member by member ("kind" is added to each).
BODY_SCHEMAS: dict[str, tuple[dict[str, Check], frozenset[str]]] = {
    "stream.opened": _body(
        {
            "origin": t_str,
            "log_key": t_str,
            "aead": _defaulted(t_enum("chacha20-poly1305"), "chacha20-poly1305"),
            "hpke_suite": _defaulted(t_enum(HPKE_SUITE), HPKE_SUITE),
            "key_epoch": t_int(0),
            "recipients": t_list(_WRAPPED, 1),
            "labels": _defaulted(t_map_of_str, {}),
            "continues": _opt(
                t_record({"stream": STREAM, "checkpoint": t_str, "size": t_int(0), "root": DIGEST})
            ),
        }
    ),
    "key.rotated": _body({"key_epoch": t_int(1), "recipients": t_list(_WRAPPED, 1)}),
    "model.request": _body(
        {
            "content_key": DIGEST,
            "input_digest": DIGEST,
            "prompt_digest": DIGEST,
            "request_bytes": t_bytes,
            "input_bytes": t_bytes,
            "prompt_bytes": t_bytes,
            "retrieval": _defaulted(t_list(_RETRIEVAL), []),
            "provider": _PROVIDER,
            "model_id": t_str,
            "params": t_object,
            "pins": _opt(t_object),
            "clock": _opt(t_str),
            "clock_rule": _opt(t_enum("fold", "prepend")),
            "turn": _opt(t_int()),
            "step": _opt(t_int()),
        }
    ),
    "model.response": _body(
        {
            "request_seq": t_int(0),
            "outcome": OUTCOME,
            "status": _opt(t_int()),
            "response_bytes": _opt(t_bytes),
            "response_digest": _opt(DIGEST),
            "error_bytes": _opt(t_bytes),
            "error_digest": _opt(DIGEST),
            "fingerprint": _opt(t_str),
            "reproducibility": _opt(t_object),
        }
    ),
    "tool.call": _body(
        {
            "reply_seq": t_int(0),
            "call_id": t_str,
            "server": t_str,
            "tool": t_str,
            "arguments": t_bytes,
            "arguments_digest": DIGEST,
            "idempotent": t_bool,
        }
    ),
    "tool.result": _body(
        {
            "call_seq": t_int(0),
            "outcome": OUTCOME,
            "result_bytes": _opt(t_bytes),
            "result_digest": _opt(DIGEST),
            "error_bytes": _opt(t_bytes),
            "error_digest": _opt(DIGEST),
            "replayed_from": _opt(t_int()),
        }
    ),
    "fetch.request": _body(
        {
            "method": t_str,
            "url": t_str,
            "request_bytes": t_bytes,
            "content_key": DIGEST,
            "reply_seq": _opt(t_int(0)),
            "call_id": _opt(t_str),
        }
    ),
    "fetch.response": _body(
        {
            "request_seq": t_int(0),
            "outcome": OUTCOME,
            "status": _opt(t_int()),
            "response_bytes": _opt(t_bytes),
            "response_digest": _opt(DIGEST),
            "error_bytes": _opt(t_bytes),
            "error_digest": _opt(DIGEST),
            "replayed_from": _opt(t_int()),
        }
    ),
    "tool.unavailable": _body({"server": t_str, "error": t_str}),
    "turn.started": _body({"turn": t_int(0), "input_bytes": t_bytes, "input_digest": DIGEST}),
    "turn.ended": _body(
        {
            "turn": t_int(0),
            "outcome": t_enum("ANSWERED", "STEP_LIMIT", "FAILED", "STOPPED"),
            "answer_bytes": _opt(t_bytes),
            "answer_digest": _opt(DIGEST),
        }
    ),
    "turn.decided": _body(
        {"turn": t_int(0), "call_seq": t_int(0), "decision": t_enum("retry", "skip", "abort")}
    ),
    "pins.set": _body(
        {"pins": t_object, "cache_mode": _defaulted(t_enum("strict", "shared"), "strict")}
    ),
    "evidence.archived": _body(
        {
            "evidence_kind": t_enum("sev-snp", "tdx", "nvidia-h100"),
            "file": t_plain_name,
            "evidence_digest": DIGEST,
        }
    ),
    "lease.taken": _body({"holder": t_str, "previous_holder": t_str, "previous_since": TIMESTAMP}),
}

#: §5.2: kind -> {left-out member: what it reads as}.
DEFAULTS: dict[str, dict[str, Any]] = {
    kind: {name: _DEFAULT[members[name]] for name in optional}
    for kind, (members, optional) in BODY_SCHEMAS.items()
}


def with_defaults(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A valid ``body`` with every left-out member read as §5.2 says (``provider.api_version``
    too): what a reader that left them out must see."""
    out = copy.deepcopy(DEFAULTS[kind]) | body
    if kind == "model.request":
        out["provider"] = {"api_version": None} | out["provider"]
    return out


ENVELOPE: dict[str, Check] = {
    "schema_version": t_enum("1.0"),
    "stream": STREAM,
    "seq": t_int(0),
    "event_id": UUID7,
    "kind": t_enum(*BODY_SCHEMAS),
    "occurred_at": TIMESTAMP,
    "key_epoch": t_int(0),
}


def check_body(kind: str, body: Any, where: str) -> None:
    """§5.2: an object whose ``kind`` is the envelope's, with exactly its kind's members."""
    members, nullable = BODY_SCHEMAS[kind]
    t_record({"kind": t_enum(kind), **members}, nullable)(body, where)


def parse_line(line: bytes) -> tuple[dict[str, Any], Any]:
    """§4.4: ``(envelope, body)`` of one stored line, canonical form checked."""
    entry = parse_json(line, "line")
    if not isinstance(entry, dict):
        raise Bad("line is not a JSON object")
    if "schema_version" in entry and entry["schema_version"] != "1.0":
        raise Bad(f"unknown schema_version {entry['schema_version']!r}")
    t_record({**ENVELOPE, "body": t_value})(entry, "entry")
    envelope = {k: v for k, v in entry.items() if k != "body"}
    body = entry["body"]
    if (envelope["kind"] in CLEAR_KINDS) != isinstance(body, dict):
        raise Bad(f"body of {envelope['kind']} has the wrong shape")
    if not isinstance(body, dict | str):
        raise Bad("body is neither an object nor a string")
    if isinstance(body, str):
        b64(body, "sealed body")  # §4.4: canonical base64, checked without a key
    if line != b'{"body":' + jcs(body) + b"," + jcs(envelope)[1:]:  # §4.2
        raise Bad("line is not in canonical form")
    return envelope, body


# --- §6 digests ---------------------------------------------------------------------------------

DOMAIN = {
    "REQUEST": 0x00,
    "RESPONSE": 0x01,
    "INPUT": 0x02,
    "PROMPT": 0x03,
    "TOOL_ARGUMENTS": 0x04,
    "TOOL_RESULT": 0x05,
    "FETCH_REQUEST": 0x07,
    "FETCH_RESPONSE": 0x08,
    "ERROR": 0x09,
    "EVIDENCE": 0x0B,
}

#: kind -> (bytes member, digest member, domain), from the table of §6.
DIGEST_PAIRS: dict[str, list[tuple[str, str, int]]] = {
    "model.request": [
        ("request_bytes", "content_key", DOMAIN["REQUEST"]),
        ("input_bytes", "input_digest", DOMAIN["INPUT"]),
        ("prompt_bytes", "prompt_digest", DOMAIN["PROMPT"]),
    ],
    "model.response": [
        ("response_bytes", "response_digest", DOMAIN["RESPONSE"]),
        ("error_bytes", "error_digest", DOMAIN["ERROR"]),
    ],
    "tool.call": [("arguments", "arguments_digest", DOMAIN["TOOL_ARGUMENTS"])],
    "tool.result": [
        ("result_bytes", "result_digest", DOMAIN["TOOL_RESULT"]),
        ("error_bytes", "error_digest", DOMAIN["ERROR"]),
    ],
    "fetch.request": [("request_bytes", "content_key", DOMAIN["FETCH_REQUEST"])],
    "fetch.response": [
        ("response_bytes", "response_digest", DOMAIN["FETCH_RESPONSE"]),
        ("error_bytes", "error_digest", DOMAIN["ERROR"]),
    ],
    "turn.started": [("input_bytes", "input_digest", DOMAIN["INPUT"])],
    "turn.ended": [("answer_bytes", "answer_digest", DOMAIN["RESPONSE"])],
}


def digest(domain: int, data: bytes) -> str:
    return "sha256:" + hashlib.sha256(bytes([domain]) + data).hexdigest()


# --- §7 sealing ---------------------------------------------------------------------------------


def _labeled_extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt, b"HPKE-v1" + suite + label + ikm, hashlib.sha256).digest()


def _labeled_expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    labeled_info = length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info
    okm, t, i = b"", b"", 1  # HKDF-Expand (RFC 5869 §2.3)
    while len(okm) < length:
        t = hmac.new(prk, t + labeled_info + bytes([i]), hashlib.sha256).digest()
        okm += t
        i += 1
    return okm[:length]


def wrap_info(stream: str, epoch: int) -> bytes:
    return b"affidavit/data-key/v1" + b"\x00" + stream.encode() + b"\x00" + str(epoch).encode()


def hpke_open(private: bytes, sealed_key: bytes, info: bytes) -> bytes:
    """§7.3: RFC 9180 base-mode single-shot Open, DHKEM(X25519)/HKDF-SHA256/ChaCha20Poly1305."""
    if len(sealed_key) != 80:
        raise Bad("wrapped data key is not 80 bytes")
    kem_suite = b"KEM\x00\x20"
    hpke_suite = b"HPKE\x00\x20\x00\x01\x00\x03"
    enc, ct = sealed_key[:32], sealed_key[32:]
    sk = X25519PrivateKey.from_private_bytes(private)
    try:
        dh = sk.exchange(X25519PublicKey.from_public_bytes(enc))
    except ValueError:
        raise Bad("wrapped data key does not open") from None
    pk_r = sk.public_key().public_bytes_raw()
    eae_prk = _labeled_extract(kem_suite, b"", b"eae_prk", dh)
    shared_secret = _labeled_expand(kem_suite, eae_prk, b"shared_secret", enc + pk_r, 32)
    psk_id_hash = _labeled_extract(hpke_suite, b"", b"psk_id_hash", b"")
    info_hash = _labeled_extract(hpke_suite, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = _labeled_extract(hpke_suite, shared_secret, b"secret", b"")
    key = _labeled_expand(hpke_suite, secret, b"key", context, 32)
    base_nonce = _labeled_expand(hpke_suite, secret, b"base_nonce", context, 12)
    try:
        return ChaCha20Poly1305(key).decrypt(base_nonce, ct, b"")
    except InvalidTag:
        raise Bad("wrapped data key does not open") from None


def open_body(data_key: bytes, body: str, ad: bytes) -> bytes:
    """§7.2: base64(nonce || ct || tag) under the data key, the envelope as AD."""
    sealed = b64(body, "sealed body")
    if len(sealed) < 28:
        raise Bad("sealed body is shorter than nonce and tag")
    try:
        return ChaCha20Poly1305(data_key).decrypt(sealed[:12], sealed[12:], ad)
    except InvalidTag:
        raise Bad("body does not open") from None


_PKCS8_X25519_PREFIX = bytes.fromhex("302e020100300506032b656e04220420")


def private_key_from_pem(pem: bytes) -> bytes:
    """§8: the 32-byte X25519 key inside an unencrypted PKCS#8 PEM."""
    text = pem.decode("ascii")
    m = re.search(r"-----BEGIN PRIVATE KEY-----(.*?)-----END PRIVATE KEY-----", text, re.S)
    if m is None:
        raise Bad("not a PEM private key")
    der = base64.b64decode("".join(m[1].split()), validate=True)
    if len(der) != 48 or not der.startswith(_PKCS8_X25519_PREFIX):
        raise Bad("not an X25519 PKCS#8 key")
    return der[16:]


def public_text(private: bytes) -> str:
    pk = X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()
    return base64.b64encode(pk).decode("ascii")


# --- §9 Merkle tree -----------------------------------------------------------------------------


def leaf_hash(line: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + line).digest()


def mth(leaves: Sequence[bytes]) -> bytes:
    """§9, the iterative form: pair from the left, an unpaired last hash moves up unchanged."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    level = list(leaves)
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


# --- §10 checkpoints ----------------------------------------------------------------------------


@dataclass(frozen=True)
class VKey:
    name: str
    key_id: bytes
    public_key: bytes


def key_id(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + b"\x01" + public_key).digest()[:4]


def parse_vkey(text: str) -> VKey:
    parts = text.split("+", 2)  # the base64 key may itself contain "+"
    if len(parts) != 3 or not parts[0] or re.fullmatch(r"[0-9a-f]{8}", parts[1]) is None:
        raise Bad("vkey is not <name>+<hex key id>+<base64 key>")
    name, hex_id, key_b64 = parts
    if any(ch.isspace() for ch in name):
        raise Bad("vkey name has a space")
    raw = b64(key_b64, "vkey key")
    if len(raw) != 33 or raw[0] != 0x01:
        raise Bad("vkey is not an Ed25519 (type 0x01) key")
    if key_id(name, raw[1:]) != bytes.fromhex(hex_id):
        raise Bad("vkey key id does not match its key")
    return VKey(name, bytes.fromhex(hex_id), raw[1:])


@dataclass(frozen=True)
class CheckpointText:
    origin: str
    size: int
    root: bytes


def open_note(note: bytes, vkey: VKey) -> CheckpointText:
    """§10.2 then §10.1: signatures by the trusted key first, then the checkpoint text."""
    try:
        msg = note.decode("utf-8")
    except UnicodeDecodeError:
        raise Bad("note is not UTF-8") from None
    if any(ord(ch) < 0x20 and ch != "\n" for ch in msg):
        raise Bad("note has a control character")
    if not msg.endswith("\n"):
        raise Bad("note does not end in a newline")
    split = msg.rfind("\n\n")
    if split < 0:
        raise Bad("note has no blank line")
    text, sig_lines = msg[: split + 1], msg[split + 2 :].split("\n")[:-1]
    if not 1 <= len(sig_lines) <= 100:
        raise Bad("note has no signature lines, or too many")
    mine = 0
    for line in sig_lines:
        if not line.startswith("\u2014 "):
            raise Bad("signature line does not start with an em dash and a space")
        name, _, sig_b64 = line[2:].partition(" ")
        raw = b64(sig_b64, "signature")
        if len(raw) < 5:
            raise Bad("signature is too short")
        if name != vkey.name or raw[:4] != vkey.key_id:
            continue  # another key's signature: ignored
        mine += 1
        if mine > 1:
            raise Bad("two signatures from the log key")
        if len(raw) != 4 + 64:
            raise Bad("log key signature is not 64 bytes")
        try:
            Ed25519PublicKey.from_public_bytes(vkey.public_key).verify(raw[4:], text.encode())
        except InvalidSignature:
            raise Bad("log key signature does not verify") from None
    if not mine:
        raise Bad("no signature from the log key")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or not lines[0] or any(not extra for extra in lines[3:]):
        raise Bad("checkpoint text is not origin, size, root [, extensions]")
    origin, size_line, root_line = lines[:3]
    if re.fullmatch(r"0|[1-9][0-9]*", size_line) is None or int(size_line) >= 2**64:
        raise Bad("checkpoint size is not a decimal uint64")
    root = b64(root_line, "root hash")
    if len(root) != 32:
        raise Bad("root hash is not 32 bytes")
    return CheckpointText(origin, int(size_line), root)


# --- §12 and §13: the procedures ----------------------------------------------------------------


@dataclass
class Report:
    stream: str = "?"
    problems: list[tuple[str, int | None, str]] = field(default_factory=list)
    envelopes: list[dict[str, Any]] = field(default_factory=list)
    bodies: dict[int, dict[str, Any]] = field(default_factory=dict)  # clear and opened
    plaintexts: dict[int, bytes] = field(default_factory=dict)  # sealed entries' JCS
    data_keys: dict[int, bytes] = field(default_factory=dict)
    checkpoints: list[CheckpointText] = field(default_factory=list)  # verified ones
    uncovered: int = 0  # lines after the largest matching checkpoint: the unsigned tail
    #: §12 step 11: {"stream", "size", "checked"} of the stream's continues link, if it has one
    continues: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def codes(self) -> set[str]:
        return {code for code, _, _ in self.problems}

    def add(self, code: str, seq: int | None, detail: str) -> None:
        self.problems.append((code, seq, detail))


def verify_bundle(
    path: Path | str,
    *,
    private_key_pem: bytes | None = None,
    log_key: str | None = None,
    kept: Sequence[bytes] = (),
    allow_unsigned_tail: bool = False,
    continued: Path | str | None = None,
) -> Report:
    """§12 (and §13 with a key): every problem found, with its §14 code. §12 step 8's
    unsigned tail is counted in ``uncovered`` and, unless allowed, is a problem.
    ``continued``: the bundle of the stream this one continues, if the caller holds it: the
    link is checked against it (§12 step 11)."""
    root = Path(path)
    report = Report()

    # 1. Index.
    stream: str | None = None
    index: Any = None
    try:
        index = parse_json((root / "bundle.json").read_bytes(), "bundle.json")
    except (OSError, Bad) as exc:
        report.add("malformed_bundle", None, f"bundle.json: {exc}")
    if isinstance(index, dict):
        if index.get("format") != "affidavit-bundle/v1" or index.get("schema_version") != "1.0":
            report.add("malformed_bundle", None, "bundle.json: not an affidavit-bundle/v1 of 1.0")
        elif isinstance(index.get("stream"), str):
            stream = index["stream"]
    elif index is not None:
        report.add("malformed_bundle", None, "bundle.json is not an object")

    # 2. Lines.
    try:
        data = (root / "entries.jsonl").read_bytes()
    except OSError:
        data = b""
        report.add("malformed_bundle", None, "entries.jsonl is missing")
    if not data:
        report.add("malformed_bundle", None, "entries.jsonl holds no entry")
    elif not data.endswith(b"\n"):
        report.add("malformed_bundle", None, "entries.jsonl: last line is cut short")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if isinstance(index, dict) and _is_int(index.get("entries")) and index["entries"] != len(lines):
        report.add("malformed_bundle", None, "bundle.json disagrees on the entry count")

    # 3. Leaves, 4. entries.
    leaves = [leaf_hash(line) for line in lines]
    entries: list[tuple[dict[str, Any], Any]] = []
    for i, line in enumerate(lines):
        try:
            envelope, body = parse_line(line)
        except Bad as exc:
            report.add("malformed_entry", None, f"line {i + 1}: {exc}")
            continue
        if stream is None:
            stream = envelope["stream"]
        if envelope["stream"] != stream:
            report.add("stream_mismatch", envelope["seq"], f"line {i + 1} names another stream")
        entries.append((envelope, body))
    report.stream = stream or "?"
    report.envelopes = [env for env, _ in entries]

    # 5. Sequence.
    seen: set[int] = set()
    highest = -1
    for envelope, _ in entries:
        seq = envelope["seq"]
        if seq in seen:
            report.add("seq_duplicate", seq, "seq appears twice")
        elif seq < highest:
            report.add("seq_order", seq, f"seq {seq} after {highest}")
        seen.add(seq)
        highest = max(highest, seq)
    for missing in range(highest + 1):
        if missing not in seen:
            report.add("seq_gap", missing, "seq is missing")
    if entries and entries[0][0]["kind"] != "stream.opened":
        report.add("malformed_entry", entries[0][0]["seq"], "line 0 is not stream.opened")
    epoch = 0  # the epoch the next clear entry must bring: 0, 1, 2 …
    opened_seen = False
    for envelope, body in entries:
        if envelope["kind"] not in CLEAR_KINDS:
            continue
        second = envelope["kind"] == "stream.opened" and opened_seen
        opened_seen |= envelope["kind"] == "stream.opened"
        try:
            check_body(envelope["kind"], body, "body")
        except Bad:  # step 6 reports it; it still takes its epoch's place
            epoch += 1
            continue
        brought = body["key_epoch"]
        if brought != epoch or envelope["key_epoch"] != epoch:
            report.add("malformed_entry", envelope["seq"], f"key epoch {brought}, not {epoch}")
        if second:
            report.add("malformed_entry", envelope["seq"], "a second stream.opened")
        epoch += 1

    # 6. Log key and the stream's origin.
    vkey: VKey | None = None
    if log_key is None:
        try:
            log_key = (root / "log_key.pub").read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            report.add("malformed_bundle", None, "log_key.pub is missing or not UTF-8")
    if log_key is not None:
        try:
            vkey = parse_vkey(log_key)
        except Bad as exc:
            report.add("checkpoint_invalid", None, f"log key: {exc}")
    # The origin comes from the vkey and the stream name, never from the log (§10.4).
    origin = f"{vkey.name}/{vkey.key_id.hex()}/{stream}" if vkey and stream else None
    opened = next(((e, b) for e, b in entries if e["kind"] == "stream.opened"), None)
    for envelope, body in entries:  # every clear body, key or not [malformed_entry]
        if envelope["kind"] not in CLEAR_KINDS:
            continue
        try:
            check_body(envelope["kind"], body, f"{envelope['kind']} body")
        except Bad as exc:
            report.add("malformed_entry", envelope["seq"], str(exc))
            continue
        if opened is not None and body is opened[1]:
            if log_key is not None and body["log_key"] != log_key:
                report.add("checkpoint_invalid", envelope["seq"], "stream names another log key")
            elif origin is not None and body["origin"] != origin:
                report.add("malformed_entry", envelope["seq"], "stream.opened names another origin")

    # 1 (again). Evidence files against the index's list.
    folder_names = (
        sorted(p.name for p in (root / "evidence").iterdir())
        if (root / "evidence").is_dir()
        else []
    )
    listed = index.get("evidence") if isinstance(index, dict) else None
    if listed is not None:
        if not isinstance(listed, list) or not all(_plain(n) for n in listed):
            report.add("malformed_bundle", None, "bundle.json: evidence is not plain file names")
        else:
            for name in listed:
                if not (root / "evidence" / name).is_file():
                    report.add("evidence_missing", None, f"listed evidence {name!r} is missing")
            for name in folder_names:
                if name not in listed:
                    report.add("evidence_unlisted", None, f"evidence {name!r} is not listed")

    # 7. Checkpoints, 9. kept ones.
    folder = root / "checkpoints"
    notes: list[tuple[str, bytes, bool]] = []
    if folder.is_dir():
        notes = [
            (p.name, p.read_bytes(), False)
            for p in sorted(folder.iterdir())
            if p.name.endswith(".note")
        ]
    else:
        report.add("malformed_bundle", None, "checkpoints/ is missing")
    notes += [(f"kept #{i}", note, True) for i, note in enumerate(kept)]
    if vkey is None and log_key is None and notes:
        report.add("checkpoint_invalid", None, "no log key to check checkpoints with")
    signed: list[tuple[str, CheckpointText]] = []
    for label, note, _ in notes:
        if vkey is None:
            if log_key is not None:
                report.add("checkpoint_invalid", None, f"{label}: no usable log key")
            continue
        try:
            cp = open_note(note, vkey)
        except Bad as exc:
            report.add("checkpoint_invalid", None, f"{label}: {exc}")
            continue
        if origin is not None and cp.origin != origin:
            report.add("checkpoint_invalid", None, f"{label}: origin {cp.origin!r}")
            continue
        signed.append((label, cp))

    # 8. Tree.
    n = len(lines)
    by_size: dict[int, bytes] = {}
    for label, cp in signed:
        if by_size.setdefault(cp.size, cp.root) != cp.root:
            report.add("checkpoint_inconsistent", cp.size - 1, f"{label}: two roots for a size")
    roots = {cp.size: mth(leaves[: cp.size]) for _, cp in signed if cp.size <= n}
    matching = [cp.size for _, cp in signed if cp.size <= n and roots[cp.size] == cp.root]
    anchor = max(matching, default=None)
    for label, cp in signed:
        if cp.size > n:
            report.add("truncated", n, f"{label} covers {cp.size} entries, the log has {n}")
        elif roots[cp.size] != cp.root:
            if anchor is not None and cp.size < anchor:
                report.add("checkpoint_inconsistent", cp.size - 1, f"{label} contradicts {anchor}")
            else:
                report.add("root_mismatch", cp.size - 1, f"{label}: another root")
        else:
            report.checkpoints.append(cp)
    report.uncovered = n - (anchor or 0)
    if report.uncovered and not (allow_unsigned_tail and anchor):  # nothing signed: never allowed
        report.add("unsigned_tail", anchor or 0, f"{report.uncovered} lines no checkpoint covers")

    # 10. Boot bundles: each as steps 1-9 say, without a key, under the same log key.
    boot = index.get("boot") if isinstance(index, dict) else None
    boot_folder = root / "boot"
    boot_names = sorted(p.name for p in boot_folder.iterdir()) if boot_folder.is_dir() else []
    if boot is None:  # an older bundle: no boot member
        boot = []
    if not isinstance(boot, list) or not all(_plain(n) for n in boot):
        report.add("malformed_bundle", None, "bundle.json: boot is not plain stream names")
        boot, boot_names = [], []  # nothing more is judged of boot/
    for name in boot_names:
        if name not in boot:
            report.add("evidence_unlisted", None, f"boot {name!r} is not listed")
    for name in boot:
        nested = boot_folder / name
        if not nested.is_dir():
            report.add("evidence_missing", None, f"listed boot bundle {name!r} is missing")
            continue
        inner = verify_bundle(nested, log_key=log_key, allow_unsigned_tail=allow_unsigned_tail)
        for code, seq, detail in inner.problems:
            report.add(code, seq, f"boot/{name}: {detail}")
        try:
            inner_index = parse_json((nested / "bundle.json").read_bytes(), "bundle.json")
        except (OSError, Bad):
            inner_index = None  # the nested check reported it
        if isinstance(inner_index, dict) and inner_index.get("stream") != name:
            report.add("malformed_bundle", None, f"boot/{name}: names another stream")
        listed_inner = inner_index.get("boot") if isinstance(inner_index, dict) else None
        if listed_inner not in (None, []) or (nested / "boot").exists():
            report.add("malformed_bundle", None, f"boot/{name}: holds boot bundles")
        try:
            own = (nested / "log_key.pub").read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            own = None
        if own is not None and log_key is not None and own != log_key:
            report.add("checkpoint_invalid", None, f"boot/{name}: log_key.pub names another key")

    # 11. Continuation.
    if opened is not None and isinstance(opened[1], dict) and opened[1].get("continues"):
        try:
            check_body("stream.opened", opened[1], "stream.opened body")
        except Bad:
            pass  # step 6 reported it
        else:
            link = opened[1]["continues"]
            checked = False
            if continued is not None:
                old = _stream_lines(Path(continued))
                if old and _stream_of(old[0]) == link["stream"]:
                    checked = True
                    problem = link_problem(link, old)
                    if problem is not None:
                        report.add("continuation_broken", opened[0]["seq"], problem)
            report.continues = {"stream": link["stream"], "size": link["size"], "checked": checked}

    if private_key_pem is not None:
        _open_bodies(root, report, entries, private_key_pem, folder_names)
    return report


def _stream_lines(root: Path) -> list[bytes]:
    """§12 step 2's lines of a bundle (none when it has no ``entries.jsonl``)."""
    try:
        data = (root / "entries.jsonl").read_bytes()
    except OSError:
        return []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _stream_of(line: bytes) -> str | None:
    try:
        envelope, _ = parse_line(line)
    except Bad:
        return None
    stream: str = envelope["stream"]
    return stream


def link_problem(link: dict[str, Any], old: Sequence[bytes]) -> str | None:
    """§12 step 11: what is wrong with a valid Continuation ``link`` against the lines of the
    stream it names, or ``None`` when all six checks hold."""
    name = link["stream"]
    try:
        envelope, body = parse_line(old[0])
        if envelope["kind"] != "stream.opened":
            return f"{name} does not open with stream.opened"
        check_body("stream.opened", body, f"{name} stream.opened body")
        vkey = parse_vkey(body["log_key"])
        # 1. signed by the old stream's log key
        cp = open_note(link["checkpoint"].encode("utf-8"), vkey)
    except Bad as exc:
        return f"the checkpoint of {name} does not open with its log key: {exc}"
    # 2. the old stream's origin, from its vkey and its name (§10.4)
    if cp.origin != f"{vkey.name}/{vkey.key_id.hex()}/{name}":
        return f"the checkpoint is of {cp.origin!r}, not of {name}"
    # 3. and 4. size <= the old stream's size, and checkpoint size <= the old stream's size
    if cp.size > len(old):
        return f"the checkpoint's size {cp.size} is beyond the {len(old)} lines of {name}"
    if link["size"] > len(old):
        return f"size {link['size']} is beyond the {len(old)} lines of {name}"
    leaves = [leaf_hash(line) for line in old]
    # 5. the old stream at the checkpoint's size has the checkpoint's root
    if mth(leaves[: cp.size]) != cp.root:
        return f"{name} at size {cp.size} does not have its checkpoint's root"
    # 6. the old stream at size has the link's root
    if "sha256:" + mth(leaves[: link["size"]]).hex() != link["root"]:
        return f"{name} at size {link['size']} does not have the link's root"
    return None


def _plain(name: Any) -> bool:
    try:
        t_plain_name(name, "name")
    except Bad:
        return False
    return True


def _open_bodies(
    root: Path,
    report: Report,
    entries: list[tuple[dict[str, Any], Any]],
    private_key_pem: bytes,
    folder_names: list[str],
) -> None:
    """§13: unwrap the data keys, open and check every body, then its digests."""
    private = private_key_from_pem(private_key_pem)
    mine = public_text(private)
    stream = report.stream

    # 2. Data keys.
    named = False
    for envelope, body in entries:
        if envelope["kind"] not in CLEAR_KINDS:
            continue
        try:
            check_body(envelope["kind"], body, envelope["kind"])
        except Bad:
            continue  # reported by §12 as malformed_entry; it brings no data key
        for wrapped in body["recipients"]:
            if wrapped["recipient"] != mine:
                continue
            named = True
            epoch = body["key_epoch"]
            try:
                sealed_key = b64(wrapped["sealed_key"], "sealed_key")
                report.data_keys[epoch] = hpke_open(private, sealed_key, wrap_info(stream, epoch))
            except Bad as exc:
                report.add("cannot_open", envelope["seq"], str(exc))
    if not named:
        report.add("cannot_open", None, "the stream is not sealed to this key")
        return

    # 3. Bodies, 4. digests.
    vouched: set[str] = set()
    for envelope, body in entries:
        seq, kind = envelope["seq"], envelope["kind"]
        if kind in CLEAR_KINDS:
            try:
                check_body(kind, body, kind)
            except Bad:
                continue  # reported by §12 step 6 as malformed_entry, key or not
            report.bodies[seq] = with_defaults(kind, body)
            continue
        if isinstance(body, str):
            key = report.data_keys.get(envelope["key_epoch"])
            if key is None:
                report.add("cannot_open", seq, f"no data key for epoch {envelope['key_epoch']}")
                continue
            try:
                plaintext = open_body(key, body, jcs(envelope))
            except Bad as exc:
                report.add("cannot_open", seq, str(exc))
                continue
            try:
                body = parse_json(plaintext, f"seq {seq} body")
            except Bad as exc:
                report.add("malformed_body", seq, str(exc))
                continue
            report.plaintexts[seq] = plaintext
        try:
            check_body(kind, body, f"seq {seq} body")
        except Bad as exc:
            report.add("malformed_body", seq, str(exc))
            continue
        report.bodies[seq] = body = with_defaults(kind, body)
        for data_name, digest_name, domain in DIGEST_PAIRS.get(kind, []):
            data, claimed = body.get(data_name), body.get(digest_name)
            if data is None and claimed is None:
                continue
            if data is None or claimed is None:
                report.add("body_digest_mismatch", seq, f"{digest_name} without its bytes")
            elif digest(domain, b64(data, data_name)) != claimed:
                report.add("body_digest_mismatch", seq, f"{digest_name} does not match")
        if kind == "evidence.archived":
            name = body["file"]
            vouched.add(name)
            file = root / "evidence" / name
            if not file.is_file():
                report.add("evidence_missing", seq, f"evidence file {name!r} is missing")
            elif digest(DOMAIN["EVIDENCE"], file.read_bytes()) != body["evidence_digest"]:
                report.add("evidence_digest_mismatch", seq, f"evidence file {name!r} differs")
    opened_all = all(seq in report.bodies for seq in (e["seq"] for e, _ in entries))
    for name in folder_names if opened_all else []:  # an unopened entry may vouch for it
        if name not in vouched:
            report.add("evidence_unlisted", None, f"evidence {name!r}: no entry vouches for it")


# --- §15 the v1.0 record ------------------------------------------------------------------------

_FROM_ENVELOPE = ("schema_version", "event_id", "seq", "occurred_at")
_FROM_REQUEST = (
    "content_key",
    "input_digest",
    "prompt_digest",
    "retrieval",
    "provider",
    "model_id",
    "params",
)
_FROM_RESPONSE = ("fingerprint", "response_bytes", "response_digest", "error_bytes")


def v1_record(report: Report, request_seq: int) -> dict[str, Any]:
    """§15: the v1.0 record of the ``model.request`` at ``request_seq``, from opened bodies."""
    envelope = next(e for e in report.envelopes if e["seq"] == request_seq)
    request = report.bodies[request_seq]
    responses = [
        body
        for seq, body in sorted(report.bodies.items())
        if body["kind"] == "model.response" and body["request_seq"] == request_seq
    ]
    if len(responses) > 1:
        raise Bad(f"request {request_seq} has {len(responses)} responses")
    response = responses[0] if responses else None
    record: dict[str, Any] = {name: envelope[name] for name in _FROM_ENVELOPE}
    record |= {name: request[name] for name in _FROM_REQUEST}
    record |= {name: response.get(name) if response else None for name in _FROM_RESPONSE}
    record["outcome"] = response["outcome"] if response else "UNKNOWN"
    return record
