"""Bad input: broken bundles, wrong keys, unknown versions, and bodies no text codec likes.

Each broken input is checked with the real CLI (``affidavit log verify`` in a subprocess):

- a bundle whose ``entries.jsonl`` is cut mid-line, or loses whole lines, or whose
  ``bundle.json`` / ``entries.jsonl`` / ``checkpoints/`` / ``log_key.pub`` is gone or garbage,
  or whose checkpoint note is garbage: exit 1, the output naming the file (and the line);
- an entry with ``"schema_version":"9.9"``, in a bundle or in a store: exit 1, the problem
  naming the version and the line or entry; the same in ``bundle.json``;
- a key file holding garbage: exit 2 naming the file; a valid key that is not a recipient:
  exit 1 ``cannot_open``.

In every case the store file (database and WAL) and the bundle's files are byte for byte
what they were before. Non-UTF-8 bodies (all 256 byte values, in every bytes field) and a
16 MiB random body go through ``Log`` → SQLite → ``affidavit log export`` → open with the
key, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from record.bundle import export_stream
from record.digest import Domain, canonical_json, digest
from record.log import Log
from record.merkle import hash_leaf
from record.reader import StreamKeys
from record.schema import (
    Entry,
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    Provider,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    parse_entry,
)
from record.seal import KeyPair
from tests.record.raw_store import stored_lines

STREAM = "bad-input"
ALL_BYTES = bytes(range(256))
SIXTEEN_MIB = 16 * 1024 * 1024


# -- helpers -----------------------------------------------------------------------------------


def affidavit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=300,
    )


def store_fingerprint(store: Path) -> tuple[str, str]:
    """sha256 of the database file and of its WAL (an absent WAL counts as empty)."""
    wal = store.with_name(store.name + "-wal")
    return (
        hashlib.sha256(store.read_bytes()).hexdigest(),
        hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest(),
    )


def tree_fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def json_report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    assert set(doc) == {"ok", "entries", "problems", "unsigned_tail"}
    return doc


def bundle_entries(bundle: Path) -> list[Entry]:
    data = (bundle / "entries.jsonl").read_bytes()
    assert data.endswith(b"\n")
    return [parse_entry(line) for line in data.split(b"\n")[:-1]]


@dataclass
class World:
    dir: Path
    store: Path
    bundle: Path
    user: KeyPair
    user_key: Path
    stranger_key: Path

    def verify(self, target: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
        """Run ``log verify`` and check that neither the store nor ``target`` changed."""
        store_before = store_fingerprint(self.store)
        target_before = tree_fingerprint(target) if target.is_dir() else None
        result = affidavit("log", "verify", target, *extra, cwd=self.dir)
        assert "Traceback" not in result.stderr, result.stderr
        assert store_fingerprint(self.store) == store_before
        if target_before is not None:
            assert tree_fingerprint(target) == target_before
        return result


@pytest.fixture
def world(tmp_path: Path, write_turn: Any) -> World:
    user, stranger = KeyPair.generate(), KeyPair.generate()
    user.write(tmp_path / "user.key")
    stranger.write(tmp_path / "stranger.key")
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        write_turn(log, STREAM, 0)
        write_turn(log, STREAM, 1)
    bundle = tmp_path / "bundle"
    export_stream(store, STREAM, bundle)
    return World(tmp_path, store, bundle, user, tmp_path / "user.key", tmp_path / "stranger.key")


def broken_copy(world: World, name: str, damage: Callable[[Path], None]) -> Path:
    """A copy of the good bundle with ``damage`` done to it."""
    copy = world.dir / name
    copy.mkdir()
    for path in world.bundle.rglob("*"):
        target = copy / path.relative_to(world.bundle)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    damage(copy)
    return copy


def test_the_good_bundle_and_store_verify(world: World) -> None:
    assert world.verify(world.bundle, "--key", world.user_key).returncode == 0
    assert world.verify(world.store, "--key", world.user_key).returncode == 0


# -- truncated and malformed bundles -----------------------------------------------------------


@pytest.mark.parametrize("cut_line", [1, 5, 17], ids=lambda n: f"line{n}")
def test_entries_cut_mid_line_names_the_file_and_line(world: World, cut_line: int) -> None:
    lines = (world.bundle / "entries.jsonl").read_bytes().split(b"\n")[:-1]
    assert len(lines) == 17
    offset = sum(len(line) + 1 for line in lines[: cut_line - 1])
    cut_at = offset + len(lines[cut_line - 1]) // 2

    def cut(b: Path) -> None:
        path = b / "entries.jsonl"
        path.write_bytes(path.read_bytes()[:cut_at])

    broken = broken_copy(world, "cut", cut)
    result = world.verify(broken)
    assert result.returncode == 1
    assert "entries.jsonl" in result.stdout
    assert f"entries.jsonl line {cut_line}" in result.stdout
    assert "cut short" in result.stdout

    doc = json_report(world.verify(broken, "--json"))
    assert doc["ok"] is False
    by_code = {p["code"]: p for p in doc["problems"]}
    assert {"malformed_bundle", "malformed_entry"} <= set(by_code)
    assert f"entries.jsonl line {cut_line}:" in by_code["malformed_entry"]["detail"]


def test_entries_missing_whole_lines_is_truncated(world: World) -> None:
    def drop_last_three(b: Path) -> None:
        path = b / "entries.jsonl"
        lines = path.read_bytes().split(b"\n")[:-1]
        path.write_bytes(b"".join(line + b"\n" for line in lines[:-3]))

    broken = broken_copy(world, "short", drop_last_three)
    result = world.verify(broken, "--json")
    assert result.returncode == 1
    doc = json_report(result)
    truncated = [p for p in doc["problems"] if p["code"] == "truncated"]
    assert truncated, doc
    assert "checkpoints/000014.note" in truncated[0]["detail"]  # sizes 15, 16, 17 are gone
    assert "15" in truncated[0]["detail"] and "14" in truncated[0]["detail"]
    assert len(truncated) == 3
    index = [p for p in doc["problems"] if p["code"] == "malformed_bundle"]
    assert any("bundle.json" in p["detail"] and "17" in p["detail"] for p in index)


def _delete(name: str) -> Callable[[Path], None]:
    def damage(b: Path) -> None:
        target = b / name
        if target.is_dir():
            for child in target.iterdir():
                child.unlink()
            target.rmdir()
        else:
            target.unlink()

    return damage


def _overwrite(name: str, data: bytes) -> Callable[[Path], None]:
    def damage(b: Path) -> None:
        (b / name).write_bytes(data)

    return damage


def _edit_index(**changes: object) -> Callable[[Path], None]:
    def damage(b: Path) -> None:
        index = json.loads((b / "bundle.json").read_text())
        index.update(changes)
        (b / "bundle.json").write_text(json.dumps(index))

    return damage


@pytest.mark.parametrize(
    ("damage", "code", "names"),
    [
        pytest.param(
            _delete("bundle.json"), "malformed_bundle", ["bundle.json"], id="index-deleted"
        ),
        pytest.param(
            _overwrite("bundle.json", b"\x00\xffgarbage{"),
            "malformed_bundle",
            ["bundle.json"],
            id="index-garbage",
        ),
        pytest.param(
            _overwrite("bundle.json", b'{"format": "something-else"}'),
            "malformed_bundle",
            ["bundle.json"],
            id="index-wrong-format",
        ),
        pytest.param(
            _edit_index(schema_version="9.9"),
            "malformed_bundle",
            ["bundle.json", "9.9"],
            id="index-unknown-schema-version",
        ),
        pytest.param(
            _delete("entries.jsonl"), "malformed_bundle", ["entries.jsonl"], id="entries-deleted"
        ),
        pytest.param(
            _delete("checkpoints"), "malformed_bundle", ["checkpoints"], id="checkpoints-deleted"
        ),
        pytest.param(
            _delete("log_key.pub"), "malformed_bundle", ["log_key.pub"], id="log-key-deleted"
        ),
        pytest.param(
            _overwrite("log_key.pub", b"\xff\xfe not a key"),
            "malformed_bundle",
            ["log_key.pub"],
            id="log-key-not-utf8",
        ),
        pytest.param(
            _overwrite("checkpoints/000001.note", b"garbage\n"),
            "checkpoint_invalid",
            ["checkpoints/000001.note"],
            id="note-garbage",
        ),
        pytest.param(
            _overwrite("entries.jsonl", b"\xff\xfe\x00\n"),
            "malformed_entry",
            ["entries.jsonl line 1"],
            id="entries-binary",
        ),
    ],
)
def test_malformed_bundle_is_a_problem_naming_the_file(
    world: World, damage: Callable[[Path], None], code: str, names: list[str]
) -> None:
    broken = broken_copy(world, "broken", damage)
    human = world.verify(broken)
    assert human.returncode == 1, human.stdout + human.stderr
    assert human.stdout.startswith("FAILED: ")
    for name in names:
        assert name in human.stdout

    result = world.verify(broken, "--json", "--key", world.user_key)
    assert result.returncode == 1
    doc = json_report(result)
    matching = [p for p in doc["problems"] if p["code"] == code]
    assert matching, doc["problems"]
    assert all(any(name in p["detail"] for p in matching) for name in names), matching


def test_missing_bundle_directory_exits_3(world: World) -> None:
    result = world.verify(world.dir / "no-bundle")
    assert result.returncode == 3
    assert "no-bundle" in result.stderr


# -- files that are not a store ---------------------------------------------------------------


def _not_sqlite(world: World, path: Path) -> None:
    path.write_bytes(b"this is not a database\n" * 100)


def _sqlite_without_tables(world: World, path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE unrelated (x)")
    conn.close()


def _store_cut_in_half(world: World, path: Path) -> None:
    src = sqlite3.connect(f"file:{world.store}?mode=ro", uri=True)
    dst = sqlite3.connect(path)
    src.backup(dst)
    src.close()
    dst.execute("PRAGMA journal_mode=DELETE")
    dst.close()
    data = path.read_bytes()
    assert len(data) > 8192
    path.write_bytes(data[: len(data) // 2])


NOT_A_STORE_COMMANDS = [
    ["log", "verify", "{path}"],
    ["log", "verify", "{path}", "--key", "{dir}/user.key"],
    ["log", "show", STREAM, "--store", "{path}"],
    ["log", "export", STREAM, "--store", "{path}", "--out", "{dir}/out"],
    ["log", "key", "--store", "{path}"],
]


@pytest.mark.parametrize(
    "make", [_not_sqlite, _sqlite_without_tables, _store_cut_in_half], ids=lambda f: f.__name__[1:]
)
def test_a_file_that_is_not_a_store_is_a_clear_error(
    world: World, make: Callable[[World, Path], None]
) -> None:
    """Exit 1 with a message naming the file, never a traceback, for every command."""
    path = world.dir / "suspect.db"
    make(world, path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    wrong = []
    for command in NOT_A_STORE_COMMANDS:
        args = [a.format(path=path, dir=world.dir) for a in command]
        result = affidavit(*args, cwd=world.dir)
        said = result.stdout + result.stderr
        if "Traceback" in result.stderr or result.returncode != 1 or "suspect.db" not in said:
            last = result.stderr.strip().splitlines()[-1:] or [result.stdout.strip()]
            wrong.append(f"{' '.join(command[:2])}: exit {result.returncode}, {last[0]}")
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
        assert not (world.dir / "out").exists()
    assert wrong == []


def test_a_closed_store_is_one_self_contained_file(tmp_path: Path, write_turn: Any) -> None:
    """After ``Log.close()`` the database file alone holds every entry (the WAL is folded in).

    Whoever copies ``record.db`` to an auditor after the writer stopped must copy everything.
    """
    user = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        written = write_turn(log, STREAM, 0)
    wal = tmp_path / "record.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, (
        f"{wal} still holds {wal.stat().st_size} bytes"
    )
    alone = tmp_path / "copy" / "record.db"
    alone.parent.mkdir()
    alone.write_bytes(store.read_bytes())
    result = affidavit("log", "verify", alone, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert json_report(result)["entries"] == len(written) + 1


# -- unknown schema_version --------------------------------------------------------------------


def test_unknown_schema_version_in_a_bundle_entry(world: World) -> None:
    def bump(b: Path) -> None:
        path = b / "entries.jsonl"
        lines = path.read_bytes().split(b"\n")
        assert b'"schema_version":"1.0"' in lines[6]
        lines[6] = lines[6].replace(b'"schema_version":"1.0"', b'"schema_version":"9.9"')
        path.write_bytes(b"\n".join(lines))

    broken = broken_copy(world, "v99", bump)
    result = world.verify(broken, "--json")
    assert result.returncode == 1
    doc = json_report(result)
    (bad,) = [p for p in doc["problems"] if p["code"] == "malformed_entry"]
    assert "9.9" in bad["detail"]
    assert "schema_version" in bad["detail"]
    assert "entries.jsonl line 7" in bad["detail"]
    human = world.verify(broken)
    assert "9.9" in human.stdout and "entries.jsonl line 7" in human.stdout


def test_unknown_schema_version_in_a_store_entry(world: World) -> None:
    lines = stored_lines(world.store, STREAM)
    entry = json.loads(lines[-1])
    seq = len(lines)
    entry.update(seq=seq, schema_version="9.9")
    line = canonical_json(entry)
    conn = sqlite3.connect(world.store)  # INSERT is not blocked: a newer writer could do this
    with conn:
        conn.execute(
            "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (?, ?, ?, ?)",
            (STREAM, seq, line, hash_leaf(line)),
        )
    conn.close()

    result = world.verify(world.store, "--json")
    assert result.returncode == 1
    doc = json_report(result)
    (bad,) = [p for p in doc["problems"] if p["code"] == "malformed_entry"]
    assert "9.9" in bad["detail"]
    assert "record.db" in bad["detail"]
    assert (bad["stream"], bad["seq"]) == (STREAM, seq)  # the entry it is about
    human = world.verify(world.store)
    (row,) = [s for s in human.stdout.splitlines() if "malformed_entry" in s]
    assert f"{STREAM}/{seq}" in row and "9.9" in row


# -- wrong keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"garbage", b"", b"-----BEGIN PRIVATE KEY-----\nAAAA\n"])
def test_a_key_file_holding_garbage_is_a_usage_error_naming_it(
    world: World, content: bytes
) -> None:
    bad = world.dir / "garbage.key"
    bad.write_bytes(content)
    bad.chmod(0o600)
    for target in (world.store, world.bundle):
        result = world.verify(target, "--key", bad)
        assert result.returncode == 2, result.stdout + result.stderr
        assert str(bad) in result.stderr
        assert result.stdout == ""
    shown = affidavit("log", "show", STREAM, "--store", world.store, "--key", bad, cwd=world.dir)
    assert shown.returncode == 2
    assert str(bad) in shown.stderr


def test_a_key_file_others_can_read_is_refused(world: World) -> None:
    loose = world.dir / "loose.key"
    loose.write_bytes(world.user_key.read_bytes())
    loose.chmod(0o644)
    result = world.verify(world.store, "--key", loose)
    assert result.returncode == 2
    assert str(loose) in result.stderr


def test_a_key_that_is_not_a_recipient_cannot_open(world: World) -> None:
    for target in (world.store, world.bundle):
        result = world.verify(target, "--key", world.stranger_key, "--json")
        assert result.returncode == 1
        doc = json_report(result)
        assert {p["code"] for p in doc["problems"]} == {"cannot_open"}
        assert doc["problems"][0]["stream"] == STREAM
        # the same stranger, without trying to open anything, finds the log itself fine
        assert world.verify(target).returncode == 0


# -- bodies that are not text ------------------------------------------------------------------


def non_utf8_bodies() -> list[Strict]:
    """Every sealed kind with a bytes field, each holding all 256 byte values."""
    data = ALL_BYTES
    assert any(b >= 0x80 for b in data)
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    return [
        TurnStarted(turn=0, input_bytes=data, input_digest=digest(Domain.INPUT, data)),
        ModelRequest(
            content_key=digest(Domain.REQUEST, data),
            input_digest=digest(Domain.INPUT, data[::-1]),
            prompt_digest=digest(Domain.PROMPT, data + data),
            request_bytes=data,
            input_bytes=data[::-1],
            prompt_bytes=data + data,
            provider=Provider(name="p", endpoint="https://p.example"),
            model_id="m",
            params={},
        ),
        ModelResponse(
            request_seq=2,
            outcome="COMMITTED",
            response_bytes=data,
            response_digest=digest(Domain.RESPONSE, data),
        ),
        ModelResponse(
            request_seq=2,
            outcome="FAILED",
            error_bytes=data,
            error_digest=digest(Domain.ERROR, data),
        ),
        ToolCall(
            reply_seq=3,
            call_id="c",
            server="s",
            tool="t",
            arguments=data,
            arguments_digest=digest(Domain.TOOL_ARGUMENTS, data),
            idempotent=False,
        ),
        ToolResult(
            call_seq=5,
            outcome="COMMITTED",
            result_bytes=data,
            result_digest=digest(Domain.TOOL_RESULT, data),
        ),
        FetchRequest(
            method="GET",
            url="https://example.org/",
            request_bytes=data,
            content_key=digest(Domain.FETCH_REQUEST, data),
        ),
        FetchResponse(
            request_seq=7,
            outcome="COMMITTED",
            status=200,
            response_bytes=data,
            response_digest=digest(Domain.FETCH_RESPONSE, data),
        ),
        TurnEnded(
            turn=0,
            outcome="ANSWERED",
            answer_bytes=data,
            answer_digest=digest(Domain.RESPONSE, data),
        ),
    ]


def _export_and_open(tmp_path: Path, store: Path, key: KeyPair, key_file: Path) -> list[Strict]:
    bundle = tmp_path / "exported"
    before = store_fingerprint(store)
    result = affidavit("log", "export", STREAM, "--store", store, "--out", bundle, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    verified = affidavit("log", "verify", bundle, "--key", key_file, "--json", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json_report(verified)["ok"] is True
    assert store_fingerprint(store) == before
    entries = bundle_entries(bundle)
    keys = StreamKeys.collect(STREAM, entries, key)
    return [keys.open(e) for e in entries if isinstance(e.body, str)]


def test_non_utf8_bodies_round_trip_byte_for_byte(tmp_path: Path) -> None:
    user = KeyPair.generate()
    user.write(tmp_path / "user.key")
    store = tmp_path / "record.db"
    written = non_utf8_bodies()
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        for body in written:
            log.append(STREAM, body)
    opened = _export_and_open(tmp_path, store, user, tmp_path / "user.key")
    assert opened == written
    for before, after in zip(written, opened, strict=True):
        for name in type(before).model_fields:
            value = getattr(before, name)
            if isinstance(value, bytes):
                assert getattr(after, name) == value, (type(before).__name__, name)


def test_a_16_mib_body_round_trips_byte_for_byte(tmp_path: Path) -> None:
    user = KeyPair.generate()
    user.write(tmp_path / "user.key")
    store = tmp_path / "record.db"
    big = random.Random(0x16).randbytes(SIXTEEN_MIB)
    assert len(big) == SIXTEEN_MIB
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        req = log.append(STREAM, non_utf8_bodies()[1])
        log.append(
            STREAM,
            ModelResponse(
                request_seq=req.seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=big,
                response_digest=digest(Domain.RESPONSE, big),
            ),
        )
    at_rest = [p for p in (store, tmp_path / "record.db-wal") if p.exists()]
    assert sum(os.path.getsize(p) for p in at_rest) > SIXTEEN_MIB  # it is really stored

    opened = _export_and_open(tmp_path, store, user, tmp_path / "user.key")
    reply = opened[-1]
    assert isinstance(reply, ModelResponse)
    assert reply.response_bytes is not None
    assert len(reply.response_bytes) == SIXTEEN_MIB
    assert hashlib.sha256(reply.response_bytes).digest() == hashlib.sha256(big).digest()
    assert reply.response_bytes == big
    assert reply.response_digest == "sha256:" + hashlib.sha256(b"\x01" + big).hexdigest()

    verified = affidavit("log", "verify", store, "--key", tmp_path / "user.key", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
