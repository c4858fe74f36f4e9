"""``record.store``'s rules, in process: the names evidence files are kept under, and the
one-writer-per-stream lease rules (``claim``, ``lease_held``, ``check_lease``).

A bundle writes each evidence file as ``evidence/<name>``, so a name that climbs out of that
folder, hides itself or is empty must be refused before anything is stored.
"""

from __future__ import annotations

import pytest

from record.errors import LeaseHeld, LeaseLost
from record.store import Lease, check_evidence_name, check_lease, claim, lease_held


@pytest.mark.parametrize("name", ["snp-report.bin", "a", "gpu.0.json", "x.", "a..b", "a\\b"])
def test_a_plain_file_name_is_taken(name: str) -> None:
    check_evidence_name(name)


@pytest.mark.parametrize(
    "name", ["", ".", "..", ".hidden", "../up", "a/b", "/abs", "dir/", "./a", "a/.."]
)
def test_a_name_that_is_not_a_plain_file_name_is_refused_word_for_word(name: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_evidence_name(name)
    assert str(caught.value) == f"evidence name {name!r} must be a plain file name"


# -- one writer per stream: the lease rules, word for word -------------------------------------


def test_claim_writes_the_takers_lease_and_names_only_a_holder_that_never_let_go() -> None:
    now = "2026-12-02T18:00:00.000000Z"
    taken = Lease("s", "me", now, released=False)
    crashed = Lease("s", "crashed", "2026-12-01T00:00:00.000000Z", released=False)
    let_go = Lease("s", "gone", "2026-12-01T00:00:00.000000Z", released=True)
    mine = Lease("s", "me", "2026-12-01T00:00:00.000000Z", released=False)
    for row, orphaned in ((None, None), (let_go, None), (mine, None), (crashed, crashed)):
        result = claim("s", row, "me", now)
        assert result == (taken, orphaned)
        assert result[0].released is False and type(result[0].stream) is str


def test_a_second_writer_is_refused_naming_the_holder_word_for_word() -> None:
    held = lease_held("s", Lease("s", "host pid 7 ab", "2026-12-02T18:00:00.000000Z", False))
    assert type(held) is LeaseHeld
    assert str(held) == (
        "stream 's' is being written by another live process (host pid 7 ab, since "
        "2026-12-02T18:00:00.000000Z): one writer per stream; stop that one first, or "
        "continue the session in a new stream"
    )
    assert str(lease_held("s", None)) == (
        "stream 's' is being written by another live process (another writer): one writer "
        "per stream; stop that one first, or continue the session in a new stream"
    )


def test_a_write_without_the_lease_is_refused_word_for_word() -> None:
    since = "2026-12-02T18:00:00.000000Z"
    check_lease("s", Lease("s", "me", since, released=False), "me")  # its own: taken
    for lease, who in (
        (None, "nobody"),
        (Lease("s", "me", since, released=True), "nobody"),
        (Lease("s", "other", since, released=True), "nobody"),
        (Lease("s", "other", since, released=False), "other"),
    ):
        with pytest.raises(LeaseLost) as caught:
            check_lease("s", lease, "me")
        assert str(caught.value) == (
            f"stream 's': this writer (me) does not hold its lease ({who} does); nothing of "
            "this batch was written"
        )
