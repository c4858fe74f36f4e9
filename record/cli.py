"""``affidavit keys …`` and ``affidavit log …``: the record's own commands.

They need nothing but ``record`` (an auditor's ``pip install affidavit`` runs them).

Exit codes everywhere: 0 fine, 1 a problem was found, 2 usage error, 3 something it needs
is missing (a store, bundle or key file). Commands print for people by default and one JSON
document with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from record.audit import Problem, Report, verify_store
from record.bundle import export_stream, verify_bundle
from record.errors import RecordError, StoreMissing
from record.redact import RedactionRules
from record.seal import KeyPair
from record.show import show_stream

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3


class UsageError(Exception):
    """Bad arguments that argparse could not see (exit 2)."""


def _read_key(path: str | None) -> KeyPair | None:
    if path is None:
        return None
    try:
        return KeyPair.read(Path(path))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _read_kept(paths: Sequence[str]) -> list[bytes]:
    kept = []
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise StoreMissing(f"checkpoint file {path} does not exist")
        kept.append(path.read_bytes())
    return kept


def cmd_keys_new(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        raise UsageError(f"{out} already exists; refusing to overwrite a key")
    pair = KeyPair.generate()
    pair.write(out)
    print(pair.recipient.text())
    return EXIT_OK


def cmd_log_verify(args: argparse.Namespace) -> int:
    path = Path(args.path)
    key = _read_key(args.key)
    kept = _read_kept(args.against or [])
    if path.is_dir():
        report = verify_bundle(path, key=key, kept=kept, log_key=args.log_key)
    elif path.is_file():
        try:
            report = verify_store(path, key=key, kept=kept, log_key=args.log_key)
        except sqlite3.DatabaseError as exc:
            detail = f"{path} is not a readable record store: {exc}"
            report = Report(problems=[Problem("malformed_store", "?", None, detail)])
    else:
        raise StoreMissing(f"{path} is neither a store file nor a bundle directory")
    _print_report(report, path, args.json)
    return EXIT_OK if report.ok else EXIT_PROBLEM


def _print_report(report: Report, path: Path, as_json: bool) -> None:
    if as_json:
        print(report.dumps())
        return
    if report.ok:
        print(
            f"ok: {path}: {report.entries} entries in {len(report.streams)} stream(s), no problem"
        )
        return
    print(f"FAILED: {path}: {len(report.problems)} problem(s) in {report.entries} entries")
    for p in report.problems:
        where = f"{p.stream}/{p.seq}" if p.seq is not None else p.stream
        print(f"  {p.code:<24} {where:<28} {p.detail}")


def cmd_log_export(args: argparse.Namespace) -> int:
    store = Path(args.store)
    if not store.is_file():
        raise StoreMissing(f"store {store} does not exist")
    try:
        index = export_stream(store, args.stream, args.out)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"exported {index['entries']} entries and {index['checkpoints']} checkpoint(s) "
        f"of {args.stream} to {args.out}"
    )
    return EXIT_OK


def cmd_log_show(args: argparse.Namespace) -> int:
    store = Path(args.store)
    if not store.is_file():
        raise StoreMissing(f"store {store} does not exist")
    try:
        rules = RedactionRules.parse(args.redact or "")
    except ValueError as exc:
        raise UsageError(f"--redact: {exc}") from None
    key = _read_key(args.key)
    for line in show_stream(store, args.stream, key=key, rules=rules, as_json=args.json):
        print(line)
    return EXIT_OK


def cmd_log_key(args: argparse.Namespace) -> int:
    from record.sqlite_store import SQLiteStore

    store = SQLiteStore(args.store, readonly=True)
    try:
        vkey = store.get_meta("log_key")
    finally:
        store.close()
    if vkey is None:
        print(f"store {args.store} has no log key yet", file=sys.stderr)
        return EXIT_PROBLEM
    print(vkey)
    return EXIT_OK


def cmd_log_checkpoint(args: argparse.Namespace) -> int:
    from record.log import Log

    store = Path(args.store)
    if not store.is_file():
        raise StoreMissing(f"store {store} does not exist")
    with Log.open(store) as log:
        cp = log.checkpoint(args.stream)
    if args.out:
        Path(args.out).write_bytes(cp.note)
    sys.stdout.write(cp.note.decode())
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``keys`` and ``log`` on the top-level parser."""
    keys = sub.add_parser("keys", help="recipient keys").add_subparsers(dest="keys", required=True)
    new = keys.add_parser("new", help="write an X25519 keypair (0600) and print its public key")
    new.add_argument("--out", required=True, help="file for the private key")
    new.set_defaults(func=cmd_keys_new)

    log = sub.add_parser("log", help="the record").add_subparsers(dest="log", required=True)
    verify = log.add_parser("verify", help="audit a store file or a bundle directory")
    verify.add_argument("path", help="store file or bundle directory")
    verify.add_argument("--key", help="a recipient private key: also open bodies, check digests")
    verify.add_argument(
        "--against",
        action="append",
        metavar="CHECKPOINT_FILE",
        help="a checkpoint kept earlier: the log must still be consistent with it",
    )
    verify.add_argument("--log-key", help="pin the checkpoint signer's verifier key")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(func=cmd_log_verify)

    export = log.add_parser("export", help="write a stream's auditor bundle")
    export.add_argument("stream")
    export.add_argument("--store", required=True)
    export.add_argument("--out", required=True)
    export.set_defaults(func=cmd_log_export)

    show = log.add_parser("show", help="print a stream's entries, redacted at read time")
    show.add_argument("stream")
    show.add_argument("--store", required=True)
    show.add_argument("--key", help="a recipient private key to open bodies")
    show.add_argument("--redact", help="rules: FIELD, KIND:FIELD or re:PATTERN, comma-separated")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_log_show)

    key = log.add_parser("key", help="print the log's checkpoint verifier key")
    key.add_argument("--store", required=True)
    key.set_defaults(func=cmd_log_key)

    checkpoint = log.add_parser("checkpoint", help="sign a checkpoint of a stream now")
    checkpoint.add_argument("stream")
    checkpoint.add_argument("--store", required=True)
    checkpoint.add_argument("--out", help="also write the note to this file")
    checkpoint.set_defaults(func=cmd_log_checkpoint)


def run(args: argparse.Namespace) -> int:
    """Call the command's function, turning errors into the documented exit codes."""
    try:
        code: int = args.func(args)
        return code
    except UsageError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreMissing as exc:
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except RecordError as exc:
        print(f"affidavit: {exc.diagnostics()}", file=sys.stderr)
        return exc.exit_code
    except sqlite3.DatabaseError as exc:
        where = getattr(args, "path", None) or getattr(args, "store", None) or "the store"
        print(f"affidavit: {where} is not a readable record store: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    except json.JSONDecodeError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
