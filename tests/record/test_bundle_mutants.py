"""``record.bundle``'s export written out byte for byte, and its refusals word for word.

A store written here with ``record.log.Log`` (a session stream with a key rotation and
evidence, a second session, a boot-evidence stream) is exported; every file of the bundle is
compared with what the store holds, ``bundle.json`` byte for byte, and the bundle verifies.
Then one file at a time is taken away or spoiled and the problem named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from record.bundle import BOOT_LABEL, export_stream, verify_bundle
from record.errors import StoreMissing, UnknownStream
from record.log import Log
from record.schema import SCHEMA_VERSION
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from record.store import PendingCheckpoint, PendingEntry
from tests.record.raw_store import stored_lines

SESSION, OTHER, BOOT = "session-1", "session-2", "boot-1"
EVIDENCE = b"\x00report\xff"


@dataclass
class Store:
    path: Path
    user: KeyPair
    appliance: KeyPair
    auditor: KeyPair
    log_key: str


@pytest.fixture
def store(tmp_path: Path, write_turn: Any) -> Store:
    user, appliance, auditor = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=appliance) as log:
        log.open_stream(BOOT, [appliance.recipient], labels={BOOT_LABEL: "stamp"})
        log.archive_evidence(BOOT, "sev-snp", "boot.bin", b"boot evidence")
        log.checkpoint(BOOT)
        log.open_stream(SESSION, [user.recipient, appliance.recipient])
        write_turn(log, SESSION, 0)
        # the user again and a new auditor: each recipient is listed once, in order
        log.rotate_key(SESSION, [user.recipient, auditor.recipient])
        log.archive_evidence(SESSION, "sev-snp", "report.bin", EVIDENCE)
        log.checkpoint(SESSION)
        log.open_stream(OTHER, [user.recipient], labels={"not/boot": "x"})
        write_turn(log, OTHER, 0)
        log_key = log.log_key()
    return Store(path, user, appliance, auditor, log_key)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_bundle_holds_the_stream_as_stored_and_its_index_byte_for_byte(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "deep" / "er" / "bundle"  # its parents are made too
    index = export_stream(store.path, SESSION, out)
    lines = stored_lines(store.path, SESSION)
    assert (out / "entries.jsonl").read_bytes() == b"".join(line + b"\n" for line in lines)
    recipients = [
        store.user.recipient.text(),
        store.appliance.recipient.text(),
        store.auditor.recipient.text(),
    ]
    assert (out / "recipients.txt").read_bytes() == "".join(r + "\n" for r in recipients).encode()
    assert (out / "log_key.pub").read_bytes() == store.log_key.encode() + b"\n"
    assert (out / "evidence" / "report.bin").read_bytes() == EVIDENCE
    notes = sorted((out / "checkpoints").iterdir())
    assert [p.name for p in notes] == [f"{i:06d}.note" for i in range(len(notes))]
    expected = {
        "format": "affidavit-bundle/v1",
        "schema_version": SCHEMA_VERSION,
        "stream": SESSION,
        "entries": len(lines),
        "checkpoints": len(notes),
        "log_key": store.log_key,
        "recipients": recipients,
        "evidence": ["report.bin"],
        "boot": [BOOT],
    }
    assert index == expected
    text = (out / "bundle.json").read_bytes()
    assert text == json.dumps(expected, indent=2, sort_keys=True).encode() + b"\n"
    assert b'\n  "boot": [\n    "boot-1"\n  ],\n  "checkpoints": ' in text
    assert not [f for f in _files(out) if f.endswith(".tmp")]
    assert (out / "boot" / BOOT / "evidence" / "boot.bin").read_bytes() == b"boot evidence"
    boot_index = json.loads((out / "boot" / BOOT / "bundle.json").read_bytes())
    assert boot_index["stream"] == BOOT and "boot" not in boot_index
    assert boot_index["recipients"] == [store.appliance.recipient.text()]
    report = verify_bundle(out, key=store.user)
    assert report.problems == [] and report.entries == len(lines)
    assert report.streams == [SESSION, BOOT]


def test_a_bundle_without_evidence_or_boot_streams_has_neither(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "b"
    out.mkdir()  # an empty folder is taken
    index = export_stream(store.path, BOOT, out)
    assert "boot" not in index and index["entries"] == 2 and index["evidence"] == ["boot.bin"]
    other = tmp_path / "o"
    index = export_stream(store.path, OTHER, other)
    assert index["boot"] == [BOOT] and index["evidence"] == []
    assert not (other / "evidence").exists()
    assert (other / "recipients.txt").read_text() == store.user.recipient.text() + "\n"


def test_export_refuses_an_unknown_stream_and_a_folder_in_use(store: Store, tmp_path: Path) -> None:
    with pytest.raises(UnknownStream) as unknown:
        export_stream(store.path, "nope", tmp_path / "x")
    assert str(unknown.value) == f"store {store.path} holds no stream 'nope'"
    assert not (tmp_path / "x").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError) as exists:
        export_stream(store.path, SESSION, used)
    assert str(exists.value) == f"{used} exists and is not empty"
    assert _files(used) == ["keep.txt"]
    with pytest.raises(StoreMissing):
        export_stream(tmp_path / "absent.db", SESSION, tmp_path / "y")
    assert not (tmp_path / "absent.db").exists()


def test_a_bundle_folder_that_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(StoreMissing) as caught:
        verify_bundle(tmp_path / "nope")
    assert str(caught.value) == f"bundle directory {tmp_path / 'nope'} does not exist"


def test_a_log_key_file_missing_or_not_utf8_is_named(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "b"
    export_stream(store.path, OTHER, out)
    key = out / "log_key.pub"
    key.write_bytes(b"\xff\n")
    problems = verify_bundle(out).problems
    assert (problems[0].code, problems[0].stream, problems[0].seq, problems[0].detail) == (
        "malformed_bundle",
        OTHER,
        None,
        f"{key} is not UTF-8",
    )
    key.unlink()
    problems = verify_bundle(out).problems
    assert (problems[0].code, problems[0].stream, problems[0].seq, problems[0].detail) == (
        "malformed_bundle",
        OTHER,
        None,
        f"{key} is missing",
    )


# -- one thing spoiled at a time -------------------------------------------------------------


def _problems(root: Path) -> list[tuple[str, str, int | None, str]]:
    return [(p.code, p.stream, p.seq, p.detail) for p in verify_bundle(root).problems]


def _index(root: Path) -> dict[str, Any]:
    index: dict[str, Any] = json.loads((root / "bundle.json").read_bytes())
    return index


def _write_index(root: Path, index: Any) -> None:
    (root / "bundle.json").write_text(json.dumps(index))


@pytest.fixture
def bundle(store: Store, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    export_stream(store.path, SESSION, out)
    assert _problems(out) == []
    return out


def test_an_index_missing_not_json_or_of_another_format_is_named(bundle: Path) -> None:
    path = bundle / "bundle.json"
    good = path.read_bytes()
    path.unlink()
    assert ("malformed_bundle", "?", None, f"{path} is missing") in _problems(bundle)
    for text in (b"{", b"\xff\xfe\xfd"):
        path.write_bytes(text)
        try:
            json.loads(text)
        except ValueError as exc:
            reason = str(exc)
        assert ("malformed_bundle", "?", None, f"{path}: not JSON ({reason})") in _problems(bundle)
    for other in ([1], {"format": "affidavit-bundle/v2"}, {}):
        _write_index(bundle, other)
        detail = f"{path}: not a affidavit-bundle/v1 index"
        assert ("malformed_bundle", "?", None, detail) in _problems(bundle)
    index = json.loads(good)
    _write_index(bundle, {**index, "schema_version": "9.9"})
    detail = f"{path}: unknown schema_version '9.9'; this reader knows {SCHEMA_VERSION!r}"
    problems = _problems(bundle)
    assert ("malformed_bundle", "?", None, detail) in problems
    # the stream is then read from the entries, and every other problem names it
    assert {p[1] for p in problems if p[3] != detail} <= {SESSION}
    _write_index(bundle, {**index, "stream": 7})
    assert _problems(bundle) == []


def test_entries_missing_empty_or_cut_short_are_named(bundle: Path) -> None:
    path = bundle / "entries.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    assert ("malformed_bundle", SESSION, None, f"{path}: last line is cut short") in _problems(
        bundle
    )
    path.write_bytes(b"")
    assert ("malformed_bundle", SESSION, None, f"{path} holds no entry") in _problems(bundle)
    path.unlink()
    assert ("malformed_bundle", SESSION, None, f"{path} is missing") in _problems(bundle)
    index = _index(bundle)
    del index["stream"]
    _write_index(bundle, index)
    assert ("malformed_bundle", "?", None, f"{path} is missing") in _problems(bundle)
    key = bundle / "log_key.pub"
    key.unlink()  # nothing names the stream: every problem says "?"
    assert ("malformed_bundle", "?", None, f"{key} is missing") in _problems(bundle)


def test_kept_checkpoints_are_held_against_the_bundle(bundle: Path) -> None:
    problems = [p for p in verify_bundle(bundle, kept=[b"not a note"]).problems]
    assert problems and any("kept checkpoint #0" in p.detail for p in problems)


def test_a_line_s_problem_names_its_line(bundle: Path) -> None:
    path = bundle / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[0] = b"not an entry"
    path.write_bytes(b"\n".join(lines))
    assert any("entries.jsonl line 1" in p[3] for p in _problems(bundle))
    index = _index(bundle)
    del index["stream"]
    _write_index(bundle, index)
    assert {p[1] for p in _problems(bundle)} == {SESSION}  # read from the next good line


def test_index_counts_that_do_not_match_the_files_are_named(bundle: Path) -> None:
    index = _index(bundle)
    entries, checkpoints = index["entries"], index["checkpoints"]
    _write_index(bundle, {**index, "entries": entries + 1})
    detail = f"bundle.json lists {entries + 1} entries, entries.jsonl holds {entries}"
    assert _problems(bundle) == [("malformed_bundle", SESSION, None, detail)]
    _write_index(bundle, {**index, "checkpoints": checkpoints + 1})
    detail = f"bundle.json lists {checkpoints + 1} checkpoints, checkpoints/ holds {checkpoints}"
    assert _problems(bundle) == [("malformed_bundle", SESSION, None, detail)]
    _write_index(bundle, {**index, "checkpoints": checkpoints - 1, "entries": "many"})
    assert _problems(bundle) == []  # fewer listed: each note is judged by its signature


def test_checkpoints_missing_or_not_notes(bundle: Path) -> None:
    folder = bundle / "checkpoints"
    (folder / "README").write_text("not a note")
    assert _problems(bundle) == []
    for note in folder.iterdir():
        note.unlink()
    folder.rmdir()
    assert ("malformed_bundle", SESSION, None, f"{folder} is missing") in _problems(bundle)


def test_the_evidence_list_against_the_evidence_folder(bundle: Path) -> None:
    index = _index(bundle)
    for listed in ("report.bin", ["../report.bin"], [""], [".hidden"], [3]):
        _write_index(bundle, {**index, "evidence": listed})
        detail = "bundle.json: evidence is not a list of plain file names"
        assert ("malformed_bundle", SESSION, None, detail) in _problems(bundle)
    _write_index(bundle, {**index, "evidence": ["report.bin", "extra.bin"]})
    missing = (
        "evidence_missing",
        SESSION,
        None,
        "bundle.json lists evidence/extra.bin; it is missing",
    )
    assert missing in _problems(bundle)
    (bundle / "evidence" / "stray.bin").write_bytes(b"x")
    _write_index(bundle, index)
    unlisted = (
        "evidence_unlisted",
        SESSION,
        None,
        "evidence/stray.bin is not listed in bundle.json",
    )
    assert unlisted in _problems(bundle)
    del index["evidence"]  # an older index: only the audit's own check of the folder
    _write_index(bundle, index)
    assert unlisted not in _problems(bundle)
    assert (bundle / "evidence" / "stray.bin").exists()


def test_the_boot_list_against_the_boot_folder(bundle: Path) -> None:
    index = _index(bundle)
    for listed in ("boot-1", ["../boot-1"], [""], [None]):
        _write_index(bundle, {**index, "boot": listed})
        detail = "bundle.json: boot is not a list of plain stream names"
        assert _problems(bundle) == [("malformed_bundle", SESSION, None, detail)]
    _write_index(bundle, {**index, "boot": [BOOT, "boot-2"]})
    assert _problems(bundle) == [
        ("evidence_missing", SESSION, None, "bundle.json lists boot/boot-2/; it is missing")
    ]
    _write_index(bundle, {**index, "boot": ["boot-0", BOOT]})  # one missing: the rest checked
    report = verify_bundle(bundle)
    assert report.streams == [SESSION, BOOT]
    _write_index(bundle, {k: v for k, v in index.items() if k != "boot"})
    assert _problems(bundle) == [
        ("evidence_unlisted", SESSION, None, "boot/boot-1 is not listed in bundle.json")
    ]


def test_a_boot_bundle_is_checked_under_the_parent_s_log_key(bundle: Path) -> None:
    boot = bundle / "boot" / BOOT
    (boot / "log_key.pub").write_text("other+1234+AAAA\n")
    problems = _problems(bundle)
    own_key = _index(bundle)["log_key"]
    detail = f"boot/{BOOT}: log_key.pub names other+1234+AAAA, not the bundle's log key {own_key}"
    # its checkpoints are still checked under the parent's key, which signed them
    assert problems == [("checkpoint_invalid", BOOT, None, detail)]


def test_a_boot_bundle_that_names_another_stream_or_nests_is_named(bundle: Path) -> None:
    boot = bundle / "boot" / BOOT
    inner = _index(boot)
    _write_index(boot, {**inner, "stream": "elsewhere"})
    detail = f"boot/{BOOT}: bundle.json names stream 'elsewhere', not its folder's"
    assert ("malformed_bundle", "elsewhere", None, detail) in _problems(bundle)
    _write_index(boot, {**inner, "boot": ["x"]})
    nested = f"boot/{BOOT}: a boot bundle holds no boot bundle of its own"
    assert ("malformed_bundle", BOOT, None, nested) in _problems(bundle)
    _write_index(boot, {**inner, "boot": []})
    assert _problems(bundle) == []
    (boot / "boot").mkdir()
    assert ("malformed_bundle", BOOT, None, nested) in _problems(bundle)


def test_streams_that_are_not_boot_evidence_are_passed_over(
    tmp_path: Path, write_turn: Any
) -> None:
    appliance = KeyPair.generate()
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=appliance) as log:
        log.open_stream(BOOT, [appliance.recipient], labels={BOOT_LABEL: "stamp"})
        log.open_stream(SESSION, [appliance.recipient])
        write_turn(log, SESSION, 0)
    # rows no writer of ours makes, each sorting before the boot stream: the search goes on
    boot_line = stored_lines(path, BOOT)[0]
    raw = SQLiteStore(path)
    raw.append(
        [
            # the boot stream's own opening, under a name that cannot be a folder
            PendingEntry(".early", lambda seq: (boot_line, b"2" * 32)),
            PendingEntry("a-bad", lambda seq: (b'{"kind":"stream.opened"}', b"0" * 32)),
            PendingEntry("a-raw", lambda seq: (b'{"x":1}', b"1" * 32)),
        ],
        [PendingCheckpoint("a-cp", lambda size: b"a note of no entry")],
    )
    raw.close()
    index = export_stream(path, SESSION, tmp_path / "b")
    assert index["boot"] == [BOOT]
    assert sorted(p.name for p in (tmp_path / "b" / "boot").iterdir()) == [BOOT]


def test_a_store_without_a_log_key_exports_an_empty_one(tmp_path: Path) -> None:
    path = tmp_path / "raw.db"
    raw = SQLiteStore(path)
    raw.append([PendingEntry("s", lambda seq: (b'{"x":1}', b"1" * 32))])
    raw.close()
    index = export_stream(path, "s", tmp_path / "b")
    assert index["log_key"] == "" and index["recipients"] == []
    assert (tmp_path / "b" / "log_key.pub").read_bytes() == b"\n"
    assert (tmp_path / "b" / "recipients.txt").read_bytes() == b""


def test_a_boot_bundle_s_unsigned_tail_is_allowed_as_the_parent_s_is(bundle: Path) -> None:
    boot = bundle / "boot" / BOOT
    notes = sorted((boot / "checkpoints").iterdir())
    for note in notes[1:]:  # only the first, of its first entry, is left
        note.unlink()
    _write_index(boot, {**_index(boot), "checkpoints": 1})
    report = verify_bundle(bundle, allow_unsigned_tail=True)
    assert report.problems == [] and report.unsigned == {SESSION: 0, BOOT: 1}
    [problem] = _problems(bundle)
    assert problem[:3] == ("unsigned_tail", BOOT, 1) and problem[3].startswith(f"boot/{BOOT}: ")


def test_entries_empty_or_cut_short_without_a_stream_name_are_named_by_a_question_mark(
    bundle: Path,
) -> None:
    index = _index(bundle)
    del index["stream"]
    _write_index(bundle, index)
    path = bundle / "entries.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # the stream is still read from the lines
    cut = f"{path}: last line is cut short"
    assert ("malformed_bundle", "?", None, cut) in _problems(bundle)
    path.write_bytes(b"")
    assert ("malformed_bundle", "?", None, f"{path} holds no entry") in _problems(bundle)


def test_a_name_with_a_slash_is_no_plain_name(bundle: Path) -> None:
    index = _index(bundle)
    _write_index(bundle, {**index, "boot": [f"x/{BOOT}"]})
    detail = "bundle.json: boot is not a list of plain stream names"
    assert _problems(bundle) == [("malformed_bundle", SESSION, None, detail)]
    _write_index(bundle, {**index, "evidence": ["x/report.bin"]})
    detail = "bundle.json: evidence is not a list of plain file names"
    assert ("malformed_bundle", SESSION, None, detail) in _problems(bundle)
