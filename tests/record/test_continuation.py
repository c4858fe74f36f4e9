"""#21 line 2: another appliance carries a session on in a new stream that names the old one.

Two appliances (their own log keys) share one PostgreSQL store (the private cluster of
``tests/pg_server.py``; a SQLite file keeps one appliance's key). Appliance A writes stream
``S``; appliance B, which may not write ``S``, opens ``S2`` whose ``stream.opened`` continues
``S`` (``record.continuation.link_to``). The audit checks the link against ``S`` as the store
holds it (docs/record.md §12 step 11): a link that holds is reported checked; one whose
checkpoint another key signed, that names another stream's checkpoint, takes more entries than
``S`` has or gives another root is ``continuation_broken`` and nothing else; so is a link that
held until an entry of ``S`` was changed. Where ``S`` is not at hand (a bundle of ``S2``), the
link is no problem and is reported unchecked.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from record import cli as record_cli
from record.audit import Continues, Report, verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import Signer, parse_note
from record.continuation import link_to, root_digest
from record.digest import Domain, digest
from record.log import LOG_KEY_NAME, Log
from record.postgres_store import PostgresStore
from record.schema import Continuation, StreamOpened, TurnStarted, parse_entry
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.record import independent_reader

S, S2 = "session-a", "session-b"


def _turn(n: int) -> TurnStarted:
    data = f"turn {n}".encode()
    return TurnStarted(turn=n, input_bytes=data, input_digest=digest(Domain.INPUT, data))


@pytest.fixture
def url(postgres_server: Any) -> Iterator[str]:
    made: str = postgres_server.fresh_database()
    yield made
    postgres_server.drop_database(made)


@dataclass
class Fleet:
    """Two appliances writing to one database; A has written ``S`` (an opening, three turns)."""

    url: str
    user: KeyPair
    a: Log
    b: Log
    b_signer: Signer

    def opening(self, stream: str) -> dict[str, Any]:
        first = next(iter(self.b.store.entries(stream, 0, 1)))
        body = parse_entry(first.line).body
        assert isinstance(body, dict)
        return body

    def continue_in(self, stream: str, link: Continuation) -> None:
        """B opens ``stream``, continuing ``link.stream``, and writes a turn in it."""
        self.b.open_stream(stream, [self.user.recipient], continues=link)
        self.b.append(stream, _turn(0))


@pytest.fixture
def fleet(url: str) -> Iterator[Fleet]:
    user = KeyPair.generate()
    a_signer, b_signer = Signer.generate(LOG_KEY_NAME), Signer.generate(LOG_KEY_NAME)
    with (
        Log(PostgresStore(url), a_signer, appliance_key=KeyPair.generate()) as a,
        Log(PostgresStore(url), b_signer, appliance_key=KeyPair.generate()) as b,
    ):
        a.open_stream(S, [user.recipient])
        for n in range(3):
            a.append(S, _turn(n))
        yield Fleet(url, user, a, b, b_signer)


def _codes_by_stream(report: Report) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in report.problems:
        out.setdefault(p.stream, set()).add(p.code)
    return out


def test_a_stream_another_appliance_continues_is_checked_and_holds(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    link = link_to(fleet.b.store, S)
    fleet.continue_in(S2, link)
    # the opening holds the link as made: S's last signed note verbatim, its size and root
    notes = fleet.b.store.checkpoints(S)
    assert fleet.opening(S2)["continues"] == {
        "stream": S,
        "checkpoint": notes[-1].note.decode(),
        "size": 4,
        "root": root_digest(fleet.b.store.leaf_hashes(S)),
    }
    assert notes[-1].size == 4

    report = verify_store(fleet.url, key=fleet.user)
    assert report.problems == [] and report.entries == 6
    assert report.continues == {S2: Continues(S, 4, 4, checked=True, holds=True)}
    assert report.to_json()["continues"] == {
        S2: {"stream": S, "size": 4, "checkpoint_size": 4, "checked": True, "holds": True}
    }

    assert record_cli.log_verify(fleet.url) == record_cli.EXIT_OK
    printed = capsys.readouterr().out
    assert (
        f"  stream {S2} continues {S} at entry 4 (checkpoint at 4, signed by {S}'s log key): "
        "link checked\n"
    ) in printed
    assert record_cli.log_verify(fleet.url, as_json=True) == record_cli.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["continues"][S2]["checked"] is True and doc["ok"] is True


def test_entries_past_the_checkpoint_are_taken_over_on_the_new_signers_word(
    fleet: Fleet,
) -> None:
    """An older checkpoint (S's opening only) and every entry since: the link holds, and
    says how far the old log key's own signature reaches."""
    first = fleet.b.store.checkpoints(S)[0]
    assert first.size == 1
    leaves = fleet.b.store.leaf_hashes(S)
    link = Continuation(stream=S, checkpoint=first.note.decode(), size=4, root=root_digest(leaves))
    fleet.continue_in(S2, link)
    report = verify_store(fleet.url)
    assert report.problems == []
    assert report.continues == {S2: Continues(S, 4, 1, checked=True, holds=True)}


def test_a_link_may_stop_before_the_checkpoint_it_names(fleet: Fleet) -> None:
    """A continuation that leaves the old stream's last step (or turn) behind takes fewer
    entries than the old log key signed: every entry it takes is under that signature."""
    good = link_to(fleet.b.store, S)
    leaves = fleet.b.store.leaf_hashes(S)
    fleet.continue_in(S2, good.model_copy(update={"size": 2, "root": root_digest(leaves[:2])}))
    report = verify_store(fleet.url)
    assert report.problems == []
    assert report.continues == {S2: Continues(S, 2, 4, checked=True, holds=True)}


def _broken_links(fleet: Fleet) -> dict[str, tuple[Continuation, str]]:
    """Links that do not hold against S, each with a part of the reason the audit gives."""
    good = link_to(fleet.b.store, S)
    leaves = fleet.b.store.leaf_hashes(S)
    text = parse_note(good.checkpoint.encode()).text
    fleet.a.open_stream("other", [fleet.user.recipient])  # A's own, under the same log key
    other = fleet.b.store.checkpoints("other")[-1].note.decode()
    return {
        "signed-by-b": (
            good.model_copy(update={"checkpoint": fleet.b_signer.sign_note(text).decode()}),
            "is not one its log key signed",
        ),
        "another-streams-checkpoint": (
            good.model_copy(update={"checkpoint": other}),
            "/other', not of that stream",
        ),
        "beyond-s": (
            good.model_copy(update={"size": 5}),
            "the link takes 5 entries of 'session-a'; it has 4",
        ),
        "wrong-root": (
            good.model_copy(update={"root": root_digest(leaves[:3])}),
            "at size 4 has another root than the link names",
        ),
        "below-its-checkpoint-wrong-root": (
            good.model_copy(update={"size": 3}),
            "at size 3 has another root than the link names",
        ),
    }


def test_a_link_that_does_not_hold_is_continuation_broken_and_nothing_else(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _broken_links(fleet)
    for name, (link, _) in broken.items():
        fleet.continue_in(name, link)
    report = verify_store(fleet.url, key=fleet.user)
    assert _codes_by_stream(report) == {name: {"continuation_broken"} for name in broken}
    for name, (_, reason) in broken.items():
        (problem,) = [p for p in report.problems if p.stream == name]
        assert problem.seq == 0 and problem.detail.startswith(f"continues {S!r}: ")
        assert reason in problem.detail, (name, problem.detail)
        assert report.continues[name].checked and report.continues[name].holds is False
    assert record_cli.log_verify(fleet.url) == record_cli.EXIT_PROBLEM
    printed = capsys.readouterr().out
    assert (
        f"  stream wrong-root continues {S} at entry 4: link BROKEN (continuation_broken above)\n"
    ) in printed
    # the reader written from docs/record.md alone agrees, given S's bundle
    export_stream(fleet.url, S, tmp_path / S)
    for name in broken:
        export_stream(fleet.url, name, tmp_path / name)
        alone = independent_reader.verify_bundle(tmp_path / name, continued=tmp_path / S)
        assert alone.codes() == {"continuation_broken"}, (name, alone.problems)


def _change_line(url: str, stream: str, seq: int) -> None:
    """Flip one byte of a sealed body in the database, leaving its stored leaf hash as it was
    (the triggers that refuse an UPDATE are bypassed as a superuser could)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        row = conn.execute(
            "SELECT line FROM entries WHERE stream = %s AND seq = %s", (stream, seq)
        ).fetchone()
        assert row is not None
        line = bytes(row[0])
        sealed = json.loads(line)["body"]
        raw = bytearray(base64.b64decode(sealed))
        raw[20] ^= 0x01
        changed = line.replace(sealed.encode(), base64.b64encode(bytes(raw)))
        assert changed != line and len(changed) == len(line)
        conn.execute(
            "UPDATE entries SET line = %s WHERE stream = %s AND seq = %s", (changed, stream, seq)
        )


def test_an_entry_of_the_old_stream_changed_after_the_link_breaks_it(fleet: Fleet) -> None:
    fleet.continue_in(S2, link_to(fleet.b.store, S))
    assert verify_store(fleet.url).ok
    _change_line(fleet.url, S, 2)
    report = verify_store(fleet.url)
    codes = _codes_by_stream(report)
    assert codes[S2] == {"continuation_broken"}
    assert "leaf_mismatch" in codes[S] and "continuation_broken" not in codes[S]
    assert report.continues[S2] == Continues(S, 4, 4, checked=True, holds=False)


def test_without_the_old_stream_the_link_is_no_problem_and_reported_unchecked(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.continue_in(S2, link_to(fleet.b.store, S))
    bundle = tmp_path / "bundle"
    export_stream(fleet.url, S2, bundle)
    report = verify_bundle(bundle, key=fleet.user)
    assert report.problems == []
    assert report.continues == {S2: Continues(S, 4, 4, checked=False, holds=None)}
    assert report.to_json()["continues"][S2]["checked"] is False

    assert record_cli.log_verify(str(bundle)) == record_cli.EXIT_OK
    printed = capsys.readouterr().out
    assert printed.startswith("ok: ")
    assert (
        f"  stream {S2} continues {S} at entry 4 (checkpoint at 4, not verified): not checked: "
        f"{S} is not in this bundle\n"
    ) in printed
    alone = independent_reader.verify_bundle(bundle)
    assert alone.ok and alone.continues == {"stream": S, "size": 4, "checked": False}


def test_an_opening_that_continues_nothing_is_written_as_before(tmp_path: Path) -> None:
    """No ``continues`` member at all (never ``null``): the line is what it was before the
    member existed, and an opening with one carries it as given."""
    user, signer = KeyPair.generate(), Signer.generate(LOG_KEY_NAME)
    store = tmp_path / "record.db"
    with Log(SQLiteStore(store), signer) as log:
        log.open_stream("plain", [user.recipient])
        link = link_to(log.store, "plain")
        log.open_stream("next", [user.recipient], continues=link)
        plain = next(iter(log.store.entries("plain", 0, 1))).line
        carried = next(iter(log.store.entries("next", 0, 1))).line
    body = parse_entry(plain).body
    assert isinstance(body, dict)
    before = {"kind", "origin", "log_key", "aead", "hpke_suite", "key_epoch", "recipients"}
    assert set(body) == before | {"labels"} and b"continues" not in plain
    assert StreamOpened.model_validate(body).continues is None
    next_body = parse_entry(carried).body
    assert isinstance(next_body, dict)
    assert Continuation.model_validate(next_body["continues"]) == link
    report = verify_store(store)
    assert report.ok and set(report.continues) == {"next"}
    assert "continues" not in verify_bundle(_exported(store, "plain", tmp_path)).to_json()


def _exported(store: Path, stream: str, tmp_path: Path) -> Path:
    out = tmp_path / f"bundle-{stream}"
    export_stream(store, stream, out)
    return out


def test_a_live_writer_is_seen_and_a_gone_one_is_not_on_both_stores(
    fleet: Fleet, tmp_path: Path
) -> None:
    """``writer_alive`` reads the lease's lock, not its row: what ``session continue`` asks
    before it carries a session on (a live appliance's stream would go on twice)."""
    assert fleet.b.store.writer_alive(S)  # A's writer holds S's lease
    assert not fleet.b.store.writer_alive("never-written")
    fleet.a.close()  # a clean stop lets go
    assert not fleet.b.store.writer_alive(S)
    assert fleet.b.store.lease(S) is not None  # the row stays: it is the lock that tells

    user, signer = KeyPair.generate(), Signer.generate(LOG_KEY_NAME)
    path = tmp_path / "record.db"
    log = Log(SQLiteStore(path), signer, appliance_key=KeyPair.generate())
    log.open_stream(S, [user.recipient])
    reader = SQLiteStore(path, readonly=True)
    try:
        assert reader.writer_alive(S)
        assert not reader.writer_alive("never-written")
        log.close()
        assert not reader.writer_alive(S)
        assert not reader.writer_alive(S)  # looking took nothing
    finally:
        reader.close()
