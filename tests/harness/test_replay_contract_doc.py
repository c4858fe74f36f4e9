"""Every test ``docs/replay-contract.md`` names exists, so the contract cannot silently lose
its enforcement when a test is renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


def test_every_named_test_exists() -> None:
    text = (REPO / "docs" / "replay-contract.md").read_text()
    named = NAMED.findall(text)
    assert len(named) >= 15
    for file, test in named:
        path = REPO / file
        assert path.is_file(), file
        tests = _tests_in(path)
        assert tests, f"{file} holds no tests"
        if test:
            assert test in tests, f"{file}::{test} is named in the contract but does not exist"


def test_every_contract_line_of_the_reference_is_covered() -> None:
    reference = REPO.parent / "shared" / "reference" / "reproducible-record.txt"
    text = (REPO / "docs" / "replay-contract.md").read_text()
    sections = re.findall(r"^\d+\. \*\*", text, flags=re.M)
    if reference.is_file():
        lines = [x for x in reference.read_text().splitlines() if x.startswith("[ ]")]
        assert len(sections) >= len(lines)
    else:
        assert len(sections) >= 7
