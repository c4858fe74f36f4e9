"""The auditor bundle: one stream, exported as a self-contained directory.

::

    bundle.json          {"format", "schema_version", "stream", "entries", "checkpoints",
                          "log_key", "recipients", "evidence"}
    entries.jsonl        every entry exactly as stored, one per line, each ending in "\\n"
    checkpoints/NNNNNN.note   every checkpoint the log signed for the stream, in order
    log_key.pub          the C2SP verifier key of the checkpoint signer
    recipients.txt       the X25519 public keys the stream's data keys are sealed to
    evidence/            archived attestation evidence, when the stream has any
    boot/<stream>/       a bundle of each of the store's boot-evidence streams (labelled
                         ``affidavit/boot-evidence``), in the same layout, never nested further

``bundle.json`` is a convenience index, not evidence: the audit trusts only the entries,
the checkpoints and the log key (pinned by the user or by attestation). A boot bundle is
checked under the SAME log key as its parent, so the appliance's boot evidence travels with
every session it signed (docs/record.md §11). Export never changes the store; loading never
writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from record.audit import Problem, Report, Row, check_stream
from record.backends import open_store
from record.errors import StoreMissing, UnknownStream
from record.schema import CLEAR_KINDS, SCHEMA_VERSION, parse_entry
from record.seal import KeyPair
from record.store import LogStore

FORMAT = "affidavit-bundle/v1"
ENTRIES = "entries.jsonl"
INDEX = "bundle.json"
LOG_KEY = "log_key.pub"
RECIPIENTS = "recipients.txt"
CHECKPOINTS = "checkpoints"
EVIDENCE = "evidence"
BOOT = "boot"
#: The ``stream.opened`` label of the appliance's boot-evidence stream (its value: the stamp).
BOOT_LABEL = "affidavit/boot-evidence"


def export_stream(store_path: Path | str, stream: str, out: Path | str) -> dict[str, Any]:
    """Write the bundle of ``stream`` into ``out`` (created; must be empty if it exists), with
    a nested bundle of every boot-evidence stream of the store under ``boot/<stream>/``."""
    out = Path(out)
    store = open_store(store_path, readonly=True)
    try:
        if store.size(stream) == 0:
            raise UnknownStream(f"store {store_path} holds no stream {stream!r}")
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not empty")
        boot = [s for s in boot_streams(store) if s != stream]
        out.mkdir(parents=True, exist_ok=True)
        for name in boot:
            _write_stream(store, name, out / BOOT / name, [])
        return _write_stream(store, stream, out, boot)
    finally:
        store.close()


def boot_streams(store: LogStore) -> list[str]:
    """The streams whose clear ``stream.opened`` carries :data:`BOOT_LABEL`: the appliance's
    boot evidence. Readable without a key; a stream name that cannot be a folder is left out."""
    found: list[str] = []
    for name in store.streams():
        first = next(iter(store.entries(name, 0, 1)), None)
        if first is None or not _plain_name(name) or b'"kind":"stream.opened"' not in first.line:
            continue
        try:
            body = parse_entry(first.line).body
        except Exception:  # a malformed line: its own audit names it
            continue
        labels = body.get("labels") if isinstance(body, dict) else None
        if isinstance(labels, dict) and BOOT_LABEL in labels:
            found.append(name)
    return found


def _write_stream(store: LogStore, stream: str, out: Path, boot: list[str]) -> dict[str, Any]:
    """One stream's files (entries, checkpoints, evidence, keys, index) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    recipients: list[str] = []
    opened_by = ""  # the log key the stream's opening names: a shared store has no other
    with _atomic(out / ENTRIES) as fh:
        for stored in store.entries(stream):
            fh.write(stored.line + b"\n")
            count += 1
            if b'"kind":"stream.opened"' in stored.line or b'"kind":"key.rotated"' in stored.line:
                entry = parse_entry(stored.line)
                if entry.kind == "stream.opened" and isinstance(entry.body, dict):
                    opened_by = str(entry.body.get("log_key") or "")
                if entry.kind in CLEAR_KINDS and isinstance(entry.body, dict):
                    for item in entry.body.get("recipients", []):  # type: ignore[union-attr]
                        if isinstance(item, dict) and item["recipient"] not in recipients:
                            recipients.append(str(item["recipient"]))
    (out / CHECKPOINTS).mkdir(exist_ok=True)
    checkpoints = store.checkpoints(stream)
    for i, cp in enumerate(checkpoints):
        with _atomic(out / CHECKPOINTS / f"{i:06d}.note") as fh:
            fh.write(cp.note)
    evidence = store.evidence(stream)
    if evidence:
        (out / EVIDENCE).mkdir(exist_ok=True)
        for name, data in evidence:
            with _atomic(out / EVIDENCE / name) as fh:
                fh.write(data)
    log_key = store.get_meta("log_key") or opened_by
    with _atomic(out / LOG_KEY) as fh:
        fh.write(log_key.encode() + b"\n")
    with _atomic(out / RECIPIENTS) as fh:
        fh.write("".join(r + "\n" for r in recipients).encode())
    index: dict[str, Any] = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "stream": stream,
        "entries": count,
        "checkpoints": len(checkpoints),
        "log_key": log_key,
        "recipients": recipients,
        "evidence": [name for name, _ in evidence],
    }
    if boot:  # left out when none: such a bundle is byte for byte what older exports wrote
        index[BOOT] = boot
    with _atomic(out / INDEX) as fh:
        fh.write(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
    return index


class _atomic:
    """Write to ``path.tmp``, fsync, then rename, so a half-written file never appears."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")

    def __enter__(self) -> Any:
        self.fh = open(self.tmp, "wb")
        return self.fh

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def verify_bundle(
    path: Path | str,
    *,
    key: KeyPair | None = None,
    kept: Sequence[bytes] = (),
    log_key: str | None = None,
    allow_unsigned_tail: bool = False,
) -> Report:
    """Audit an exported bundle and its boot bundles; a malformed bundle is a problem found,
    never a crash. ``report.entries`` counts the bundle's own stream only."""
    root = Path(path)
    if not root.is_dir():
        raise StoreMissing(f"bundle directory {root} does not exist")
    report = Report(allow_unsigned_tail=allow_unsigned_tail)
    index, stream, log_key = _verify_one(root, report, key=key, kept=kept, log_key=log_key)
    _verify_boot(root, index, stream, log_key, report)
    return report


def _verify_one(
    root: Path,
    report: Report,
    *,
    key: KeyPair | None,
    kept: Sequence[bytes],
    log_key: str | None,
) -> tuple[dict[str, Any] | None, str, str | None]:
    """docs/record.md §12 steps 1–9 (and §13 with a key) for the stream of ``root``; its
    index, its stream's name and the log key it was checked under."""
    index, stream, problems = _read_index(root)
    report.problems += problems
    rows, problems = _read_entries(root, stream)
    report.problems += problems
    if stream is None:
        stream = _stream_from_rows(rows) or "?"
    if log_key is None:
        log_key, problems = _read_log_key(root, stream)
        report.problems += problems
    notes = _read_checkpoints(root, stream, report.problems)
    if (
        index is not None
        and isinstance(index.get("entries"), int)
        and index["entries"] != len(rows)
    ):
        report.problems.append(
            Problem(
                "malformed_bundle",
                stream,
                None,
                f"{INDEX} lists {index['entries']} entries, {ENTRIES} holds {len(rows)}",
            )
        )
    listed = index.get("checkpoints") if index is not None else None
    if isinstance(listed, int) and listed > len(notes):  # an extra one is judged by its signature
        detail = f"{INDEX} lists {listed} checkpoints, {CHECKPOINTS}/ holds {len(notes)}"
        report.problems.append(Problem("malformed_bundle", stream, None, detail))
    report.entries = len(rows)
    names = _evidence_names(root)
    report.problems += _check_evidence_index(root, index, names, stream)
    kept_pairs = [(f"kept checkpoint #{i}", note) for i, note in enumerate(kept)]
    report.add_stream(
        check_stream(
            stream,
            rows,
            notes,
            log_key,
            key=key,
            kept=kept_pairs,
            evidence=_evidence_reader(root),
            evidence_names=names,
        )
    )
    return index, stream, log_key


def boot_names(root: Path) -> list[str]:
    """Every name in the bundle's ``boot/`` (a file or link among them too)."""
    folder = root / BOOT
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _verify_boot(
    root: Path, index: dict[str, Any] | None, stream: str, log_key: str | None, report: Report
) -> None:
    """docs/record.md §12 step 10: ``bundle.json``'s ``boot`` list against ``boot/``, and each
    boot bundle checked as steps 1–9 say, without a key, under the SAME log key. Its problems
    keep their codes and name ``boot/<stream>`` in the detail."""
    listed = index.get(BOOT) if index is not None else None
    names = boot_names(root)
    if listed is None:  # an older bundle: no boot member, and then no boot/ either
        listed = []
    if not isinstance(listed, list) or not all(_plain_name(n) for n in listed):
        detail = f"{INDEX}: boot is not a list of plain stream names"
        report.problems.append(Problem("malformed_bundle", stream, None, detail))
        return
    for name in listed:
        if not (root / BOOT / name).is_dir():
            detail = f"{INDEX} lists {BOOT}/{name}/; it is missing"
            report.problems.append(Problem("evidence_missing", stream, None, detail))
    for name in names:
        if name not in listed:
            detail = f"{BOOT}/{name} is not listed in {INDEX}"
            report.problems.append(Problem("evidence_unlisted", stream, None, detail))
    for name in listed:
        folder = root / BOOT / name
        if not folder.is_dir():
            continue
        nested = Report(allow_unsigned_tail=report.allow_unsigned_tail)
        inner, inner_stream, _ = _verify_one(folder, nested, key=None, kept=(), log_key=log_key)
        if (inner is not None and inner.get(BOOT) not in (None, [])) or (folder / BOOT).exists():
            detail = "a boot bundle holds no boot bundle of its own"
            nested.problems.append(Problem("malformed_bundle", inner_stream, None, detail))
        if inner is not None and inner.get("stream") != name:
            detail = f"{INDEX} names stream {inner.get('stream')!r}, not its folder's"
            nested.problems.append(Problem("malformed_bundle", inner_stream, None, detail))
        own, _ = _read_log_key(folder, inner_stream)
        if own is not None and log_key is not None and own != log_key:
            detail = f"{LOG_KEY} names {own}, not the bundle's log key {log_key}"
            nested.problems.append(Problem("checkpoint_invalid", inner_stream, None, detail))
        report.streams += nested.streams
        report.unsigned.update(nested.unsigned)
        report.problems += [
            Problem(p.code, p.stream, p.seq, f"{BOOT}/{name}: {p.detail}") for p in nested.problems
        ]


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and not name.startswith(".")


def _evidence_names(root: Path) -> list[str]:
    """Every name in the bundle's ``evidence/`` (a folder or link among them too)."""
    folder = root / EVIDENCE
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _check_evidence_index(
    root: Path, index: dict[str, Any] | None, names: Sequence[str], stream: str
) -> list[Problem]:
    """``bundle.json``'s ``evidence`` list against ``evidence/``: checkable without a key.

    The index is no evidence, but a file it lists that is not there, or a file that is there
    and not listed, is a bundle that was changed after export (docs/record.md §12 step 1).
    """
    listed = index.get("evidence") if index is not None else None
    if listed is None:
        return []
    if not isinstance(listed, list) or not all(_plain_name(n) for n in listed):
        detail = f"{INDEX}: evidence is not a list of plain file names"
        return [Problem("malformed_bundle", stream, None, detail)]
    problems = [
        Problem("evidence_missing", stream, None, f"{INDEX} lists evidence/{n}; it is missing")
        for n in listed
        if not (root / EVIDENCE / n).is_file()
    ]
    problems += [
        Problem("evidence_unlisted", stream, None, f"evidence/{n} is not listed in {INDEX}")
        for n in names
        if n not in listed
    ]
    return problems


def _evidence_reader(root: Path) -> Callable[[str], bytes | None]:
    """Read ``evidence/NAME`` of the bundle; ``None`` when it is missing or not a plain name."""

    def read(name: str) -> bytes | None:
        path = root / EVIDENCE / name
        if not _plain_name(name) or not path.is_file():
            return None
        return path.read_bytes()

    return read


def _read_index(root: Path) -> tuple[dict[str, Any] | None, str | None, list[Problem]]:
    path = root / INDEX
    try:
        index = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, None, [Problem("malformed_bundle", "?", None, f"{path} is missing")]
    except (ValueError, UnicodeDecodeError) as exc:
        return None, None, [Problem("malformed_bundle", "?", None, f"{path}: not JSON ({exc})")]
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        return None, None, [Problem("malformed_bundle", "?", None, f"{path}: not a {FORMAT} index")]
    if index.get("schema_version") != SCHEMA_VERSION:
        version = index.get("schema_version")
        detail = f"{path}: unknown schema_version {version!r}; this reader knows {SCHEMA_VERSION!r}"
        return index, None, [Problem("malformed_bundle", "?", None, detail)]
    stream = index.get("stream")
    return index, stream if isinstance(stream, str) else None, []


def _read_entries(root: Path, stream: str | None) -> tuple[list[Row], list[Problem]]:
    path = root / ENTRIES
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], [Problem("malformed_bundle", stream or "?", None, f"{path} is missing")]
    problems: list[Problem] = []
    if not data:
        problems.append(Problem("malformed_bundle", stream or "?", None, f"{path} holds no entry"))
    elif not data.endswith(b"\n"):
        problems.append(
            Problem("malformed_bundle", stream or "?", None, f"{path}: last line is cut short")
        )
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    rows = [Row(line, None, None, f"{path.name} line {i + 1}") for i, line in enumerate(lines)]
    return rows, problems


def _stream_from_rows(rows: Sequence[Row]) -> str | None:
    for row in rows:
        try:
            return parse_entry(row.line).stream
        except Exception:
            continue
    return None


def _read_log_key(root: Path, stream: str) -> tuple[str | None, list[Problem]]:
    path = root / LOG_KEY
    try:
        return path.read_text("utf-8").strip(), []
    except FileNotFoundError:
        return None, [Problem("malformed_bundle", stream, None, f"{path} is missing")]
    except UnicodeDecodeError:
        return None, [Problem("malformed_bundle", stream, None, f"{path} is not UTF-8")]


def _read_checkpoints(root: Path, stream: str, problems: list[Problem]) -> list[tuple[str, bytes]]:
    folder = root / CHECKPOINTS
    if not folder.is_dir():
        problems.append(Problem("malformed_bundle", stream, None, f"{folder} is missing"))
        return []
    return [
        (f"{CHECKPOINTS}/{p.name}", p.read_bytes())
        for p in sorted(folder.iterdir())
        if p.suffix == ".note"
    ]
