"""The auditor bundle (``record.bundle.verify_bundle``), written from one input: parts cut at
``SEPARATOR`` are ``bundle.json``, ``entries.jsonl``, ``log_key.pub``, ``recipients.txt``
and then the checkpoint notes, in order. It is audited with the stream's reader key, so
sealed bodies are opened too.

No typed error: "a malformed bundle is a problem found, never a crash".
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from fuzz._record import sample
from record.bundle import verify_bundle

ERRORS: tuple[type[BaseException], ...] = ()
SEPARATOR = b"\n--8<--\n"
_FILES = ("bundle.json", "entries.jsonl", "log_key.pub", "recipients.txt")


@functools.cache
def _folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="affidavit-fuzz-bundle-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def seeds() -> list[bytes]:
    files = sample().files
    notes = [v for k, v in sorted(files.items()) if k.startswith("checkpoints/")]
    whole = SEPARATOR.join([files[name] for name in _FILES] + notes)
    return [whole, SEPARATOR.join([files[name] for name in _FILES] + notes[-1:])]


def target(data: bytes) -> None:
    root = _folder() / "bundle"
    shutil.rmtree(root, ignore_errors=True)
    (root / "checkpoints").mkdir(parents=True)
    parts = data.split(SEPARATOR)
    for name, part in zip(_FILES, parts, strict=False):
        (root / name).write_bytes(part)
    for i, note in enumerate(parts[len(_FILES) :]):
        (root / "checkpoints" / f"{i:06d}.note").write_bytes(note)
    verify_bundle(root, key=sample().reader)
