"""``affidavit keys …`` / ``affidavit log …`` in process, word for word: every exit code,
error line and summary line of ``record/cli.py``, on real stores written with ``Log``.

``test_cli.py`` runs the same commands as subprocesses (seconds each); these call
``affidavit.cli.main`` so a broken line of ``record/cli.py`` fails here in a second.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from affidavit.cli import main
from record import cli as record_cli
from record.errors import BundleError, SchemaError, StoreMissing, UnknownStream
from record.log import Log
from record.seal import KeyPair

SESSION = "session-1"
OTHER = "session-2"
EVIDENCE = b"\x00\x01SEV-SNP report \xff\xfe" * 4


@dataclass
class Store:
    dir: Path
    path: Path
    user: KeyPair
    user_key: Path
    appliance: KeyPair


@pytest.fixture
def store(tmp_path: Path, write_turn: Any) -> Store:
    """SESSION and OTHER: one checkpointed turn each (9 entries with ``stream.opened``)."""
    user, appliance = KeyPair.generate(), KeyPair.generate()
    user.write(tmp_path / "user.key")
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=appliance) as log:
        log.open_stream(SESSION, [user.recipient, appliance.recipient])
        write_turn(log, SESSION, 0)
        log.open_stream(OTHER, [user.recipient])
        write_turn(log, OTHER, 0)
    return Store(tmp_path, path, user, tmp_path / "user.key", appliance)


def _out(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    got = capsys.readouterr()
    return got.out, got.err


# -- report_error, run, counted --------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (record_cli.UsageError("bad rules"), 2, "affidavit: error: bad rules"),
        (StoreMissing("gone"), 3, "affidavit: missing: gone"),
        (UnknownStream("no such stream"), 3, "affidavit: missing: no such stream"),
        (SchemaError("entry 3 is bad"), 1, "affidavit: schema: entry 3 is bad"),
        (BundleError("cut short"), 1, "affidavit: malformed_bundle: cut short"),
        (
            sqlite3.DatabaseError("file is not a database"),
            1,
            "affidavit: the store is not a readable record store: file is not a database",
        ),
        (
            json.JSONDecodeError("Expecting value", "x", 0),
            1,
            "affidavit: error: Expecting value: line 1 column 1 (char 0)",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_report_error_prints_one_line_and_returns_the_exit_code(
    capsys: pytest.CaptureFixture[str], error: Exception, code: int, line: str
) -> None:
    assert record_cli.report_error(error) == code
    assert _out(capsys) == ("", line + "\n")


def test_report_error_names_where_and_leaves_others_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = sqlite3.DatabaseError("file is not a database")
    assert record_cli.report_error(error, "x.db") == 1
    assert (
        _out(capsys)[1]
        == "affidavit: x.db is not a readable record store: file is not a database\n"
    )
    assert record_cli.report_error(ValueError("not ours")) is None
    assert record_cli.report_error(KeyError("x")) is None
    assert _out(capsys) == ("", "")


def test_run_returns_the_code_and_raises_what_is_not_ours() -> None:
    assert record_cli.run(lambda: 0) == 0
    assert record_cli.run(lambda: 7) == 7

    def missing() -> int:
        raise StoreMissing("nope.db")

    def bug() -> int:
        raise RuntimeError("a bug")

    assert record_cli.run(missing) == 3
    with pytest.raises(RuntimeError, match="a bug"):
        record_cli.run(bug)


@pytest.mark.parametrize(
    ("n", "args", "text"),
    [
        (0, ("entry", "entries"), "0 entries"),
        (1, ("entry", "entries"), "1 entry"),
        (2, ("entry", "entries"), "2 entries"),
        (1, ("stream",), "1 stream"),
        (2, ("stream",), "2 streams"),
        (0, ("stream", None), "0 streams"),
    ],
)
def test_counted(n: int, args: tuple[str, str | None], text: str) -> None:
    assert record_cli.counted(n, *args) == text


# -- the home and its store ------------------------------------------------------------------


def test_home_root_is_given_else_the_environment_else_dot_affidavit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert record_cli.home_root(tmp_path) == tmp_path
    monkeypatch.setenv("AFFIDAVIT_HOME", str(tmp_path / "env"))
    assert record_cli.home_root(None) == tmp_path / "env"
    monkeypatch.setenv("AFFIDAVIT_HOME", "")
    assert record_cli.home_root(None) == Path(".affidavit")
    monkeypatch.delenv("AFFIDAVIT_HOME")
    assert record_cli.home_root(None) == Path(".affidavit")


@pytest.mark.parametrize(
    ("appliance", "named"),
    [
        (None, None),
        (b'{"store": "/run/elsewhere.db"}', "/run/elsewhere.db"),
        (b'{"store": 7}', None),
        (b'{"other": "x"}', None),
        (b"[1]", None),
        (b"not json", None),
        (b'"store"', None),
    ],
)
def test_home_store_is_the_one_appliance_json_names_else_record_db(
    tmp_path: Path, appliance: bytes | None, named: str | None
) -> None:
    if appliance is not None:
        (tmp_path / "appliance.json").write_bytes(appliance)
    expected = Path(named) if named is not None else tmp_path / "record.db"
    assert record_cli.home_store(tmp_path) == expected


def test_a_missing_store_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone.db"
    assert main(["log", "key", "--store", str(gone)]) == 3
    assert _out(capsys) == ("", f"affidavit: missing: store {gone} does not exist\n")
    assert main(["log", "key", "--home", str(tmp_path)]) == 3
    hint = ": run `affidavit up` first, or pass --store"
    expected = f"affidavit: missing: store {tmp_path / 'record.db'} does not exist{hint}\n"
    assert _out(capsys) == ("", expected)


def test_the_home_store_is_read_without_store(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["log", "key", "--home", str(store.dir)]) == 0
    vkey = _out(capsys)[0]
    assert vkey.startswith("affidavit-log+") and vkey.endswith("\n")
    assert main(["log", "key", "--store", str(store.path)]) == 0
    assert _out(capsys) == (vkey, "")
    assert main(["log", "key", "--store", str(store.path), "--json"]) == 0
    assert json.loads(_out(capsys)[0]) == {"log_key": vkey.strip()}


def test_a_store_without_a_log_key_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from record.sqlite_store import SQLiteStore

    path = tmp_path / "empty.db"
    SQLiteStore(path).close()
    assert main(["log", "key", "--store", str(path)]) == 1
    assert _out(capsys) == ("", f"store {path} has no log key yet\n")


# -- checkpoint files given to --against ---------------------------------------------------


def test_kept_checkpoint_files_from_files_folders_and_globs(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    (kept / "sub").mkdir(parents=True)
    for name in ("b.note", "a.note", ".hidden", "sub/c.note"):
        (kept / name).write_text(name)
    one = tmp_path / "one.note"
    one.write_text("one")
    found = record_cli.kept_checkpoint_files([str(kept), str(one), str(kept / "*.note")])
    # named twice (the folder and the glob): each file once, where it was first named
    assert found == [kept / "a.note", kept / "b.note", kept / "sub" / "c.note", one]
    assert record_cli.kept_checkpoint_files([str(kept / "*")]) == [kept / "a.note", kept / "b.note"]
    assert record_cli.kept_checkpoint_files([]) == []


def test_kept_checkpoint_files_that_are_not_there_are_missing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / ".hidden").write_text("x")
    with pytest.raises(StoreMissing) as caught:
        record_cli.kept_checkpoint_files([str(empty)])
    assert str(caught.value) == f"checkpoint folder {empty} holds no file"
    for value in (str(tmp_path / "gone.note"), str(tmp_path / "*.nothing")):
        with pytest.raises(StoreMissing) as caught:
            record_cli.kept_checkpoint_files([value])
        assert str(caught.value) == f"checkpoint file {value} does not exist"


# -- keys new --------------------------------------------------------------------------------


def test_keys_new_writes_where_it_is_asked_and_nowhere_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "new"]) == 2
    assert _out(capsys) == (
        "",
        "affidavit: error: give --out KEY_FILE, or --home DIR for the home's user.key\n",
    )
    out = tmp_path / "a.key"
    assert main(["keys", "new", "--out", str(out)]) == 0
    assert _out(capsys) == (KeyPair.read(out).recipient.text() + "\n", "")
    assert main(["keys", "new", "--out", str(out)]) == 2
    assert _out(capsys)[1] == (
        f"affidavit: error: {out} already exists; refusing to overwrite a key\n"
    )
    home = tmp_path / "home" / "deeper"
    assert main(["keys", "new", "--home", str(home), "--json"]) == 0
    made = json.loads(_out(capsys)[0])
    key = home / "user.key"
    assert made == {"key_file": str(key), "public_key": KeyPair.read(key).recipient.text()}
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert main(["keys", "new", "--home", str(home)]) == 2
    other = tmp_path / "b.key"  # --out wins over --home
    assert main(["keys", "new", "--out", str(other), "--home", str(tmp_path / "h2")]) == 0
    assert other.is_file() and not (tmp_path / "h2").exists()


# -- log verify --------------------------------------------------------------------------------


def test_verify_prints_ok_with_its_counts(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "verify", str(store.path)]) == 0
    assert _out(capsys) == (f"ok: {store.path}: 18 entries in 2 streams, no problem\n", "")
    assert main(["log", "verify", "--home", str(store.dir), "--key", str(store.user_key)]) == 0
    assert (
        _out(capsys)[0] == f"ok: {store.dir / 'record.db'}: 18 entries in 2 streams, no problem\n"
    )
    assert main(["log", "verify", str(store.path), "--json"]) == 0
    doc = json.loads(_out(capsys)[0])
    assert doc["ok"] is True and doc["entries"] == 18 and doc["problems"] == []


def _bundle_without_notes(store: Store, keep: int) -> Path:
    """SESSION's bundle with only its ``keep`` oldest checkpoint notes (the index in step)."""
    bundle = store.dir / "bundle"
    assert main(["log", "export", SESSION, "--store", str(store.path), "--out", str(bundle)]) == 0
    notes = sorted((bundle / "checkpoints").glob("*.note"))
    for note in notes[keep:]:
        note.unlink()
    index = json.loads((bundle / "bundle.json").read_bytes())
    index["checkpoints"] = keep
    (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return bundle


def test_verify_prints_each_problem_in_columns(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle_without_notes(store, 0)  # no checkpoint covers the stream at all
    capsys.readouterr()
    for extra in ([], ["--allow-unsigned-tail"]):  # refused even when a tail is allowed
        assert main(["log", "verify", str(bundle), *extra]) == 1
        out, err = _out(capsys)
        lines = out.splitlines()
        assert lines[0] == f"FAILED: {bundle}: 1 problem in 9 entries" and err == ""
        assert lines[1:] == [f"  {'unsigned_tail':<24} {SESSION + '/0':<28} {lines[1][56:]}"]
        assert lines[1][56:] and not lines[1][56:].startswith(" ")


@pytest.mark.parametrize(("keep", "tail"), [(1, "8 entries"), (8, "1 entry")])
def test_verify_with_an_unsigned_tail_allowed_says_so(
    store: Store, capsys: pytest.CaptureFixture[str], keep: int, tail: str
) -> None:
    bundle = _bundle_without_notes(store, keep)  # the first note covers stream.opened only
    capsys.readouterr()
    assert main(["log", "verify", str(bundle)]) == 1
    assert "unsigned_tail" in _out(capsys)[0]
    assert main(["log", "verify", str(bundle), "--allow-unsigned-tail"]) == 0
    assert _out(capsys)[0].splitlines() == [
        f"ok: {bundle}: 9 entries in 1 stream, no problem",
        f"  allowed: {SESSION}: {tail} no checkpoint covers (unsigned tail)",
    ]


def test_verify_of_what_is_no_store_or_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, not even close" * 200)
    assert main(["log", "verify", str(junk), "--json"]) == 1
    doc = json.loads(_out(capsys)[0])
    assert [(p["code"], p["stream"], p["seq"]) for p in doc["problems"]] == [
        ("malformed_store", "?", None)
    ]
    assert doc["problems"][0]["detail"].startswith(f"{junk} is not a readable record store: ")
    gone = tmp_path / "gone"
    assert main(["log", "verify", str(gone)]) == 3
    assert _out(capsys) == (
        "",
        f"affidavit: missing: {gone} is neither a store file nor a bundle directory\n",
    )


def test_verify_with_a_bad_key_file_is_a_usage_error(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = store.dir / "bad.key"
    bad.write_text("not a key")
    assert main(["log", "verify", str(store.path), "--key", str(bad)]) == 2
    err = _out(capsys)[1]
    assert err.startswith("affidavit: error: ") and err.count("\n") == 1


def test_verify_against_kept_checkpoints_and_a_pinned_key(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    note = store.dir / "kept" / "s1.note"
    note.parent.mkdir()
    assert main(["log", "checkpoint", SESSION, "--store", str(store.path), "--out", str(note)]) == 0
    printed = _out(capsys)[0]
    assert note.read_text() == printed and printed.startswith("affidavit-log")
    assert printed.splitlines()[1] == "9"
    assert main(["log", "verify", str(store.path), "--against", str(note.parent)]) == 0
    capsys.readouterr()
    note.write_text(printed.replace("\n9\n", "\n8\n"))
    assert main(["log", "verify", str(store.path), "--against", str(note)]) == 1
    capsys.readouterr()
    assert main(["log", "key", "--store", str(store.path)]) == 0
    vkey = _out(capsys)[0].strip()
    assert main(["log", "verify", str(store.path), "--log-key", vkey]) == 0
    capsys.readouterr()
    wrong = vkey[:-4] + ("AAAA" if not vkey.endswith("AAAA") else "BBBB")
    assert main(["log", "verify", str(store.path), "--log-key", wrong]) == 1


# -- log export, show, checkpoint ------------------------------------------------------------


def test_export_says_what_it_wrote_and_refuses_to_overwrite(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    with Log.open(store.path, appliance_key=store.appliance) as log:
        log.archive_evidence(SESSION, "sev-snp", "report.bin", EVIDENCE)
        log.checkpoint(SESSION)
    bundle = store.dir / "bundle"
    assert main(["log", "export", SESSION, "--store", str(store.path), "--out", str(bundle)]) == 0
    assert _out(capsys) == (
        f"exported 10 entries and 11 checkpoints of {SESSION} to {bundle}\n",
        "",
    )
    assert main(["log", "verify", str(bundle)]) == 0
    assert _out(capsys)[0] == f"ok: {bundle}: 10 entries in 1 stream, no problem\n"
    (bundle / "extra").write_text("x")
    assert main(["log", "export", SESSION, "--store", str(store.path), "--out", str(bundle)]) == 2
    err = _out(capsys)[1]
    assert err.startswith("affidavit: error: ") and str(bundle) in err
    assert (
        main(["log", "export", "nope", "--store", str(store.path), "--out", str(store.dir / "b2")])
        == 3
    )
    assert _out(capsys)[1].startswith("affidavit: missing: ")


def test_show_refuses_bad_rules_and_opens_with_a_key(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["log", "show", SESSION, "--store", str(store.path)]
    assert main([*args, "--redact", "re:("]) == 2
    err = _out(capsys)[1]
    assert err.startswith("affidavit: error: --redact: ") and err.count("\n") == 1
    assert main(args) == 0
    sealed = _out(capsys)[0]
    assert main([*args, "--key", str(store.user_key)]) == 0
    opened = _out(capsys)[0]
    assert sealed != opened and len(opened.splitlines()) == len(sealed.splitlines()) == 9
    assert main([*args, "--key", str(store.user_key), "--redact", "messages"]) == 0
    assert _out(capsys)[0] != opened
    assert main([*args, "--json"]) == 0
    assert all(json.loads(line) for line in _out(capsys)[0].splitlines())


def test_checkpoint_json_and_text(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "checkpoint", OTHER, "--store", str(store.path), "--json"]) == 0
    doc = json.loads(_out(capsys)[0])
    assert list(doc) == ["stream", "size", "note"]
    assert doc["stream"] == OTHER and doc["size"] == 9 and doc["note"].split("\n")[1] == "9"
    assert main(["log", "checkpoint", OTHER, "--store", str(store.path)]) == 0
    out = _out(capsys)[0]
    assert out.split("\n")[:2] == doc["note"].split("\n")[:2] and out.endswith("\n")


def test_register_adds_keys_and_log() -> None:
    app = typer.Typer()
    app.callback()(lambda: None)
    record_cli.register(app)
    groups = getattr(typer.main.get_command(app), "commands", {})
    assert sorted(groups) == ["keys", "log"]
    assert groups["keys"].help == "Recipient keys." and groups["keys"].no_args_is_help
    assert groups["log"].help == "The record: verify, export, show, sign."
    assert groups["log"].no_args_is_help
    assert sorted(getattr(groups["log"], "commands", {})) == [
        "checkpoint", "export", "key", "show", "verify",
    ]  # fmt: skip


# -- survivors of the first mutation run -----------------------------------------------------


def test_a_bad_key_file_is_named_word_for_word(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = store.dir / "bad.key"
    bad.write_text("not a key")
    bad.chmod(0o644)
    assert main(["log", "verify", str(store.path), "--key", str(bad)]) == 2
    assert _out(capsys) == (
        "",
        f"affidavit: error: key file {bad} has mode 0644: others could read it\n",
    )
    bad.chmod(0o600)
    assert main(["log", "show", SESSION, "--store", str(store.path), "--key", str(bad)]) == 2
    out, err = _out(capsys)
    assert out == "" and err.startswith(f"affidavit: error: {bad}: not a PEM private key (")


def test_kept_checkpoint_files_keep_a_file_named_before_a_folder(tmp_path: Path) -> None:
    one = tmp_path / "one.note"
    one.write_text("one")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "a.note").write_text("a")
    assert record_cli.kept_checkpoint_files([str(one), str(kept)]) == [one, kept / "a.note"]


def test_verify_counts_one_entry_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "one.db"
    with Log.open(path, appliance_key=KeyPair.generate()) as log:
        log.open_stream(SESSION, [KeyPair.generate().recipient])
        log.checkpoint(SESSION)
    assert main(["log", "verify", str(path)]) == 0
    assert _out(capsys) == (f"ok: {path}: 1 entry in 1 stream, no problem\n", "")
    bundle = tmp_path / "bundle"
    assert main(["log", "export", SESSION, "--store", str(path), "--out", str(bundle)]) == 0
    for note in (bundle / "checkpoints").glob("*.note"):
        note.unlink()
    index = json.loads((bundle / "bundle.json").read_bytes())
    index["checkpoints"] = 0
    (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    capsys.readouterr()
    assert main(["log", "verify", str(bundle)]) == 1
    lines = _out(capsys)[0].splitlines()
    assert lines[0] == f"FAILED: {bundle}: 1 problem in 1 entry"
    assert lines[1].startswith(f"  {'unsigned_tail':<24} {SESSION + '/0':<28} ")


def test_verify_prints_a_problem_without_a_seq_by_its_stream_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, not even close" * 200)
    assert main(["log", "verify", str(junk)]) == 1
    out, err = _out(capsys)
    lines = out.splitlines()
    assert err == "" and lines[0] == f"FAILED: {junk}: 1 problem in 0 entries"
    detail = f"{junk} is not a readable record store: "
    assert lines[1].startswith(f"  {'malformed_store':<24} {'?':<28} {detail}")
    assert len(lines) == 2


# -- the command bodies (the ``@_command`` functions, which mutmut does not mutate) ----------


def _drop_checkpoints_after(path: Path, size: int) -> None:
    """What a writer from before every commit was signed left: no checkpoint past ``size``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER checkpoints_no_delete")
        conn.execute("DELETE FROM checkpoints WHERE size > ?", (size,))
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_keys_new_writes_into_a_home_that_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    assert main(["keys", "new", "--home", str(home)]) == 0
    assert _out(capsys) == (KeyPair.read(home / "user.key").recipient.text() + "\n", "")


def test_verify_opens_bodies_with_the_key_in_a_store_and_a_bundle(
    tmp_path: Path, write_turn: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    user = KeyPair.generate()
    user.write(tmp_path / "user.key")
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=KeyPair.generate()) as log:
        log.open_stream(SESSION, [user.recipient])
        write_turn(log, SESSION, 0, wrong_digest=True)  # only a key can see it
    bundle = tmp_path / "bundle"
    assert main(["log", "export", SESSION, "--store", str(path), "--out", str(bundle)]) == 0
    for target in (path, bundle):
        capsys.readouterr()
        assert main(["log", "verify", str(target)]) == 0
        assert _out(capsys) == (f"ok: {target}: 9 entries in 1 stream, no problem\n", "")
        assert main(["log", "verify", str(target), "--key", str(tmp_path / "user.key")]) == 1
        lines = _out(capsys)[0].splitlines()
        assert lines[0] == f"FAILED: {target}: 1 problem in 9 entries"
        assert lines[1].startswith(
            f"  {'body_digest_mismatch':<24} {SESSION + '/7':<28} model.response: response_digest "
        )


def test_verify_of_a_bundle_against_kept_checkpoints_and_a_pinned_key(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = store.dir / "bundle"
    assert main(["log", "export", SESSION, "--store", str(store.path), "--out", str(bundle)]) == 0
    capsys.readouterr()
    vkey = (bundle / "log_key.pub").read_text().strip()
    note = store.dir / "kept.note"
    assert main(["log", "checkpoint", SESSION, "--store", str(store.path), "--out", str(note)]) == 0
    printed = _out(capsys)[0]
    assert main(["log", "verify", str(bundle), "--against", str(note)]) == 0
    capsys.readouterr()
    note.write_text(printed.replace("\n9\n", "\n8\n"))  # its signature no longer verifies
    assert main(["log", "verify", str(bundle), "--against", str(note)]) == 1
    key_id = vkey.split("+")[1]
    assert _out(capsys) == (
        f"FAILED: {bundle}: 1 problem in 9 entries\n"
        f"  {'checkpoint_invalid':<24} {SESSION:<28} kept checkpoint #0: signature from "
        f"affidavit-log ({key_id}) does not verify\n",
        "",
    )
    assert main(["log", "verify", str(bundle), "--log-key", vkey]) == 0
    capsys.readouterr()
    with Log.open(store.dir / "other.db", appliance_key=KeyPair.generate()) as other:
        other_vkey = other.log_key()  # another log's signer
    assert main(["log", "verify", str(bundle), "--log-key", other_vkey]) == 1
    lines = _out(capsys)[0].splitlines()
    assert lines[:2] == [
        f"FAILED: {bundle}: 11 problems in 9 entries",
        f"  {'checkpoint_invalid':<24} {SESSION + '/0':<28} the stream names log key {vkey}, "
        f"not {other_vkey}, the key it is checked against",
    ]


def test_verify_of_a_store_with_an_unsigned_tail_allowed_says_so(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    _drop_checkpoints_after(store.path, 1)  # both streams: stream.opened signed, 8 after it
    assert main(["log", "verify", str(store.path)]) == 1
    assert _out(capsys)[0].startswith(f"FAILED: {store.path}: 2 problems in 18 entries\n")
    assert main(["log", "verify", str(store.path), "--allow-unsigned-tail"]) == 0
    assert _out(capsys)[0].splitlines() == [
        f"ok: {store.path}: 18 entries in 2 streams, no problem",
        f"  allowed: {SESSION}: 8 entries no checkpoint covers (unsigned tail)",
        f"  allowed: {OTHER}: 8 entries no checkpoint covers (unsigned tail)",
    ]


def test_export_show_and_checkpoint_read_the_home_store(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no .affidavit here, and no $AFFIDAVIT_HOME
    monkeypatch.delenv("AFFIDAVIT_HOME", raising=False)
    home = ["--home", str(store.dir)]
    bundle = tmp_path / "bundle"
    assert main(["log", "export", OTHER, *home, "--out", str(bundle)]) == 0
    assert _out(capsys) == (f"exported 9 entries and 9 checkpoints of {OTHER} to {bundle}\n", "")
    assert main(["log", "show", OTHER, *home]) == 0
    assert len(_out(capsys)[0].splitlines()) == 9
    assert main(["log", "checkpoint", OTHER, *home]) == 0
    assert _out(capsys)[0].split("\n")[1] == "9"


def test_export_names_its_boot_bundles_and_counts_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from record.bundle import BOOT_LABEL

    path = tmp_path / "record.db"
    recipient = KeyPair.generate().recipient
    with Log.open(path, appliance_key=KeyPair.generate()) as log:
        for name in ("boot-b", "boot-a"):
            log.open_stream(name, [recipient], labels={BOOT_LABEL: "2026-12-02"})
        log.open_stream(SESSION, [recipient])
    first = tmp_path / "first"
    assert main(["log", "export", SESSION, "--store", str(path), "--out", str(first)]) == 0
    assert _out(capsys) == (
        f"exported 1 entry and 1 checkpoint of {SESSION} to {first}, "
        "with 2 boot bundles: boot-a, boot-b\n",
        "",
    )
    second = tmp_path / "second"
    assert main(["log", "export", "boot-a", "--store", str(path), "--out", str(second)]) == 0
    assert _out(capsys) == (
        f"exported 1 entry and 1 checkpoint of boot-a to {second}, with 1 boot bundle: boot-b\n",
        "",
    )


def test_log_key_never_writes_to_the_file_it_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    assert main(["log", "key", "--store", str(foreign)]) == 1
    assert _out(capsys) == (
        "",
        f"affidavit: {foreign} is not a readable record store: no such table: meta\n",
    )
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db"]
