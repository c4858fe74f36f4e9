"""A small real stream, written once by the real log into a temporary store and exported as
a bundle: the seeds of the entry, checkpoint and bundle targets."""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from record.bundle import export_stream
from record.digest import Domain, digest
from record.log import Log
from record.schema import TurnEnded, TurnStarted
from record.seal import KeyPair


@dataclass(frozen=True)
class Sample:
    """What one exported stream holds."""

    files: dict[str, bytes]  # the bundle's files by relative path
    lines: tuple[bytes, ...]  # entries.jsonl, line by line
    notes: tuple[bytes, ...]  # the signed checkpoint notes
    log_key: str  # the C2SP verifier key of the checkpoint signer
    reader: KeyPair  # the recipient key the stream is sealed to


@functools.cache
def sample() -> Sample:
    with tempfile.TemporaryDirectory(prefix="affidavit-fuzz-record-") as tmp:
        folder = Path(tmp)
        log = Log.open(folder / "record.db", appliance_key=KeyPair.generate())
        reader = KeyPair.generate()
        try:
            log.open_stream("fuzz", [reader.recipient], {"purpose": "fuzz"})
            said = b"hello"
            log.append(
                "fuzz",
                TurnStarted(turn=0, input_bytes=said, input_digest=digest(Domain.INPUT, said)),
            )
            log.append(
                "fuzz",
                TurnEnded(
                    turn=0,
                    outcome="ANSWERED",
                    answer_bytes=said,
                    answer_digest=digest(Domain.RESPONSE, said),
                ),
            )
            log.checkpoint("fuzz")
            log_key = log.log_key()
        finally:
            log.close()
        out = folder / "bundle"
        export_stream(folder / "record.db", "fuzz", out)
        files = {
            str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
        }
    lines = tuple(files["entries.jsonl"].splitlines())
    notes = tuple(v for k, v in files.items() if k.endswith(".note"))
    json.loads(files["bundle.json"])  # the export wrote an index
    return Sample(files, lines, notes, log_key, reader)
