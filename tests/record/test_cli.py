"""``affidavit log …`` as a real subprocess against real stores and bundles.

- ``log verify PATH [--key] [--against] [--log-key] [--json]``: exit 0 clean, 1 problem found
  (a tampered store, a digest that only a key can check, a malformed bundle, a rolled-back or
  forked log against a kept checkpoint), 2 usage error, 3 a file it needs is missing; the
  ``--json`` document has exactly ``ok``, ``entries``, ``problems`` and each problem exactly
  ``code``, ``stream``, ``seq``, ``detail``;
- ``log export``: a self-contained bundle (entries byte for byte as stored, every checkpoint,
  the log key, the recipients, the schema version, ``evidence/`` when evidence was archived)
  that verifies on its own, elsewhere;
- ``log show``: decrypted with a key, redacted at read time; the stored bytes and the Merkle
  root are the same afterwards;
- ``log key``: the vkey that verifies the store's checkpoints (and no other key does).

In process, ``affidavit.cli.main`` returns the exit code of a record error a command raises
(and lets any other exception through), and ``record.cli.register`` adds ``keys`` and ``log``
to any typer app.

Stores are written in-process with ``record.log.Log`` (the ``write_turn`` fixture appends a
realistic tool-using turn); every check of stored bytes reads them with ``sqlite3`` directly,
and Merkle roots are recomputed with ``merkle_reference`` (RFC 9162 from the text).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import merkle_reference as ref
import pytest
import typer

from affidavit.cli import main
from record import cli as record_cli
from record.checkpoint import CheckpointError, Signer, Verifier, open_checkpoint
from record.digest import Domain, digest
from record.errors import StoreMissing, UnknownStream
from record.log import LOG_KEY_NAME, Log
from record.reader import StreamKeys
from record.schema import EvidenceArchived, ModelResponse, parse_entry
from record.seal import KeyPair
from tests.record.raw_store import stored_lines

SESSION = "session-1"
OTHER = "session-2"
SECRET = b" SECRET-4711"
EVIDENCE = b"\x00\x01SEV-SNP report \xff\xfe" * 40
PROBLEM_KEYS = {"code", "stream", "seq", "detail"}


# -- helpers -----------------------------------------------------------------------------------


def affidavit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=120,
    )


def report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``--json`` document, checked for its exact shape."""
    assert result.stderr == "", result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    assert set(doc) == {"ok", "entries", "problems", "unsigned_tail"}
    assert isinstance(doc["ok"], bool) and isinstance(doc["entries"], int)
    assert all(isinstance(n, int) and n >= 0 for n in doc["unsigned_tail"].values())
    for problem in doc["problems"]:
        assert set(problem) == PROBLEM_KEYS, problem
        assert isinstance(problem["code"], str) and isinstance(problem["detail"], str)
        assert isinstance(problem["stream"], str)
        assert problem["seq"] is None or isinstance(problem["seq"], int)
    assert doc["ok"] == (doc["problems"] == [])
    return doc


def codes(doc: dict[str, Any]) -> set[str]:
    return {p["code"] for p in doc["problems"]}


def sql(store: Path, query: str, *params: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def stored_notes(store: Path, stream: str) -> list[bytes]:
    rows = sql(store, "SELECT note FROM checkpoints WHERE stream = ? ORDER BY id", stream)
    return [bytes(r[0]) for r in rows]


def fingerprint(store: Path) -> tuple[str, str]:
    """sha256 of the database file and of its WAL (an absent WAL counts as empty)."""
    wal = store.with_name(store.name + "-wal")
    return (
        hashlib.sha256(store.read_bytes()).hexdigest(),
        hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest(),
    )


def snapshot(store: Path, to: Path) -> None:
    """A consistent copy of a store (SQLite's online backup), e.g. an old state of it."""
    src = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    dst = sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


@dataclass
class Recorded:
    dir: Path
    store: Path
    signing_key: Path
    user: KeyPair
    user_key: Path
    appliance: KeyPair
    auditor: KeyPair
    stranger_key: Path


@pytest.fixture
def recorded(tmp_path: Path, write_turn: Any) -> Recorded:
    """Two streams; SESSION has two turns, a key rotation adding an auditor, and evidence."""
    user, appliance, auditor, stranger = (KeyPair.generate() for _ in range(4))
    user.write(tmp_path / "user.key")
    stranger.write(tmp_path / "stranger.key")
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(SESSION, [user.recipient, appliance.recipient])
        write_turn(log, SESSION, 0, tag=SECRET)
        log.rotate_key(SESSION, [user.recipient, appliance.recipient, auditor.recipient])
        write_turn(log, SESSION, 1)
        log.archive_evidence(SESSION, "sev-snp", "report.bin", EVIDENCE)
        log.checkpoint(SESSION)
        log.open_stream(OTHER, [user.recipient])
        write_turn(log, OTHER, 0)
    return Recorded(
        dir=tmp_path,
        store=store,
        signing_key=tmp_path / "record.db.signing-key",
        user=user,
        user_key=tmp_path / "user.key",
        appliance=appliance,
        auditor=auditor,
        stranger_key=tmp_path / "stranger.key",
    )


# -- log verify: exit codes and the JSON document ----------------------------------------------


def test_verify_clean_store(recorded: Recorded) -> None:
    total = sql(recorded.store, "SELECT COUNT(*) FROM entries")[0][0]
    assert total > 20

    plain = affidavit("log", "verify", recorded.store, cwd=recorded.dir)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.startswith("ok: ")
    assert f"{total} entries" in plain.stdout

    doc = report(affidavit("log", "verify", recorded.store, "--json", cwd=recorded.dir))
    streams = [r[0] for r in sql(recorded.store, "SELECT DISTINCT stream FROM entries")]
    assert doc == {
        "ok": True,
        "entries": total,
        "problems": [],
        "unsigned_tail": dict.fromkeys(sorted(streams), 0),  # every commit was signed
    }

    keyed = affidavit(
        "log", "verify", recorded.store, "--key", recorded.user_key, "--json", cwd=recorded.dir
    )
    assert keyed.returncode == 0
    assert report(keyed) == {**doc, "ok": True}


def test_verify_tampered_store_is_a_problem_found(recorded: Recorded) -> None:
    tampered = recorded.dir / "tampered.db"
    snapshot(recorded.store, tampered)
    line = stored_lines(tampered, SESSION)[2]
    entry = json.loads(line)
    body = entry["body"]
    entry["body"] = ("A" if body[0] != "A" else "B") + body[1:]  # one character of ciphertext
    conn = sqlite3.connect(tampered)
    conn.execute("DROP TRIGGER entries_no_update")  # editing by hand, as an attacker would
    conn.execute(
        "UPDATE entries SET line = ? WHERE stream = ? AND seq = 2",
        (json.dumps(entry, separators=(",", ":"), sort_keys=True).encode(), SESSION),
    )
    conn.commit()
    conn.close()

    human = affidavit("log", "verify", tampered, cwd=recorded.dir)
    assert human.returncode == 1
    assert human.stdout.startswith("FAILED: ")
    assert "leaf_mismatch" in human.stdout

    result = affidavit("log", "verify", tampered, "--json", cwd=recorded.dir)
    assert result.returncode == 1
    doc = report(result)
    assert doc["ok"] is False
    assert {"leaf_mismatch", "root_mismatch"} <= codes(doc)
    leaf = next(p for p in doc["problems"] if p["code"] == "leaf_mismatch")
    assert (leaf["stream"], leaf["seq"]) == (SESSION, 2)
    assert all(p["stream"] == SESSION for p in doc["problems"])  # the other stream is fine

    keyed = report(
        affidavit("log", "verify", tampered, "--key", recorded.user_key, "--json", cwd=recorded.dir)
    )
    assert {"seq": 2, "code": "cannot_open"}.items() <= next(
        p for p in keyed["problems"] if p["code"] == "cannot_open"
    ).items()


def test_verify_digest_mismatch_is_found_only_with_a_key(tmp_path: Path, write_turn: Any) -> None:
    user = KeyPair.generate()
    user.write(tmp_path / "user.key")
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(SESSION, [user.recipient])
        written = write_turn(log, SESSION, 0, wrong_digest=True)
    without = affidavit("log", "verify", store, "--json", cwd=tmp_path)
    assert without.returncode == 0
    with_key = affidavit(
        "log", "verify", store, "--key", tmp_path / "user.key", "--json", cwd=tmp_path
    )
    assert with_key.returncode == 1
    doc = report(with_key)
    assert codes(doc) == {"body_digest_mismatch"}
    (problem,) = doc["problems"]
    assert problem["seq"] == written[6].seq
    assert "response_digest" in problem["detail"]


def test_verify_malformed_bundle_is_a_problem_found(recorded: Recorded) -> None:
    bundle = recorded.dir / "bundle"
    assert (
        affidavit(
            "log", "export", SESSION, "--store", recorded.store, "--out", bundle, cwd=recorded.dir
        ).returncode
        == 0
    )
    (bundle / "bundle.json").write_text("[1, 2")
    result = affidavit("log", "verify", bundle, "--json", cwd=recorded.dir)
    assert result.returncode == 1
    doc = report(result)
    assert codes(doc) == {"malformed_bundle"}
    assert "bundle.json" in doc["problems"][0]["detail"]


# -- --against: a checkpoint kept earlier ------------------------------------------------------


def test_against_a_kept_checkpoint(recorded: Recorded, write_turn: Any) -> None:
    old = recorded.dir / "old.db"
    snapshot(recorded.store, old)  # the log as it was before the next turn
    with Log.open(recorded.store, appliance_key=recorded.appliance) as log:
        write_turn(log, SESSION, 2)
    kept = recorded.dir / "kept.checkpoint"
    made = affidavit(
        "log", "checkpoint", SESSION, "--store", recorded.store, "--out", kept, cwd=recorded.dir
    )
    assert made.returncode == 0, made.stderr
    assert kept.read_bytes() == made.stdout.encode() == stored_notes(recorded.store, SESSION)[-1]

    same = affidavit("log", "verify", recorded.store, "--against", kept, cwd=recorded.dir)
    assert same.returncode == 0, same.stdout

    # rolled back: the old copy holds fewer entries than the kept checkpoint covers
    rolled = affidavit("log", "verify", old, "--against", kept, "--json", cwd=recorded.dir)
    assert rolled.returncode == 1
    doc = report(rolled)
    assert codes(doc) == {"truncated"}
    assert {p["stream"] for p in doc["problems"]} == {SESSION}
    assert affidavit("log", "verify", old, cwd=recorded.dir).returncode == 0  # alone it is fine

    # forked: same signing key, same size, other entries after the common prefix
    fork = recorded.dir / "fork.db"
    snapshot(old, fork)
    with Log.open(fork, signing_key=recorded.signing_key, appliance_key=recorded.appliance) as log:
        write_turn(log, SESSION, 2, tag=b" (forked)")
    assert len(stored_lines(fork, SESSION)) == len(stored_lines(recorded.store, SESSION))
    assert affidavit("log", "verify", fork, cwd=recorded.dir).returncode == 0  # alone it is fine
    forked = affidavit("log", "verify", fork, "--against", kept, "--json", cwd=recorded.dir)
    assert forked.returncode == 1
    assert codes(report(forked)) & {"checkpoint_inconsistent", "root_mismatch"}

    # several kept checkpoints at once, one per stream
    other = recorded.dir / "other.checkpoint"
    other.write_bytes(stored_notes(recorded.store, OTHER)[-1])
    both = affidavit(
        "log", "verify", recorded.store, "--against", kept, "--against", other, cwd=recorded.dir
    )
    assert both.returncode == 0, both.stdout


# -- exit 3: a file it needs is missing --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "missing"),
    [
        (["log", "verify", "{dir}/nope.db"], "nope.db"),
        (["log", "verify"], ".affidavit/record.db"),  # no PATH: the home's store
        (["log", "verify", "{dir}/record.db", "--key", "{dir}/nope.key"], "nope.key"),
        (["log", "verify", "{dir}/record.db", "--against", "{dir}/nope.note"], "nope.note"),
        (["log", "export", SESSION, "--store", "{dir}/nope.db", "--out", "{dir}/b"], "nope.db"),
        (["log", "show", SESSION, "--store", "{dir}/nope.db"], "nope.db"),
        (
            ["log", "show", SESSION, "--store", "{dir}/record.db", "--key", "{dir}/nope.key"],
            "nope.key",
        ),
        (["log", "key", "--store", "{dir}/nope.db"], "nope.db"),
        (["log", "checkpoint", SESSION, "--store", "{dir}/nope.db"], "nope.db"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_missing_file_exits_3(recorded: Recorded, args: list[str], missing: str) -> None:
    before = fingerprint(recorded.store)
    result = affidavit(*(a.format(dir=recorded.dir) for a in args), cwd=recorded.dir)
    assert result.returncode == 3, result.stdout + result.stderr
    assert missing in result.stderr
    assert result.stdout == ""
    assert not (recorded.dir / "nope.db").exists()
    assert not (recorded.dir / "b").exists()
    assert fingerprint(recorded.store) == before


# -- exit 2: usage errors ----------------------------------------------------------------------


def _listing(folder: Path) -> list[str]:
    """File names, leaving out SQLite's own -wal/-shm files (a reader may create those)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm")))


@pytest.mark.parametrize(
    "args",
    [
        ["log", "verify", "{dir}/record.db", "--bogus"],
        ["log"],
        ["log", "frobnicate"],
        ["log", "export", SESSION, "--store", "{dir}/record.db"],
        ["log", "show", "--store", "{dir}/record.db"],
        ["log", "show", SESSION, "--store", "{dir}/record.db", "--redact", "("],
        ["log", "show", SESSION, "--store", "{dir}/record.db", "--redact", "re:(unclosed"],
        ["log", "export", SESSION, "--store", "{dir}/record.db", "--out", "{dir}"],  # not empty
        ["log", "verify", "{dir}/record.db", "--key", "{dir}/record.db"],  # not a key file
        [],
    ],
    ids=lambda v: " ".join(v) or "(nothing)",
)
def test_usage_error_exits_2(recorded: Recorded, args: list[str]) -> None:
    listing = _listing(recorded.dir)
    before = fingerprint(recorded.store)
    result = affidavit(*(a.format(dir=recorded.dir) for a in args), cwd=recorded.dir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() != ""
    assert fingerprint(recorded.store) == before
    assert _listing(recorded.dir) == listing  # nothing written (no key, no bundle)


# -- log export --------------------------------------------------------------------------------


def test_export_writes_a_self_contained_bundle(recorded: Recorded) -> None:
    before = fingerprint(recorded.store)
    bundle = recorded.dir / "out" / "bundle"
    result = affidavit(
        "log", "export", SESSION, "--store", recorded.store, "--out", bundle, cwd=recorded.dir
    )
    assert result.returncode == 0, result.stderr
    assert fingerprint(recorded.store) == before

    lines = stored_lines(recorded.store, SESSION)
    notes = stored_notes(recorded.store, SESSION)
    vkey = sql(recorded.store, "SELECT value FROM meta WHERE key = 'log_key'")[0][0]

    # entries exactly as stored, one per line, nothing of the other stream
    data = (bundle / "entries.jsonl").read_bytes()
    assert data == b"".join(line + b"\n" for line in lines)
    assert data.split(b"\n")[:-1] == lines
    assert OTHER.encode() not in data
    # every checkpoint, in signing order
    files = sorted((bundle / "checkpoints").iterdir())
    assert [p.name for p in files] == [f"{i:06d}.note" for i in range(len(notes))]
    assert [p.read_bytes() for p in files] == notes
    assert len(notes) >= 3
    # the log key, the recipients (first seen order, the rotation's auditor included)
    assert (bundle / "log_key.pub").read_text() == vkey + "\n"
    recipients = [recorded.user, recorded.appliance, recorded.auditor]
    assert (bundle / "recipients.txt").read_text() == "".join(
        k.recipient.text() + "\n" for k in recipients
    )
    # the evidence, and the entry that vouches for it
    assert sorted(p.name for p in (bundle / "evidence").iterdir()) == ["report.bin"]
    assert (bundle / "evidence" / "report.bin").read_bytes() == EVIDENCE
    index = json.loads((bundle / "bundle.json").read_text())
    assert index == {
        "format": "affidavit-bundle/v1",
        "schema_version": "1.0",
        "stream": SESSION,
        "entries": len(lines),
        "checkpoints": len(notes),
        "log_key": vkey,
        "recipients": [k.recipient.text() for k in recipients],
        "evidence": ["report.bin"],
    }
    entries = [parse_entry(line) for line in data.split(b"\n")[:-1]]
    keys = StreamKeys.collect(SESSION, entries, recorded.auditor)
    archived = [keys.open(e) for e in entries if e.kind == "evidence.archived"]
    assert archived == [
        EvidenceArchived(
            evidence_kind="sev-snp",
            file="report.bin",
            evidence_digest=digest(Domain.EVIDENCE, EVIDENCE),
        )
    ]
    assert {p.name for p in bundle.iterdir()} == {
        "bundle.json",
        "entries.jsonl",
        "checkpoints",
        "log_key.pub",
        "recipients.txt",
        "evidence",
    }

    # self-contained: moved away from the store (which is then gone), it still verifies
    moved = recorded.dir / "elsewhere"
    shutil.copytree(bundle, moved)
    shutil.rmtree(recorded.dir / "out")
    recorded.store.rename(recorded.dir / "gone.db")
    alone = affidavit("log", "verify", moved, "--json", cwd=recorded.dir)
    assert alone.returncode == 0, alone.stdout
    assert report(alone) == {
        "ok": True,
        "entries": len(lines),
        "problems": [],
        "unsigned_tail": {SESSION: 0},
    }
    keyed = affidavit("log", "verify", moved, "--key", recorded.user_key, cwd=recorded.dir)
    assert keyed.returncode == 0, keyed.stdout


def test_export_of_a_stream_without_evidence_has_no_evidence_folder(recorded: Recorded) -> None:
    bundle = recorded.dir / "bundle"
    result = affidavit(
        "log", "export", OTHER, "--store", recorded.store, "--out", bundle, cwd=recorded.dir
    )
    assert result.returncode == 0, result.stderr
    assert not (bundle / "evidence").exists()
    assert json.loads((bundle / "bundle.json").read_text())["evidence"] == []
    assert (bundle / "entries.jsonl").read_bytes() == b"".join(
        line + b"\n" for line in stored_lines(recorded.store, OTHER)
    )
    assert affidavit("log", "verify", bundle, cwd=recorded.dir).returncode == 0


def test_export_of_an_unknown_stream_writes_nothing(recorded: Recorded) -> None:
    bundle = recorded.dir / "bundle"
    result = affidavit(
        "log", "export", "no-such", "--store", recorded.store, "--out", bundle, cwd=recorded.dir
    )
    assert result.returncode == 3  # a mistyped stream is missing, not a problem found
    assert "no-such" in result.stderr
    assert not bundle.exists()


# -- log show: redaction at read time ----------------------------------------------------------


def test_show_decrypts_and_redacts_without_changing_the_store(recorded: Recorded) -> None:
    store = recorded.store
    before = fingerprint(store)
    lines = stored_lines(store, SESSION)
    root = ref.mth(lines)
    vkey = sql(store, "SELECT value FROM meta WHERE key = 'log_key'")[0][0]
    last, _ = open_checkpoint(stored_notes(store, SESSION)[-1], [Verifier.from_vkey(vkey)])
    assert (last.size, last.root_hash) == (len(lines), root)
    secret = SECRET.strip().decode()

    sealed = affidavit("log", "show", SESSION, "--store", store, cwd=recorded.dir)
    assert sealed.returncode == 0, sealed.stderr
    shown = sealed.stdout.splitlines()
    assert len(shown) == len(lines)
    assert secret not in sealed.stdout
    assert sum("(sealed, " in s for s in shown) == len(lines) - 2  # all but the two clear ones

    opened = affidavit(
        "log", "show", SESSION, "--store", store, "--key", recorded.user_key, cwd=recorded.dir
    )
    assert opened.returncode == 0, opened.stderr
    assert secret in opened.stdout
    assert "(sealed, " not in opened.stdout

    rules = r"re:SECRET-\d+,model.response:response_bytes"
    redacted = affidavit(
        "log", "show", SESSION, "--store", store, "--key", recorded.user_key,
        "--redact", rules, "--json", cwd=recorded.dir,
    )  # fmt: skip
    assert redacted.returncode == 0, redacted.stderr
    assert secret not in redacted.stdout
    rows = [json.loads(s) for s in redacted.stdout.splitlines()]
    assert [r["envelope"]["seq"] for r in rows] == list(range(len(lines)))
    assert [r["envelope"] for r in rows] == [
        {k: v for k, v in json.loads(line).items() if k != "body"} for line in lines
    ]
    responses = [r["body"] for r in rows if r["envelope"]["kind"] == "model.response"]
    assert len(responses) == 4
    # a raw byte field is its digest; the field rule hides its decoded value
    assert all(b["response_bytes"] == b["response_digest"] for b in responses)
    assert all(b["decoded"]["response_bytes"] == "[REDACTED]" for b in responses)
    started = next(r["body"] for r in rows if r["envelope"]["kind"] == "turn.started")
    assert started["input_bytes"] == started["input_digest"]
    assert started["decoded"]["input_bytes"] == "What does https://example.org/0 say? [REDACTED]"

    # unredacted JSON shows a non-UTF-8 reply as base64 of its exact bytes
    full = affidavit(
        "log",
        "show",
        SESSION,
        "--store",
        store,
        "--key",
        recorded.user_key,
        "--json",
        cwd=recorded.dir,
    )
    assert full.returncode == 0, full.stderr
    shown = {
        row["envelope"]["seq"]: row["body"] for row in map(json.loads, full.stdout.splitlines())
    }
    keys = StreamKeys.collect(SESSION, [parse_entry(line) for line in lines], recorded.user)
    non_utf8 = 0
    for line in lines:
        entry = parse_entry(line)
        body = keys.open(entry)
        if isinstance(body, ModelResponse) and body.response_bytes is not None:
            text = shown[entry.seq]["response_bytes"]
            if text.startswith("base64:"):
                non_utf8 += 1
                assert base64.b64decode(text[len("base64:") :]) == body.response_bytes
            else:
                assert text.encode("utf-8") == body.response_bytes
    assert non_utf8 == 1  # write_turn's odd turn ends with a reply that is not UTF-8

    # nothing stored changed: file bytes, lines, the Merkle root, and the audit is still clean
    assert fingerprint(store) == before
    assert stored_lines(store, SESSION) == lines
    assert ref.mth(stored_lines(store, SESSION)) == root
    assert (
        affidavit("log", "verify", store, "--key", recorded.user_key, cwd=recorded.dir).returncode
        == 0
    )


def test_show_with_a_key_that_is_not_a_recipient(recorded: Recorded) -> None:
    result = affidavit(
        "log",
        "show",
        SESSION,
        "--store",
        recorded.store,
        "--key",
        recorded.stranger_key,
        cwd=recorded.dir,
    )
    assert result.returncode == 1
    assert "cannot_open" in result.stderr
    assert SECRET.strip().decode() not in result.stdout


# -- log key -----------------------------------------------------------------------------------


def test_log_key_prints_the_vkey_that_verifies_the_checkpoints(recorded: Recorded) -> None:
    result = affidavit("log", "key", "--store", recorded.store, cwd=recorded.dir)
    assert result.returncode == 0, result.stderr
    vkey = result.stdout.strip()
    assert result.stdout == vkey + "\n"
    assert vkey.startswith(LOG_KEY_NAME + "+")
    verifier = Verifier.from_vkey(vkey)
    assert vkey == Signer.load_or_create(recorded.signing_key, LOG_KEY_NAME).vkey()

    impostor = Verifier.from_vkey(Signer.generate(LOG_KEY_NAME).vkey())
    checked = 0
    for stream in (SESSION, OTHER):
        lines = stored_lines(recorded.store, stream)
        for note in stored_notes(recorded.store, stream):
            checkpoint, _ = open_checkpoint(note, [verifier])
            assert checkpoint.origin.endswith("/" + stream)
            assert checkpoint.root_hash == ref.mth(lines[: checkpoint.size])
            with pytest.raises(CheckpointError):
                open_checkpoint(note, [impostor])
            checked += 1
    assert checked >= 4

    pinned = affidavit("log", "verify", recorded.store, "--log-key", vkey, cwd=recorded.dir)
    assert pinned.returncode == 0
    wrong = affidavit(
        "log", "verify", recorded.store, "--log-key", impostor.vkey(), "--json", cwd=recorded.dir
    )
    assert wrong.returncode == 1
    assert "checkpoint_invalid" in codes(report(wrong))


# -- in process: the typer sub-apps and the error mapping --------------------------------------


def test_register_adds_keys_and_log_to_any_typer_app() -> None:
    app = typer.Typer()
    app.callback()(lambda: None)
    record_cli.register(app)
    root = typer.main.get_command(app)
    groups = getattr(root, "commands", {})
    assert sorted(groups) == ["keys", "log"]
    assert sorted(getattr(groups["keys"], "commands", {})) == ["new"]
    assert sorted(getattr(groups["log"], "commands", {})) == [
        "checkpoint",
        "export",
        "key",
        "show",
        "verify",
    ]


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (record_cli.UsageError("bad rules"), 2, "affidavit: error: bad rules"),
        (StoreMissing("gone"), 3, "affidavit: missing: gone"),
        (UnknownStream("no such stream"), 3, "affidavit: missing: no such stream"),
        (sqlite3.DatabaseError("file is not a database"), 1, "is not a readable record store"),
        (json.JSONDecodeError("Expecting value", "x", 0), 1, "affidavit: error: Expecting value"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_a_mapped_error_is_an_exit_code_in_process(
    recorded: Recorded,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    code: int,
    message: str,
) -> None:
    def fail(*args: object, **kwargs: object) -> Any:
        raise error

    monkeypatch.setattr(record_cli, "show_stream", fail)
    assert main(["log", "show", SESSION, "--store", str(recorded.store)]) == code
    err = capsys.readouterr().err
    assert message in err
    if isinstance(error, sqlite3.DatabaseError):
        assert str(recorded.store) in err  # the store the command was reading


def test_an_error_not_mapped_is_not_swallowed(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(record_cli, "show_stream", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["log", "show", SESSION, "--store", str(recorded.store)])


def test_run_and_report_error() -> None:
    assert record_cli.run(lambda: 0) == 0
    assert record_cli.run(lambda: 1) == 1

    def missing() -> int:
        raise StoreMissing("nope.db")

    assert record_cli.run(missing) == 3
    assert record_cli.report_error(ValueError("not ours")) is None


def test_json_of_keys_new_and_the_log_commands_that_print_facts(
    recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    out = recorded.dir / "new.key"
    assert main(["keys", "new", "--out", str(out), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made == {"key_file": str(out), "public_key": KeyPair.read(out).recipient.text()}
    store = str(recorded.store)
    assert main(["log", "key", "--store", store, "--json"]) == 0
    log_key = json.loads(capsys.readouterr().out)["log_key"]
    assert log_key.startswith("affidavit-log+")
    assert main(["log", "checkpoint", SESSION, "--store", store, "--json"]) == 0
    signed = json.loads(capsys.readouterr().out)
    assert signed["stream"] == SESSION and signed["note"].split("\n")[1] == str(signed["size"])
    bundle = recorded.dir / "bundle"
    assert main(["log", "export", SESSION, "--store", store, "--out", str(bundle), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["stream"] == SESSION and exported["bundle"] == str(bundle)
    assert exported["entries"] == signed["size"]
