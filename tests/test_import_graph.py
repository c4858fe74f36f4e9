"""Which way imports point (``../shared/design/architecture.md``), read from the source.

Every ``import`` and ``from … import`` of our packages is collected, those inside functions
included (a lazy import is still a dependency), those under ``if TYPE_CHECKING:`` left out
(they never run). Then:

- no two modules import each other (a circle makes import order matter and hides layering);
- ``record`` imports nothing of ours: an auditor's ``pip install affidavit`` verifies with it
  alone;
- ``attestation`` imports only ``record`` of ours (to bind a log key into evidence);
- ``egress_proxy`` imports only ``record`` of ours;
- ``harness`` imports neither ``inference`` nor ``enclave_image``: ``affidavit up`` runs the
  engine as a process of its own, and the one command line is assembled above the parts, in
  ``affidavit.cli``, which nothing of ours imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "affidavit",
    "record",
    "egress_proxy",
    "harness",
    "inference",
    "attestation",
    "enclave_image",
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p) for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _type_checking_only(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


def _imported(tree: ast.Module) -> Iterator[str]:
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # ``from record import merkle`` imports record.merkle
                whole = f"{node.module}.{alias.name}"
                yield whole if whole in MODULES else node.module


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = _module(path)
            found = _imported(ast.parse(path.read_text("utf-8")))
            graph[name] = {t for t in found if t in MODULES and t != name}
    return graph


GRAPH = _graph()


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def test_the_graph_is_read() -> None:
    """The reader sees what is there: a known import, and a lazy one inside a function."""
    assert "record.merkle" in GRAPH["record.log"]
    assert "attestation.cli" in GRAPH["attestation.bind_check"] or (
        "attestation.evidence" in GRAPH["attestation.bind_check"]
    )


def test_no_two_modules_import_each_other() -> None:
    circles = sorted(
        {tuple(sorted((a, b))) for a, targets in GRAPH.items() for b in targets if a in GRAPH[b]}
    )
    assert circles == []


def test_each_part_imports_only_the_parts_below_it() -> None:
    allowed = {"record": set(), "attestation": {"record"}, "egress_proxy": {"record"}}
    wrong = sorted(
        (module, target)
        for module, targets in GRAPH.items()
        for target in targets
        if _package(module) in allowed
        and _package(target) != _package(module)
        and _package(target) not in allowed[_package(module)]
    )
    assert wrong == []


def test_the_harness_reaches_neither_the_engine_nor_the_image() -> None:
    wrong = sorted(
        (module, target)
        for module, targets in GRAPH.items()
        if _package(module) == "harness"
        for target in targets
        if _package(target) in ("inference", "enclave_image")
    )
    assert wrong == []


def test_the_command_line_is_assembled_above_every_part() -> None:
    """``affidavit.cli`` takes each part's commands; no part reaches up to it."""
    assert {"record.cli", "inference.cli", "harness.commands", "enclave_image.cli"} <= GRAPH[
        "affidavit.cli"
    ]
    assert sorted(m for m, targets in GRAPH.items() if "affidavit.cli" in targets) == [
        "affidavit.__main__"
    ]
