"""``attest bind-check``'s helpers word for word: what ``make mutate`` showed no test held.

``test_bind_check.py`` and ``test_bind_check_cli.py`` run whole bundles; here each helper is
given what a bundle would hand it: the notice printed when no key links a file to its entry,
the boot bundles ``bundle.json`` lists, the recipients of the clear entries (real entries,
written by the real log), the reports an ``evidence/`` folder holds, and a report whose name
names no kind of evidence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attestation.bind_check import _boot_streams, _judge, _link_notice, _recipients, _Report
from attestation.verdict import Check, Verdict
from record.log import Log
from record.schema import Entry, parse_entry
from record.seal import KeyPair
from tests.record.raw_store import stored_lines

STREAM = "bind-unit"
NOTICE_TAIL = (
    ", so which entry holds a file cannot be told: such a report is judged at the time of its "
    "stream's first evidence.archived entry that a signed checkpoint covers, and its files are "
    "not checked against their digests (a report vouches for its bytes by its signature)"
)


def test_the_link_notice_says_why_no_entry_holds_a_file() -> None:
    assert _link_notice(True) == (
        "boot evidence is sealed to the appliance's key, not this one" + NOTICE_TAIL
    )
    assert _link_notice(False) == "no key: evidence.archived bodies are sealed" + NOTICE_TAIL


def test_boot_streams_are_the_listed_names_that_are_plain_folders(tmp_path: Path) -> None:
    boot = tmp_path / "boot"
    for folder in ("boot-1", ".hidden", "a/b", "boot-2"):
        (boot / folder).mkdir(parents=True)
    (boot / "a-file").write_text("not a folder")
    listed = ["boot-2", "missing", "", "a/b", ".hidden", 7, "a-file", "boot-1"]
    (tmp_path / "bundle.json").write_text(json.dumps({"boot": listed}))
    assert _boot_streams(tmp_path, "bundle.json", "boot") == ["boot-2", "boot-1"]
    # nothing listed, a list that is not one, an index that is not an object or not there
    for index in ({}, {"boot": "boot-1"}, ["boot-1"]):
        (tmp_path / "bundle.json").write_text(json.dumps(index))
        assert _boot_streams(tmp_path, "bundle.json", "boot") == []
    assert _boot_streams(tmp_path, "absent.json", "boot") == []


@pytest.fixture(scope="module")
def opened(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Entry], list[str]]:
    """A real stream: stream.opened (two recipients), a sealed turn, key.rotated (a third)."""
    from record.digest import Domain, digest
    from record.schema import TurnStarted

    keys = [KeyPair.generate() for _ in range(3)]
    store = tmp_path_factory.mktemp("bind-unit") / "record.db"
    with Log.open(store) as log:
        log.open_stream(STREAM, [keys[0].recipient, keys[1].recipient])
        data = b"turn 0"
        log.append(STREAM, TurnStarted(turn=0, input_bytes=data, input_digest=digest(Domain.INPUT, data)))  # fmt: skip
        log.rotate_key(STREAM, [keys[1].recipient, keys[2].recipient])
    entries = [parse_entry(line) for line in stored_lines(store, STREAM)]
    assert [e.kind for e in entries] == ["stream.opened", "turn.started", "key.rotated"]
    return entries, [k.recipient.text() for k in keys]


def _without_kind(entry: Entry) -> Entry:
    assert isinstance(entry.body, dict)
    body = {k: v for k, v in entry.body.items() if k != "kind"}
    return entry.model_copy(update={"body": body})


def test_recipients_are_every_clear_entrys_each_once(
    opened: tuple[list[Entry], list[str]],
) -> None:
    entries, texts = opened
    assert _recipients(entries) == texts  # past the sealed turn, the rotation's new one added
    # a clear body that does not state its kind is not the record's (the bundle check names
    # it), so its recipients are not read, and the entries after it still are
    opening, turn, rotation = entries
    assert _recipients([_without_kind(opening), turn, rotation]) == texts[1:]


def test_a_report_whose_name_names_no_kind_is_not_judged(tmp_path: Path) -> None:
    item = _Report(
        "disk-20261201T120000Z.report", tmp_path, "disk-20261201T120000Z.report", None,
        frozenset(), 1, "2026-12-01T12:00:00Z", True, STREAM,
    )  # fmt: skip
    asked: list[Any] = []

    def never(*args: Any, **kwargs: Any) -> Verdict:
        asked.append(args)
        raise AssertionError("a report of no known kind was handed to a verifier")

    checks: list[Check] = []
    assert _judge(item, never, None, 5, checks) is None
    assert checks == [
        Check(
            "evidence.disk-20261201T120000Z.report",
            False,
            "not judged: its name names no kind of evidence",
        )
    ]
    assert asked == []


def test_unlinked_reports_take_the_first_signed_archive_and_their_kind_from_the_name(
    tmp_path: Path,
) -> None:
    from attestation.bind_check import _unlinked

    reader = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store) as log:
        log.open_stream(STREAM, [reader.recipient])
        log.archive_evidence(STREAM, "sev-snp", "snp-2026-12-01.report", b"report")
        log.archive_evidence(STREAM, "tdx", "tdx-2026-12-01.report", b"quote")
    entries = [parse_entry(line) for line in stored_lines(store, STREAM)]
    folder = tmp_path / "evidence"
    folder.mkdir()
    names = ["snp-2026-12-01.report", "snp-2026-12-01.certs.pem", "tdx-2026-12-01.report"]
    for name in names:
        (folder / name).write_bytes(b"x")
    first = entries[1]
    got = _unlinked(folder, "boot/s/", entries, 3, STREAM)
    assert got == [
        _Report(
            "boot/s/" + name, folder, name, kind, frozenset(names), 1, first.occurred_at,
            False, STREAM,
        )
        for name, kind in (("snp-2026-12-01.report", "snp"), ("tdx-2026-12-01.report", "tdx"))
    ]  # fmt: skip
    # no archive signed yet: no time to judge at; no folder: nothing to judge
    assert [(r.seq, r.occurred_at) for r in _unlinked(folder, "", entries, 1, STREAM)] == [
        (None, None),
        (None, None),
    ]
    assert _unlinked(tmp_path / "absent", "", entries, 3, STREAM) == []


def test_certs_that_do_not_parse_are_a_usage_error_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main

    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"not a certificate")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert main(["attest", "bind-check", str(bundle), "--certs", str(junk)]) == 2
    err = capsys.readouterr().err
    assert f"Error: Invalid value for --certs: {junk}: error parsing asn1 value" in err
