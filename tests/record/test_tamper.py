"""Tampering property test: every tampered copy of a real store or bundle fails ``verify``.

One real store is built per module (two streams, real sealing, real Ed25519 checkpoints; the
main stream is a six-turn tool-using session with non-UTF-8 replies, ending with the
checkpoint the writer signs after the last ``turn.ended``), and the main stream is exported
as a bundle. Hypothesis then draws, for each example, one kind of tampering, where it lands
(positions, byte offsets, replacement bytes, which checkpoint) and applies it to a fresh copy
of the store file or of the bundle directory. ``verify`` runs on the copy *without* a key, so
what is checked is integrity from the bytes alone, and must:

* not say ``ok``;
* report every code the kind of tampering must cause (``required``), naming the entry it
  concerns (``named``: a ``(code, seq)`` that must appear; ``seq_within``: the range every
  problem of a code must name);
* report nothing but codes that kind of tampering can cause (``allowed``), all of them on
  the tampered stream.

Expected codes, per kind of tampering:

=============================  ==========================================================
kind                           required (beyond it, what ``allowed`` adds)
=============================  ==========================================================
``entry_byte``                 a byte of a stored line changed (store: the ``line`` blob;
                               bundle: a byte of an ``entries.jsonl`` line, never a "\\n"
                               separator, though the new byte may be one).
                               ``root_mismatch`` at the first checkpoint covering the entry:
                               the Merkle leaf covers the exact stored bytes. Store: also
                               ``leaf_mismatch`` at the entry, whose stored leaf hash no
                               longer matches. A changed byte may also leave the line
                               malformed, or name another seq/stream/origin/log key.
``leaf_byte`` (store only)     a byte of the stored ``leaf_hash`` changed: ``leaf_mismatch``.
``checkpoint_byte``            a byte of a checkpoint note changed: ``checkpoint_invalid``.
``delete_entry``               ``seq_gap`` at the deleted seq, or ``truncated`` (at the new
                               size) when it was the last entry; may also break roots.
``swap_entries``               two distinct positions exchanged (store: ``line`` and
                               ``leaf_hash`` of two rows; bundle: two lines): ``seq_order``
                               naming the lower seq; may also break roots.
``duplicate_entry``            store: row j's line and leaf replaced by row i's (i != j);
                               bundle: a copy of line i inserted after it. ``seq_duplicate``
                               naming seq i; may also break roots (store: and leave a gap or
                               an out-of-order row).
(moving entry 0)               deleting, swapping, copying or overwriting ``stream.opened``
                               may also give ``malformed_entry`` at seq 0: a stream opens
                               with its one ``stream.opened``.
``truncate``                   the last k >= 1 entries dropped (all of them included):
                               ``truncated`` at the new size, and nothing else (a bundle
                               left with no line: ``malformed_bundle`` too).
``replace_checkpoint/*``       a checkpoint note replaced by one over the same size and root:
                               signed by another Ed25519 key of the same key name
                               (``other_key``), or carrying the real key's name and key ID
                               with another key's signature (``spoofed_key_id``), or signed
                               by the real key for the other stream's origin
                               (``other_origin``): ``checkpoint_invalid``, and nothing else.
=============================  ==========================================================

Every kind but ``leaf_byte`` and ``truncate`` may also give ``unsigned_tail``: the writer
signs a checkpoint at every commit, so a broken root or an invalid checkpoint leaves the
entries after the last checkpoint that still matches covered by no signature.

A bundle's ``bundle.json`` is "a convenience index, not evidence": a tamperer would keep its
entry count in step, and so do we, so ``malformed_bundle`` never is what catches tampering.

Every example's kind is counted; each test then checks that every kind was generated and
that it ran at least 500 tampered copies (at least 1,000 for the two tests together).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from record.audit import Report, verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import (
    Checkpoint,
    Note,
    NoteSignature,
    Signer,
    open_checkpoint,
    sign_checkpoint,
)
from record.log import LOG_KEY_NAME, Appended, Log, origin_for
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

MAIN = "session-main"
SIDE = "session-side"
MAIN_TURNS = 6  # 1 + 6 * 8 = 49 entries, 49 checkpoints (one per commit)
SIDE_TURNS = 1  # 1 + 8 = 9 entries, 9 checkpoints
EXAMPLES_PER_TEST = 600
MIN_COPIES_PER_TEST = 500

ENTRY_CHANGE = frozenset(
    {
        "root_mismatch",
        "leaf_mismatch",
        "malformed_entry",
        "stream_mismatch",
        "seq_gap",
        "seq_order",
        "seq_duplicate",
        "checkpoint_invalid",  # a changed log_key/origin in stream.opened
        "unsigned_tail",
    }
)
#: An invalid or mismatching checkpoint uncovers what only it signed.
UNSIGNED = {"unsigned_tail"}

REPLACEMENTS = ("other_key", "spoofed_key_id", "other_origin")
COMMON_KINDS = (
    "entry_byte",
    "checkpoint_byte",
    "delete_entry",
    "swap_entries",
    "duplicate_entry",
    "truncate",
    *(f"replace_checkpoint/{how}" for how in REPLACEMENTS),
)
STORE_KINDS = (*COMMON_KINDS, "leaf_byte")
BUNDLE_KINDS = COMMON_KINDS

#: Tampered copies actually verified, by (target, kind): filled by the examples as they run.
TAMPERED: Counter[tuple[str, str]] = Counter()


@dataclass(frozen=True)
class StreamFacts:
    name: str
    lines: tuple[bytes, ...]
    leaves: tuple[bytes, ...]
    checkpoints: tuple[tuple[int, bytes], ...]  # (size, note), in the order they were signed
    origin: str


@dataclass(frozen=True)
class Master:
    store: Path
    bundle: Path
    streams: dict[str, StreamFacts]
    signer: Signer
    impostor: Signer  # another Ed25519 key with the log key's name


@dataclass
class Expected:
    """What ``verify`` must say about one tampered copy (see the module docstring)."""

    kind: str
    stream: str
    detail: str
    required: frozenset[str]
    allowed: frozenset[str]
    named: list[tuple[str, int | None]] = field(default_factory=list)
    seq_within: dict[str, range] = field(default_factory=dict)

    def check(self, report: Report) -> None:
        codes = report.codes()
        where = f"{self.kind} on {self.stream} ({self.detail}): reported {report.dumps()}"
        assert not report.ok, f"verify missed the tampering: {where}"
        assert self.required <= codes, f"missing {sorted(self.required - codes)}: {where}"
        assert codes <= self.allowed, f"unexpected {sorted(codes - self.allowed)}: {where}"
        assert {p.stream for p in report.problems} == {self.stream}, where
        found = {(p.code, p.seq) for p in report.problems}
        for code, seq in self.named:
            assert (code, seq) in found, f"no {code} naming seq {seq}: {where}"
        for code, seqs in self.seq_within.items():
            named = {p.seq for p in report.problems if p.code == code}
            assert all(s in seqs for s in named), f"{code} names {named}: {where}"


# -- the real store ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def master(
    tmp_path_factory: pytest.TempPathFactory, write_turn: Callable[..., list[Appended]]
) -> Master:
    root = tmp_path_factory.mktemp("tamper-master")
    store = root / "record.db"
    user, appliance = KeyPair.generate(), KeyPair.generate()
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(MAIN, [user.recipient, appliance.recipient], {"pinned": "seed=42"})
        log.open_stream(SIDE, [user.recipient])
        for turn in range(max(MAIN_TURNS, SIDE_TURNS)):
            if turn < MAIN_TURNS:
                write_turn(log, MAIN, turn)
            if turn < SIDE_TURNS:
                write_turn(log, SIDE, turn, tag=b" (side)")
    # The writer closes its read-only connection last, which leaves the WAL beside the file:
    # fold it in, so that copying the one .db file copies the whole store.
    conn = sqlite3.connect(store)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert not store.with_name(store.name + "-wal").exists()

    signer = Signer.from_skey(store.with_name(store.name + ".signing-key").read_text())
    db = SQLiteStore(store, readonly=True)
    try:
        streams = {}
        for name in (MAIN, SIDE):
            entries = list(db.entries(name))
            cps = tuple((c.size, c.note) for c in db.checkpoints(name))
            streams[name] = StreamFacts(
                name,
                tuple(e.line for e in entries),
                tuple(e.leaf_hash for e in entries),
                cps,
                origin_for(signer, name),
            )
    finally:
        db.close()
    main = streams[MAIN]
    assert len(main.lines) == 1 + 8 * MAIN_TURNS
    assert main.checkpoints[-1][0] == len(main.lines), "the log must end with a checkpoint"
    side = streams[SIDE]
    assert side.checkpoints[-1][0] == len(side.lines) == 1 + 8 * SIDE_TURNS

    bundle = root / "bundle"
    export_stream(store, MAIN, bundle)
    master = Master(store, bundle, streams, signer, Signer.generate(LOG_KEY_NAME))
    # The untouched copies verify, so every problem below comes from the tampering.
    assert verify_store(store).ok
    assert verify_bundle(bundle).ok
    return master


# -- drawing one tampering ---------------------------------------------------------------------


def _changed_byte(data: st.DataObject, blob: bytes, label: str) -> tuple[int, int]:
    """(offset, new byte): a byte of ``blob`` and a value that differs from it."""
    offset = data.draw(st.integers(0, len(blob) - 1), label=f"{label} offset")
    delta = data.draw(st.integers(1, 255), label=f"{label} xor")
    return offset, blob[offset] ^ delta


def _first_cover(facts: StreamFacts, pos: int) -> int:
    """The seq a ``root_mismatch`` names for a change at ``pos``: the first checkpoint over it."""
    return min(size for size, _ in facts.checkpoints if size > pos) - 1


def _replacement(master: Master, facts: StreamFacts, index: int, how: str) -> bytes:
    size, note = facts.checkpoints[index]
    real, _ = open_checkpoint(note, [master.signer.verifier()])
    same = Checkpoint(real.origin, size, real.root_hash)
    if how == "other_key":
        assert master.impostor.name == master.signer.name
        forged = sign_checkpoint(master.impostor, same)
    elif how == "spoofed_key_id":
        sig = master.impostor.sign(same.body()).signature
        line = NoteSignature(master.signer.name, master.signer.key_id, sig)
        forged = Note(same.body(), (line,)).encode()
    else:
        assert how == "other_origin", how
        other = next(s for s in master.streams.values() if s.name != facts.name)
        forged = sign_checkpoint(master.signer, Checkpoint(other.origin, size, real.root_hash))
    assert forged != note
    return forged


@dataclass
class Plan:
    """One tampering, in terms of the stream's entries and checkpoints."""

    expected: Expected
    lines: list[bytes] | None = None  # bundle: the new entries.jsonl lines
    rows: dict[int, tuple[bytes, bytes] | None] = field(default_factory=dict)  # store: seq ->
    checkpoint: tuple[int, bytes] | None = None  # (index, new note)


def _draw_plan(data: st.DataObject, master: Master, facts: StreamFacts, target: str) -> Plan:
    kinds = STORE_KINDS if target == "store" else BUNDLE_KINDS
    # Not sampled_from: it favours the first kinds so much that the last ones come up only
    # a few times in 600 examples. A wide integer taken modulo the count is near uniform.
    kind = data.draw(st.integers(0, 2**16 - 1).map(lambda i: kinds[i % len(kinds)]), label="kind")
    lines, leaves = list(facts.lines), list(facts.leaves)
    n = len(lines)

    def opening(*moved: int) -> tuple[set[str], dict[str, range]]:
        """A stream must open with its one ``stream.opened``: moving entry 0 breaks that too."""
        if 0 in moved:
            return {"malformed_entry"}, {"malformed_entry": range(1)}
        return set(), {}

    def expect(
        detail: str,
        required: set[str],
        allowed: set[str],
        named: list[tuple[str, int | None]],
        seq_within: dict[str, range] | None = None,
    ) -> Expected:
        return Expected(
            kind,
            facts.name,
            detail,
            frozenset(required),
            frozenset(allowed | required),
            named,
            seq_within or {},
        )

    if kind == "entry_byte":
        pos = data.draw(st.integers(0, n - 1), label="entry")
        offset, new = _changed_byte(data, lines[pos], "line")
        line = lines[pos][:offset] + bytes([new]) + lines[pos][offset + 1 :]
        named: list[tuple[str, int | None]] = [("root_mismatch", _first_cover(facts, pos))]
        required = {"root_mismatch"}
        if target == "store":
            named.append(("leaf_mismatch", pos))
            required.add("leaf_mismatch")
        detail = f"entry {pos}, byte {offset}: {lines[pos][offset]:#04x} -> {new:#04x}"
        exp = expect(detail, required, set(ENTRY_CHANGE), named)
        return Plan(exp, [*lines[:pos], line, *lines[pos + 1 :]], {pos: (line, leaves[pos])})

    if kind == "leaf_byte":
        pos = data.draw(st.integers(0, n - 1), label="entry")
        offset, new = _changed_byte(data, leaves[pos], "leaf")
        leaf = leaves[pos][:offset] + bytes([new]) + leaves[pos][offset + 1 :]
        detail = (
            f"leaf hash of entry {pos}, byte {offset}: {leaves[pos][offset]:#04x} -> {new:#04x}"
        )
        exp = expect(detail, {"leaf_mismatch"}, set(), named=[("leaf_mismatch", pos)])
        return Plan(exp, None, {pos: (lines[pos], leaf)})

    if kind == "checkpoint_byte":
        index = data.draw(st.integers(0, len(facts.checkpoints) - 1), label="checkpoint")
        note = facts.checkpoints[index][1]
        offset, new = _changed_byte(data, note, "note")
        changed = note[:offset] + bytes([new]) + note[offset + 1 :]
        detail = f"checkpoint #{index}, byte {offset}: {note[offset]:#04x} -> {new:#04x}"
        exp = expect(detail, {"checkpoint_invalid"}, UNSIGNED, named=[("checkpoint_invalid", None)])
        return Plan(exp, checkpoint=(index, changed))

    if kind.startswith("replace_checkpoint/"):
        how = kind.split("/", 1)[1]
        index = data.draw(st.integers(0, len(facts.checkpoints) - 1), label="checkpoint")
        forged = _replacement(master, facts, index, how)
        exp = expect(
            f"checkpoint #{index} replaced ({how})",
            {"checkpoint_invalid"},
            UNSIGNED,
            named=[("checkpoint_invalid", None)],
        )
        return Plan(exp, checkpoint=(index, forged))

    if kind == "delete_entry":
        pos = data.draw(st.integers(0, n - 1), label="entry")
        if pos == n - 1:
            exp = expect(
                f"entry {pos} (the last)", {"truncated"}, set(), named=[("truncated", pos)]
            )
        else:
            also, within = opening(pos)
            exp = expect(
                f"entry {pos}",
                {"seq_gap"},
                {"root_mismatch", "truncated", *UNSIGNED, *also},
                named=[("seq_gap", pos), ("truncated", n - 1)],
                seq_within=within,
            )
        return Plan(exp, lines[:pos] + lines[pos + 1 :], {pos: None})

    if kind == "swap_entries":
        i = data.draw(st.integers(0, n - 2), label="first")
        j = data.draw(st.integers(i + 1, n - 1), label="second")
        swapped = list(lines)
        swapped[i], swapped[j] = lines[j], lines[i]
        also, within = opening(i, j)
        exp = expect(
            f"entries {i} and {j}",
            {"seq_order"},
            {"root_mismatch", *UNSIGNED, *also},
            named=[("seq_order", i)],
            seq_within={"seq_order": range(i, j + 1), **within},
        )
        return Plan(exp, swapped, {i: (lines[j], leaves[j]), j: (lines[i], leaves[i])})

    if kind == "duplicate_entry":
        i = data.draw(st.integers(0, n - 1), label="copied")
        if target == "store":
            other = data.draw(st.integers(0, n - 2), label="overwritten")
            j = other if other < i else other + 1
            also, within = opening(i, j)
            exp = expect(
                f"entry {j} overwritten with entry {i}",
                {"seq_duplicate"},
                {"root_mismatch", "seq_gap", "seq_order", *UNSIGNED, *also},
                named=[("seq_duplicate", i)],
                seq_within=within,
            )
            return Plan(exp, None, {j: (lines[i], leaves[i])})
        also, within = opening(i)
        exp = expect(
            f"entry {i} repeated after itself",
            {"seq_duplicate"},
            {"root_mismatch", *UNSIGNED, *also},
            named=[("seq_duplicate", i)],
            seq_within=within,
        )
        return Plan(exp, [*lines[: i + 1], lines[i], *lines[i + 1 :]])

    assert kind == "truncate", kind
    k = data.draw(st.integers(1, n), label="dropped")
    # a bundle left with no line is no bundle (docs/record.md §12 step 2)
    empty = {"malformed_bundle"} if target == "bundle" and k == n else set()
    exp = expect(
        f"the last {k} of {n} entries",
        {"truncated", *empty},
        set(),
        named=[("truncated", n - k)],
        seq_within={"truncated": range(n - k, n - k + 1)},
    )
    return Plan(exp, lines[: n - k], {seq: None for seq in range(n - k, n)})


# -- applying it -------------------------------------------------------------------------------

_TRIGGERS = [f"{t}_no_{op}" for t in ("entries", "checkpoints") for op in ("update", "delete")]


def _tamper_store(path: Path, stream: str, plan: Plan) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for name in _TRIGGERS:  # the append-only guards: what anyone with the file can drop
            conn.execute(f"DROP TRIGGER {name}")
        for seq, row in plan.rows.items():
            if row is None:
                cur = conn.execute(
                    "DELETE FROM entries WHERE stream = ? AND seq = ?", (stream, seq)
                )
            else:
                cur = conn.execute(
                    "UPDATE entries SET line = ?, leaf_hash = ? WHERE stream = ? AND seq = ?",
                    (row[0], row[1], stream, seq),
                )
            assert cur.rowcount == 1
        if plan.checkpoint is not None:
            index, note = plan.checkpoint
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM checkpoints WHERE stream = ? ORDER BY id", (stream,)
                )
            ]
            cur = conn.execute("UPDATE checkpoints SET note = ? WHERE id = ?", (note, ids[index]))
            assert cur.rowcount == 1
        conn.execute("COMMIT")
    finally:
        conn.close()


def _tamper_bundle(path: Path, plan: Plan) -> None:
    if plan.lines is not None:
        (path / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in plan.lines))
        index = json.loads((path / "bundle.json").read_bytes())
        index["entries"] = len(b"\n".join(plan.lines).split(b"\n")) if plan.lines else 0
        (path / "bundle.json").write_bytes(
            json.dumps(index, indent=2, sort_keys=True).encode() + b"\n"
        )
    if plan.checkpoint is not None:
        index_no, note = plan.checkpoint
        (path / "checkpoints" / f"{index_no:06d}.note").write_bytes(note)


# -- the tests ---------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=EXAMPLES_PER_TEST,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


def _run_property(
    target: str,
    kinds: tuple[str, ...],
    body: Callable[[st.DataObject, Path], None],
    work: Path,
) -> None:
    counter = iter(range(10**9))

    @SETTINGS
    @given(data=st.data())
    def example(data: st.DataObject) -> None:
        folder = work / f"{next(counter):06d}"
        folder.mkdir()
        try:
            body(data, folder)
        finally:
            shutil.rmtree(folder)

    before = Counter({k: v for k, v in TAMPERED.items() if k[0] == target})
    example()
    ran = Counter({kind: TAMPERED[(target, kind)] - before[(target, kind)] for kind in kinds})
    print(f"\n{target}: {sum(ran.values())} tampered copies: {dict(sorted(ran.items()))}")
    missing = sorted(kind for kind in kinds if ran[kind] == 0)
    assert not missing, f"kinds of tampering never generated for the {target}: {missing}"
    assert sum(ran.values()) >= MIN_COPIES_PER_TEST, ran


def test_every_tampered_store_copy_fails_verify(
    master: Master, tmp_path_factory: pytest.TempPathFactory
) -> None:
    def body(data: st.DataObject, folder: Path) -> None:
        stream = data.draw(st.sampled_from([MAIN, SIDE]), label="stream")
        plan = _draw_plan(data, master, master.streams[stream], "store")
        copy = folder / "record.db"
        shutil.copyfile(master.store, copy)
        _tamper_store(copy, stream, plan)
        report = verify_store(copy)
        TAMPERED[("store", plan.expected.kind)] += 1
        plan.expected.check(report)

    _run_property("store", STORE_KINDS, body, tmp_path_factory.mktemp("tampered-stores"))


def test_every_tampered_bundle_copy_fails_verify(
    master: Master, tmp_path_factory: pytest.TempPathFactory
) -> None:
    def body(data: st.DataObject, folder: Path) -> None:
        plan = _draw_plan(data, master, master.streams[MAIN], "bundle")
        copy = folder / "bundle"
        shutil.copytree(master.bundle, copy)
        _tamper_bundle(copy, plan)
        report = verify_bundle(copy)
        TAMPERED[("bundle", plan.expected.kind)] += 1
        plan.expected.check(report)

    _run_property("bundle", BUNDLE_KINDS, body, tmp_path_factory.mktemp("tampered-bundles"))
