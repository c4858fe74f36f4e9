"""``record.store``'s one rule, in process: the names evidence files are kept under.

A bundle writes each evidence file as ``evidence/<name>``, so a name that climbs out of that
folder, hides itself or is empty must be refused before anything is stored.
"""

from __future__ import annotations

import pytest

from record.store import check_evidence_name


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
