"""``docs/record.md`` made exact (issue #17, line 7): six questions a reader of the document
alone could not answer, each now settled in the document and held here by two verifiers.

For every point, a bundle written by the project's writer (``record.log.Log`` on real SQLite,
real X25519/HPKE/ChaCha20-Poly1305 and Ed25519 keys), exported by ``record.bundle``, then
edited byte for byte, is judged by the reference verifier (``record.bundle.verify_bundle``,
which runs ``record.audit.check_stream``) and by ``tests/record/independent_reader.py`` (written
from the document alone). Both must report the same problems, code and ``seq``, and that
must be what the document says. An edit meant to be judged on its own is re-signed with the
log's key (one fresh checkpoint over every line), so the problem under test is the only one.

1. the kinds: every count of them in the document is the number there are (15);
2. one fault, one code: a clear body is ``malformed_entry`` (with a key or not), an opened
   sealed body ``malformed_body``;
3. a wrapped key of the wrong length is a malformed clear body (``malformed_entry``), never
   ``cannot_open``; an 80-byte one that does not open is ``cannot_open``;
4. left-out members: which may be, what they read as; ``provider``, ``retrieval[]`` and
   ``WrappedKey`` are closed;
5. base64 is canonical everywhere; integers are 0 … 2^53 − 1; a bundle no checkpoint signs
   (or with no entry) is never valid;
6. evidence files: ``evidence_missing``, ``evidence_unlisted``, ``evidence_digest_mismatch``.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import independent_reader  # tests/record/independent_reader.py, a sibling
import pytest
import uuid6

from record import merkle
from record.bundle import export_stream, verify_bundle
from record.checkpoint import Checkpoint, Signer, sign_checkpoint
from record.digest import Domain, canonical_json, digest
from record.log import LOG_KEY_NAME, Log, entry_line, origin_for
from record.reader import StreamKeys
from record.schema import (
    BODY_MODELS,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Provider,
    RetrievalItem,
    TurnStarted,
    parse_entry,
)
from record.seal import KeyPair, new_data_key, seal
from record.sqlite_store import SQLiteStore

STREAM = "exact-1"
DOC = Path(__file__).resolve().parents[2] / "docs" / "record.md"

# The entries the writer leaves, by seq.
OPENED, PINS, REQUEST, RESPONSE, EVIDENCE, STARTED, ROTATED = range(7)
QUESTION = b"Hi!?"  # 4 bytes: base64 "SGkhPw==", two padding characters
REPORT = b"\x01\x02 attestation report \xff"

Found = list[tuple[str, int | None]]


@dataclass(frozen=True)
class Written:
    bundle: Path  # as exported: valid
    user: KeyPair  # a recipient of both epochs
    pem: bytes  # its private key, as the independent reader takes it
    signer: Signer  # the log's signing key: re-signs an edited bundle
    vkey: str  # the log's public key, pinned

    def copy(self, tmp_path: Path) -> Path:
        out = tmp_path / "bundle"
        shutil.copytree(self.bundle, out)
        return out

    def judge(self, bundle: Path, *, key: bool, allow_unsigned_tail: bool = False) -> Found:
        """The problems both verifiers find, as ``(code, seq)``; they must be the same."""
        reference = verify_bundle(
            bundle,
            key=self.user if key else None,
            log_key=self.vkey,
            allow_unsigned_tail=allow_unsigned_tail,
        )
        independent = independent_reader.verify_bundle(
            bundle,
            private_key_pem=self.pem if key else None,
            log_key=self.vkey,
            allow_unsigned_tail=allow_unsigned_tail,
        )
        mine = sorted(((p.code, p.seq) for p in reference.problems), key=str)
        theirs = sorted(((code, seq) for code, seq, _ in independent.problems), key=str)
        assert mine == theirs, (reference.problems, independent.problems)
        return mine

    # -- edits ---------------------------------------------------------------------------------

    def data_key(self, epoch: int) -> bytes:
        entries = [parse_entry(line) for line in _lines(self.bundle)]
        return StreamKeys.collect(STREAM, entries, self.user).keys[epoch]

    def sealed(self, seq: int, body: dict[str, Any], /, **envelope: Any) -> bytes:
        """Line ``seq`` with ``body`` sealed in its place, as a writer would (envelope
        members in ``envelope`` changed first)."""
        old = json.loads(_lines(self.bundle)[seq])
        del old["body"]
        env = old | envelope
        _, ad = entry_line(env, "")
        try:
            plaintext = canonical_json(body)
        except ValueError:  # an integer past 2^53 - 1, which JCS cannot write: sorted JSON
            plaintext = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        sealed = seal(self.data_key(old["key_epoch"]), plaintext, ad)
        return entry_line(env, base64.b64encode(sealed).decode())[0]

    def rewrite(self, bundle: Path, lines: list[bytes], *, sign: bool = True) -> None:
        """Write ``lines`` as the bundle's entries; ``sign``: replace every checkpoint by one
        the log's key signs over all of them (so nothing else is wrong)."""
        (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        index = json.loads((bundle / "bundle.json").read_bytes())
        index["entries"] = len(lines)
        if sign:
            for note in (bundle / "checkpoints").glob("*.note"):
                note.unlink()
            root = merkle.root([merkle.hash_leaf(line) for line in lines])
            note = sign_checkpoint(
                self.signer, Checkpoint(origin_for(self.signer, STREAM), len(lines), root)
            )
            (bundle / "checkpoints" / "000000.note").write_bytes(note)
            index["checkpoints"] = 1
        (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _lines(bundle: Path) -> list[bytes]:
    return (bundle / "entries.jsonl").read_bytes().splitlines()


def _body(line: bytes) -> Any:
    return json.loads(line)["body"]


def _clear(line: bytes, body: dict[str, Any]) -> bytes:
    """A clear entry's line with ``body`` in place of its own (envelope unchanged)."""
    envelope = json.loads(line)
    del envelope["body"]
    return entry_line(envelope, body)[0]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """stream.opened, pins.set, model.request, model.response, evidence.archived,
    turn.started, and key.rotated last (no sealed entry uses epoch 1)."""
    folder = tmp_path_factory.mktemp("format-exact")
    user, appliance = KeyPair.generate(), KeyPair.generate()
    signer = Signer.generate(LOG_KEY_NAME)
    store = folder / "record.db"
    request = canonical_json({"model": "m", "messages": [{"role": "user", "content": "Hi!?"}]})
    reply = b"data: hello\n\n"
    log = Log(SQLiteStore(store), signer, appliance_key=appliance)
    try:
        log.open_stream(STREAM, [user.recipient, appliance.recipient], {"site": "lab"})
        log.append(STREAM, PinsSet(pins={"seed": 42}, cache_mode="shared"))
        log.append(
            STREAM,
            ModelRequest(
                content_key=digest(Domain.REQUEST, request),
                input_digest=digest(Domain.INPUT, QUESTION),
                prompt_digest=digest(Domain.PROMPT, request),
                request_bytes=request,
                input_bytes=QUESTION,
                prompt_bytes=request,
                retrieval=[
                    RetrievalItem(
                        doc_id="d", doc_version="1", chunk_digest=digest(Domain.INPUT, b"c")
                    )
                ],
                provider=Provider(name="embedded", endpoint="http://127.0.0.1/v1", api_version="1"),
                model_id="affidavit-tiny",
                params={"temperature": -0.5, "offset": -3},
                pins={"seed": 42},
                clock="2026-11-30T12:00:00Z",
                clock_rule="fold",
                turn=0,
                step=0,
            ),
        )
        log.append(
            STREAM,
            ModelResponse(
                request_seq=REQUEST,
                outcome="COMMITTED",
                status=200,
                response_bytes=reply,
                response_digest=digest(Domain.RESPONSE, reply),
            ),
        )
        log.archive_evidence(STREAM, "sev-snp", "report.bin", REPORT)
        log.append(
            STREAM,
            TurnStarted(turn=1, input_bytes=QUESTION, input_digest=digest(Domain.INPUT, QUESTION)),
        )
        log.rotate_key(STREAM, [user.recipient, appliance.recipient])
    finally:
        log.close()
    bundle = folder / "bundle"
    export_stream(store, STREAM, bundle)
    return Written(bundle, user, user.to_pem(), signer, signer.vkey())


def test_the_written_bundle_is_valid_for_both(written: Written) -> None:
    assert [json.loads(line)["kind"] for line in _lines(written.bundle)] == [
        "stream.opened",
        "pins.set",
        "model.request",
        "model.response",
        "evidence.archived",
        "turn.started",
        "key.rotated",
    ]
    assert written.judge(written.bundle, key=False) == []
    assert written.judge(written.bundle, key=True) == []


# -- 1. the kinds ----------------------------------------------------------------------------


def test_every_count_of_the_kinds_is_the_number_there_are() -> None:
    """§4.1 said "one of the 12 kinds" while §5.1 listed 13 (now 15): every count agrees."""
    text = DOC.read_text(encoding="utf-8")
    table = re.findall(r"^\| `([a-z]+\.[a-z]+)` \| (?:\*\*clear\*\*|sealed) \|", text, re.M)
    counts = re.findall(r"\b(\d+|twelve|thirteen|fourteen|fifteen) (?:entry )?kinds\b", text)
    assert counts == ["15"]
    assert len(table) == len(set(table)) == len(BODY_MODELS) == 15
    assert sorted(table) == sorted(BODY_MODELS) == sorted(independent_reader.BODY_SCHEMAS)


def test_a_kind_outside_the_fifteen_is_a_malformed_entry(written: Written, tmp_path: Path) -> None:
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    lines[STARTED] = lines[STARTED].replace(b'"kind":"turn.started"', b'"kind":"turn.paused"')
    written.rewrite(bundle, lines)
    # the line is not an entry, so its seq is never seen (§12 step 5)
    assert written.judge(bundle, key=False) == [("malformed_entry", None), ("seq_gap", STARTED)]


# -- 2. one fault, one code; 4. left-out and extra members -----------------------------------
#
# Each case: (line, edit of its body as a JSON value, found without a key, found with one).
# A clear body is judged the same with or without a key [malformed_entry]; a sealed one only
# with a key [malformed_body]. key.rotated is the last entry: no sealed body needs its key.

Edit = Callable[[dict[str, Any]], dict[str, Any]]


def _drop(*names: str) -> Edit:
    return lambda body: {k: v for k, v in body.items() if k not in names}


def _set(**members: Any) -> Edit:
    return lambda body: body | members


def _inner(name: str, index: int | None, **members: Any) -> Edit:
    """``members`` added to the object ``body[name]`` (or to ``body[name][index]``)."""

    def edit(body: dict[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(body))
        target = out[name] if index is None else out[name][index]
        target.update(members)
        return out

    return edit


MALFORMED_ROTATED = [("malformed_entry", ROTATED)]
NO_EPOCH_0 = [("cannot_open", s) for s in range(PINS, ROTATED)] + [("malformed_entry", OPENED)]
BODY_CASES: dict[str, tuple[int, Edit, Found, Found]] = {
    # 2. a clear body: malformed_entry, key or not (the document said malformed_body in §13)
    "clear: unknown member": (ROTATED, _set(surprise=1), MALFORMED_ROTATED, MALFORMED_ROTATED),
    "clear: kind of another": (
        ROTATED,
        _set(kind="stream.opened"),
        MALFORMED_ROTATED,
        MALFORMED_ROTATED,
    ),
    "clear: kind left out": (ROTATED, _drop("kind"), MALFORMED_ROTATED, MALFORMED_ROTATED),
    "clear: labels not strings": (
        OPENED,
        _set(labels={"site": 1}),
        [("malformed_entry", OPENED)],
        # it brings no data key: no body of epoch 0 opens
        NO_EPOCH_0,
    ),
    # 2. a sealed body: malformed_body, found only with a key
    "sealed: unknown member": (STARTED, _set(surprise=1), [], [("malformed_body", STARTED)]),
    "sealed: kind of another": (
        STARTED,
        _set(kind="turn.ended"),
        [],
        [("malformed_body", STARTED)],
    ),
    "sealed: kind left out": (STARTED, _drop("kind"), [], [("malformed_body", STARTED)]),
    # 4. left out: "or null" members read as null, the five defaulted ones as their default
    "left out: every or-null member of model.request": (
        REQUEST,
        _drop("pins", "clock", "clock_rule", "turn", "step", "retrieval"),
        [],
        [],
    ),
    "left out: provider.api_version": (
        REQUEST,
        lambda body: body | {"provider": {"name": "embedded", "endpoint": "http://x/v1"}},
        [],
        [],
    ),
    "left out: pins.set.cache_mode": (PINS, _drop("cache_mode"), [], []),
    "left out: stream.opened defaults": (OPENED, _drop("aead", "hpke_suite", "labels"), [], []),
    "left out: every or-null member of model.response": (
        RESPONSE,
        _drop("status", "error_bytes", "error_digest", "fingerprint", "reproducibility"),
        [],
        [],
    ),
    # 4. ... but a defaulted member is never null, and every other member must be there
    "null: model.request.retrieval": (
        REQUEST,
        _set(retrieval=None),
        [],
        [("malformed_body", REQUEST)],
    ),
    "null: pins.set.cache_mode": (PINS, _set(cache_mode=None), [], [("malformed_body", PINS)]),
    "null: stream.opened.labels": (
        OPENED,
        _set(labels=None),
        [("malformed_entry", OPENED)],
        NO_EPOCH_0,
    ),
    "left out: model.request.model_id": (
        REQUEST,
        _drop("model_id"),
        [],
        [("malformed_body", REQUEST)],
    ),
    "left out: key.rotated.key_epoch": (
        ROTATED,
        _drop("key_epoch"),
        MALFORMED_ROTATED,
        MALFORMED_ROTATED,
    ),
    # 4. provider, retrieval[] and WrappedKey are closed; params and labels are open
    "extra: provider": (
        REQUEST,
        _inner("provider", None, region="eu"),
        [],
        [("malformed_body", REQUEST)],
    ),
    "extra: retrieval item": (
        REQUEST,
        _inner("retrieval", 0, score=1),
        [],
        [("malformed_body", REQUEST)],
    ),
    "extra: wrapped key": (
        ROTATED,
        _inner("recipients", 1, note="x"),
        MALFORMED_ROTATED,
        MALFORMED_ROTATED,
    ),
    "extra: params may hold anything": (
        REQUEST,
        _inner("params", None, vendor={"x": [1, -2.5, None]}),
        [],
        [],
    ),
    "extra: labels may have any name": (
        OPENED,
        _inner("labels", None, **{"any name ☃": "v"}),
        [],
        [],
    ),
    # 5. integers are 0 … 2^53 - 1 in every body member
    "negative: model.response.status": (
        RESPONSE,
        _set(status=-1),
        [],
        [("malformed_body", RESPONSE)],
    ),
    "negative: model.request.step": (REQUEST, _set(step=-1), [], [("malformed_body", REQUEST)]),
    "too large: model.request.turn": (
        REQUEST,
        _set(turn=2**53),
        [],
        [("malformed_body", REQUEST)],
    ),
    # 6. evidence.archived.file is a plain name
    "not plain: evidence.archived.file": (
        EVIDENCE,
        _set(file="../report.bin"),
        [],
        [("malformed_body", EVIDENCE)],
    ),
}


def _edited(written: Written, tmp_path: Path, seq: int, edit: Edit) -> Path:
    """The bundle with body ``seq`` replaced by ``edit`` of it (resealed if sealed), signed."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    body = _body(lines[seq])
    if isinstance(body, dict):
        lines[seq] = _clear(lines[seq], edit(body))
    else:
        entries = [parse_entry(line) for line in lines]
        keys = StreamKeys.collect(STREAM, entries, written.user)
        opened = keys.open(entries[seq]).model_dump(mode="json")
        lines[seq] = written.sealed(seq, edit(opened))
    written.rewrite(bundle, lines)
    return bundle


@pytest.mark.parametrize("case", list(BODY_CASES))
def test_a_body_fault_gets_one_code_in_both_verifiers(
    written: Written, tmp_path: Path, case: str
) -> None:
    seq, edit, without_key, with_key = BODY_CASES[case]
    bundle = _edited(written, tmp_path, seq, edit)
    assert written.judge(bundle, key=False) == without_key
    assert written.judge(bundle, key=True) == with_key


def test_left_out_members_read_as_the_document_says_in_both(
    written: Written, tmp_path: Path
) -> None:
    """§5.2: what a reader sees for a left-out member is the same in both readers."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    entries = [parse_entry(line) for line in lines]
    keys = StreamKeys.collect(STREAM, entries, written.user)
    request = keys.open(entries[REQUEST]).model_dump(mode="json")
    request = {k: v for k, v in request.items() if k not in ("retrieval", "turn", "clock")}
    request["provider"] = {"name": "embedded", "endpoint": "http://x/v1"}
    lines[REQUEST] = written.sealed(REQUEST, request)
    lines[PINS] = written.sealed(PINS, {"kind": "pins.set", "pins": {}})
    opened = _body(lines[OPENED])
    lines[OPENED] = _clear(lines[OPENED], {k: opened[k] for k in opened if k != "labels"})
    written.rewrite(bundle, lines)
    independent = independent_reader.verify_bundle(bundle, private_key_pem=written.pem)
    assert independent.problems == []
    entries = [parse_entry(line) for line in _lines(bundle)]
    keys = StreamKeys.collect(STREAM, entries, written.user)
    for seq in (OPENED, PINS, REQUEST):
        assert independent.bodies[seq] == keys.open(entries[seq]).model_dump(mode="json")
    assert independent.bodies[REQUEST]["retrieval"] == []
    assert independent.bodies[REQUEST]["provider"]["api_version"] is None
    assert (independent.bodies[REQUEST]["turn"], independent.bodies[REQUEST]["clock"]) == (
        None,
    ) * 2
    assert independent.bodies[PINS]["cache_mode"] == "strict"
    assert independent.bodies[OPENED]["labels"] == {}


def test_both_readers_let_the_same_members_be_left_out() -> None:
    """§5.2's list, as the code's models and the independent reader's table hold it."""
    for kind, model in BODY_MODELS.items():
        members, optional = independent_reader.BODY_SCHEMAS[kind]
        assert set(members) | {"kind"} == set(model.model_fields), kind
        code = {name for name, info in model.model_fields.items() if not info.is_required()}
        assert code - {"kind"} == set(optional), kind
        defaults = {
            name: model.model_fields[name].get_default(call_default_factory=True)
            for name in optional
        }
        assert defaults == independent_reader.DEFAULTS[kind], kind
    assert not Provider.model_fields["api_version"].is_required()
    assert all(info.is_required() for info in RetrievalItem.model_fields.values())


# -- 3. wrapped keys; 5. base64 -----------------------------------------------------------------


def _rotated(
    written: Written, tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None]
) -> Path:
    """The bundle with key.rotated's ``recipients`` edited in place (first is the user's)."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    body = _body(lines[ROTATED])
    assert body["recipients"][0]["recipient"] == written.user.recipient.text()
    edit(body["recipients"])
    lines[ROTATED] = _clear(lines[ROTATED], body)
    written.rewrite(bundle, lines)
    return bundle


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _padding_bits_set(text: str) -> str:
    """The same bytes (to a lenient decoder), spelled with non-zero padding bits (§1)."""
    assert text.endswith("=")
    head = text.rstrip("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    spelled = head[:-1] + alphabet[alphabet.index(head[-1]) + 1] + text[len(head) :]
    assert base64.b64decode(spelled) == base64.b64decode(text) and spelled != text
    return spelled


def _sealed_key(size: int) -> Callable[[list[dict[str, Any]]], None]:
    def edit(recipients: list[dict[str, Any]]) -> None:
        raw = base64.b64decode(recipients[0]["sealed_key"])
        recipients[0]["sealed_key"] = _b64((raw * 2)[:size])

    return edit


WRAPPED_CASES: dict[str, tuple[Callable[[list[dict[str, Any]]], None], Found]] = {
    # the wrong length: a malformed clear body, key or not; never cannot_open
    "sealed_key of 79 bytes": (_sealed_key(79), MALFORMED_ROTATED),
    "sealed_key of 81 bytes": (_sealed_key(81), MALFORMED_ROTATED),
    "recipient of 31 bytes": (
        lambda r: r[1].update(recipient=_b64(base64.b64decode(r[1]["recipient"])[:31])),
        MALFORMED_ROTATED,
    ),
    # not canonical base64, though a lenient decoder reads the same bytes
    "recipient with padding bits": (
        lambda r: r[1].update(recipient=_padding_bits_set(r[1]["recipient"])),
        MALFORMED_ROTATED,
    ),
    "sealed_key with padding bits": (
        lambda r: r[1].update(sealed_key=_padding_bits_set(r[1]["sealed_key"])),
        MALFORMED_ROTATED,
    ),
}


@pytest.mark.parametrize("case", list(WRAPPED_CASES))
def test_a_wrapped_key_that_is_not_well_formed_is_a_malformed_entry(
    written: Written, tmp_path: Path, case: str
) -> None:
    edit, found = WRAPPED_CASES[case]
    bundle = _rotated(written, tmp_path, edit)
    assert written.judge(bundle, key=False) == found
    assert written.judge(bundle, key=True) == found


def test_a_well_formed_wrapped_key_that_does_not_open_is_cannot_open(
    written: Written, tmp_path: Path
) -> None:
    """80 bytes, canonical, but not sealed to this key: only a key finds it, at its seq."""

    def garble(recipients: list[dict[str, Any]]) -> None:
        raw = bytearray(base64.b64decode(recipients[0]["sealed_key"]))
        raw[40] ^= 1
        recipients[0]["sealed_key"] = _b64(bytes(raw))

    bundle = _rotated(written, tmp_path, garble)
    assert written.judge(bundle, key=False) == []
    assert written.judge(bundle, key=True) == [("cannot_open", ROTATED)]


def _sealed_line_with_padding(lines: list[bytes]) -> int:
    return next(
        seq for seq, line in enumerate(lines) if isinstance(_body(line), str) and b'=",' in line
    )


def test_a_sealed_body_in_non_canonical_base64_is_a_malformed_entry(
    written: Written, tmp_path: Path
) -> None:
    """§4.4: checked without a key, in the line; the same bytes to a lenient decoder."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    seq = _sealed_line_with_padding(lines)
    body = _body(lines[seq])
    lines[seq] = lines[seq].replace(body.encode(), _padding_bits_set(body).encode())
    written.rewrite(bundle, lines)
    assert written.judge(bundle, key=False) == [("malformed_entry", None), ("seq_gap", seq)]


def test_a_bytes_member_in_non_canonical_base64_is_a_malformed_body(
    written: Written, tmp_path: Path
) -> None:
    """§5.2: ``input_bytes`` "SGkhPw==" spelled "SGkhPx==": its digest would still match."""
    bundle = _edited(
        written,
        tmp_path,
        STARTED,
        lambda body: body | {"input_bytes": _padding_bits_set(body["input_bytes"])},
    )
    assert written.judge(bundle, key=False) == []
    assert written.judge(bundle, key=True) == [("malformed_body", STARTED)]


def test_a_checkpoint_root_in_non_canonical_base64_is_invalid(
    written: Written, tmp_path: Path
) -> None:
    """§10: signed by the log key, but its root is spelled with padding bits: nothing signs."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    written.rewrite(bundle, lines)
    note = bundle / "checkpoints" / "000000.note"
    text = note.read_text().split("\n\n")[0] + "\n"
    origin, size, root = text.splitlines()
    spelled = f"{origin}\n{size}\n{_padding_bits_set(root)}\n"
    note.write_bytes(written.signer.sign_note(spelled))
    assert written.judge(bundle, key=False) == [
        ("checkpoint_invalid", None),
        ("unsigned_tail", 0),
    ]


# -- 5. integers in the envelope ---------------------------------------------------------------


@pytest.mark.parametrize("member", ["key_epoch", "seq"])
def test_a_negative_envelope_integer_is_a_malformed_entry(
    written: Written, tmp_path: Path, member: str
) -> None:
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    entries = [parse_entry(line) for line in lines]
    body = StreamKeys.collect(STREAM, entries, written.user).open(entries[STARTED])
    lines[STARTED] = written.sealed(STARTED, body.model_dump(mode="json"), **{member: -1})
    written.rewrite(bundle, lines)
    assert written.judge(bundle, key=False) == [("malformed_entry", None), ("seq_gap", STARTED)]


# -- 5. a bundle no checkpoint signs; a bundle with no entry -----------------------------------


def _without_checkpoints(written: Written, tmp_path: Path) -> Path:
    bundle = written.copy(tmp_path)
    for note in (bundle / "checkpoints").glob("*.note"):
        note.unlink()
    index = json.loads((bundle / "bundle.json").read_bytes())
    (bundle / "bundle.json").write_text(json.dumps(index | {"checkpoints": 0}, indent=2) + "\n")
    return bundle


@pytest.mark.parametrize("allow", [False, True], ids=["strict", "allow-unsigned-tail"])
def test_a_bundle_no_checkpoint_signs_is_never_valid(
    written: Written, tmp_path: Path, allow: bool
) -> None:
    """§12 step 8, c = 0: every line is unsigned, and no tolerance lifts it."""
    bundle = _without_checkpoints(written, tmp_path)
    assert written.judge(bundle, key=False, allow_unsigned_tail=allow) == [("unsigned_tail", 0)]
    assert written.judge(bundle, key=True, allow_unsigned_tail=allow) == [("unsigned_tail", 0)]


def test_checkpoints_under_another_log_key_sign_nothing_even_when_a_tail_is_allowed(
    written: Written, tmp_path: Path
) -> None:
    other = Signer.generate(LOG_KEY_NAME).vkey()
    bundle = written.copy(tmp_path)
    reference = verify_bundle(bundle, log_key=other, allow_unsigned_tail=True)
    independent = independent_reader.verify_bundle(bundle, log_key=other, allow_unsigned_tail=True)
    assert reference.codes() == independent.codes() == {"checkpoint_invalid", "unsigned_tail"}


def test_a_tail_after_a_matching_checkpoint_is_still_tolerated(
    written: Written, tmp_path: Path
) -> None:
    """The contrast: c > 0, so --allow-unsigned-tail lifts the tail (and counts it)."""
    bundle = written.copy(tmp_path)
    notes = sorted((bundle / "checkpoints").glob("*.note"))
    notes[-1].unlink()  # the size-7 one: line 6 is left unsigned
    index = json.loads((bundle / "bundle.json").read_bytes())
    (bundle / "bundle.json").write_text(json.dumps(index | {"checkpoints": len(notes) - 1}))
    assert written.judge(bundle, key=True) == [("unsigned_tail", ROTATED)]
    assert written.judge(bundle, key=True, allow_unsigned_tail=True) == []
    reference = verify_bundle(bundle, log_key=written.vkey, allow_unsigned_tail=True)
    independent = independent_reader.verify_bundle(
        bundle, log_key=written.vkey, allow_unsigned_tail=True
    )
    assert reference.unsigned == {STREAM: 1} and independent.uncovered == 1


def _log_verify(bundle: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", "log", "verify", str(bundle), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=bundle.parent,
    )


def test_the_cli_refuses_a_bundle_no_checkpoint_signs_even_when_a_tail_is_allowed(
    written: Written, tmp_path: Path
) -> None:
    bundle = _without_checkpoints(written, tmp_path)
    flags = ("--log-key", written.vkey, "--allow-unsigned-tail")
    run = _log_verify(bundle, *flags, "--json")
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    assert [(p["code"], p["seq"]) for p in doc["problems"]] == [("unsigned_tail", 0)]
    assert doc["unsigned_tail"] == {STREAM: 7}
    text = _log_verify(bundle, *flags)
    assert text.returncode == 1 and text.stdout.startswith("FAILED: "), text.stdout
    assert "unsigned_tail" in text.stdout and "allowed:" not in text.stdout


def test_a_bundle_with_no_entry_is_malformed(written: Written, tmp_path: Path) -> None:
    """§12 step 2: a stream always holds its stream.opened; an empty one is no bundle."""
    bundle = _without_checkpoints(written, tmp_path)
    written.rewrite(bundle, [], sign=False)
    assert written.judge(bundle, key=False) == [("malformed_bundle", None)]
    assert written.judge(bundle, key=False, allow_unsigned_tail=True) == [
        ("malformed_bundle", None)
    ]


# -- 6. evidence files ---------------------------------------------------------------------------


def _index_evidence(bundle: Path, names: list[str]) -> None:
    index = json.loads((bundle / "bundle.json").read_bytes())
    (bundle / "bundle.json").write_text(json.dumps(index | {"evidence": names}, indent=2))


def _evidence_missing(bundle: Path) -> None:
    (bundle / "evidence" / "report.bin").unlink()


def _evidence_unlisted(bundle: Path) -> None:
    (bundle / "evidence" / "extra.bin").write_bytes(b"slipped in")


def _evidence_added_and_listed(bundle: Path) -> None:
    _evidence_unlisted(bundle)
    _index_evidence(bundle, ["extra.bin", "report.bin"])


def _evidence_changed(bundle: Path) -> None:
    file = bundle / "evidence" / "report.bin"
    file.write_bytes(file.read_bytes() + b"\n")


def _evidence_index_not_plain(bundle: Path) -> None:
    _index_evidence(bundle, ["../report.bin"])


def _evidence_a_folder(bundle: Path) -> None:
    _evidence_missing(bundle)
    (bundle / "evidence" / "report.bin").mkdir()


EVIDENCE_CASES: dict[str, tuple[Callable[[Path], None], Found, Found]] = {
    # (edit, found without a key: bundle.json against evidence/, found with one: + the entries)
    "file deleted": (
        _evidence_missing,
        [("evidence_missing", None)],
        [("evidence_missing", EVIDENCE), ("evidence_missing", None)],
    ),
    "file a folder": (
        _evidence_a_folder,
        [("evidence_missing", None)],
        [("evidence_missing", EVIDENCE), ("evidence_missing", None)],
    ),
    "file added": (
        _evidence_unlisted,
        [("evidence_unlisted", None)],
        [("evidence_unlisted", None), ("evidence_unlisted", None)],
    ),
    "file added and listed": (_evidence_added_and_listed, [], [("evidence_unlisted", None)]),
    "file changed": (_evidence_changed, [], [("evidence_digest_mismatch", EVIDENCE)]),
    "index names a path": (
        _evidence_index_not_plain,
        [("malformed_bundle", None)],
        [("malformed_bundle", None)],
    ),
}


@pytest.mark.parametrize("case", list(EVIDENCE_CASES))
def test_evidence_files_have_their_own_codes(written: Written, tmp_path: Path, case: str) -> None:
    edit, without_key, with_key = EVIDENCE_CASES[case]
    bundle = written.copy(tmp_path)
    edit(bundle)
    assert written.judge(bundle, key=False) == without_key
    assert written.judge(bundle, key=True) == with_key


def test_an_unvouched_file_is_not_judged_while_a_body_does_not_open(
    written: Written, tmp_path: Path
) -> None:
    """§13 step 4: the entry naming a file might be one that did not open, so only the bodies'
    own problems are reported."""
    bundle = _edited(written, tmp_path, EVIDENCE, lambda body: body | {"file": ".hidden"})
    _evidence_added_and_listed(bundle)
    assert written.judge(bundle, key=True) == [("malformed_body", EVIDENCE)]


def test_epochs_count_clear_entries_by_position_valid_or_not(
    written: Written, tmp_path: Path
) -> None:
    """§12 step 5: the k-th clear entry brings epoch k; a clear body that is not valid takes
    its place and is reported once (step 6), so the valid rotation after it is not blamed."""
    bundle = written.copy(tmp_path)
    lines = _lines(bundle)
    rotated = _body(lines[ROTATED])
    lines[ROTATED] = _clear(lines[ROTATED], rotated | {"surprise": 1})
    envelope = json.loads(lines[ROTATED])
    del envelope["body"]
    envelope |= {"seq": ROTATED + 1, "event_id": str(uuid6.uuid7()), "key_epoch": 2}
    wrapped = written.user.recipient.wrap(new_data_key(), STREAM, 2)
    again = {"kind": "key.rotated", "key_epoch": 2, "recipients": []}
    again["recipients"] = [
        {"recipient": written.user.recipient.text(), "sealed_key": _b64(wrapped)}
    ]
    lines.append(entry_line(envelope, again)[0])
    opened = json.loads(lines[OPENED])  # and a second stream.opened, valid, at epoch 3
    opened |= {"seq": ROTATED + 2, "event_id": str(uuid6.uuid7()), "key_epoch": 3}
    lines.append(_clear(json.dumps(opened).encode(), opened["body"] | {"key_epoch": 3}))
    written.rewrite(bundle, lines)
    found = [("malformed_entry", ROTATED), ("malformed_entry", ROTATED + 2)]
    assert written.judge(bundle, key=False) == found
    # with a key: the copied wrapped key was sealed for epoch 0, not 3
    assert written.judge(bundle, key=True) == [("cannot_open", ROTATED + 2), *found]


# -- 7. boot bundles -----------------------------------------------------------------------------

BOOT = "boot-1"
SESSION = "session-1"


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """An appliance-like store: a boot-evidence stream (sealed to the appliance alone, two
    evidence files) and a user's session, exported as the session's bundle."""
    folder = tmp_path_factory.mktemp("format-boot")
    user, appliance = KeyPair.generate(), KeyPair.generate()
    signer = Signer.generate(LOG_KEY_NAME)
    store = folder / "record.db"
    log = Log(SQLiteStore(store), signer, appliance_key=appliance)
    try:
        log.open_stream(BOOT, [appliance.recipient], {"affidavit/boot-evidence": "20261201T1200Z"})
        log.archive_evidence(BOOT, "sev-snp", "snp-1.report", REPORT)
        log.archive_evidence(BOOT, "sev-snp", "snp-1.certs.pem", b"certificates\n")
        log.open_stream(SESSION, [user.recipient, appliance.recipient])
        log.append(SESSION, PinsSet(pins={"seed": 42}))
    finally:
        log.close()
    bundle = folder / "bundle"
    export_stream(store, SESSION, bundle)
    return Written(bundle, user, user.to_pem(), signer, signer.vkey())


def _index_boot(bundle: Path, names: Any) -> None:
    index = json.loads((bundle / "bundle.json").read_bytes())
    (bundle / "bundle.json").write_text(json.dumps(index | {"boot": names}, indent=2))


def _boot_under_another_log_key(bundle: Path) -> None:
    """The boot folder replaced by the same stream kept by another log."""
    other = bundle.parent / "other.db"
    with Log.open(other) as log:
        log.open_stream(BOOT, [KeyPair.generate().recipient], {"affidavit/boot-evidence": "x"})
        log.archive_evidence(BOOT, "sev-snp", "snp-1.report", REPORT)
    shutil.rmtree(bundle / "boot" / BOOT)
    export_stream(other, BOOT, bundle / "boot" / BOOT)


BOOT_CASES: dict[str, tuple[Callable[[Path], None], Found]] = {
    # (edit, found with or without a key: the boot bundle is always judged without one)
    "boot evidence file deleted": (
        lambda b: (b / "boot" / BOOT / "evidence" / "snp-1.report").unlink(),
        [("evidence_missing", None)],
    ),
    "boot evidence file added": (
        lambda b: (b / "boot" / BOOT / "evidence" / "extra").write_bytes(b"slipped in"),
        [("evidence_unlisted", None)],
    ),
    "boot bundle deleted": (
        lambda b: shutil.rmtree(b / "boot" / BOOT),
        [("evidence_missing", None)],
    ),
    "boot bundle unlisted": (lambda b: _index_boot(b, []), [("evidence_unlisted", None)]),
    "boot list names a path": (lambda b: _index_boot(b, ["../x"]), [("malformed_bundle", None)]),
    "boot bundle holding a boot folder": (
        lambda b: (b / "boot" / BOOT / "boot").mkdir(),
        [("malformed_bundle", None)],
    ),
    "boot line cut": (
        lambda b: (b / "boot" / BOOT / "entries.jsonl").write_bytes(
            (b / "boot" / BOOT / "entries.jsonl").read_bytes().splitlines(keepends=True)[0]
        ),
        [("malformed_bundle", None), ("truncated", 1), ("truncated", 1)],
    ),
    "boot bundle under another log key": (
        _boot_under_another_log_key,
        [
            ("checkpoint_invalid", 0),
            ("checkpoint_invalid", None),
            ("checkpoint_invalid", None),
            ("checkpoint_invalid", None),
            ("unsigned_tail", 0),
        ],
    ),
}


def test_a_session_bundle_with_its_boot_bundle_is_valid_for_both(booted: Written) -> None:
    index = json.loads((booted.bundle / "bundle.json").read_bytes())
    assert index["boot"] == [BOOT]
    assert sorted(p.name for p in (booted.bundle / "boot" / BOOT / "evidence").iterdir()) == [
        "snp-1.certs.pem",
        "snp-1.report",
    ]
    assert booted.judge(booted.bundle, key=False) == []
    assert booted.judge(booted.bundle, key=True) == []
    # a bundle written before boot bundles existed: no boot member, no boot/ folder
    shutil.rmtree(booted.bundle.parent / "older", ignore_errors=True)
    older = shutil.copytree(booted.bundle, booted.bundle.parent / "older")
    shutil.rmtree(older / "boot")
    index.pop("boot")
    (older / "bundle.json").write_text(json.dumps(index, indent=2))
    assert booted.judge(older, key=False) == []


@pytest.mark.parametrize("case", list(BOOT_CASES))
def test_a_boot_bundle_is_judged_as_the_document_says(
    booted: Written, tmp_path: Path, case: str
) -> None:
    edit, found = BOOT_CASES[case]
    bundle = booted.copy(tmp_path)
    edit(bundle)
    assert booted.judge(bundle, key=False) == found
    assert booted.judge(bundle, key=True) == found
