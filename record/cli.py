"""``affidavit keys …`` and ``affidavit log …``: the record's own commands.

They need nothing but ``record`` and ``typer`` (an auditor's ``pip install affidavit`` runs
them); ``affidavit.cli`` builds the ``affidavit`` app and calls :func:`register`.

Exit codes everywhere: 0 fine, 1 a problem was found, 2 usage error, 3 something it needs
is missing (a store, bundle or key file). Commands print for people by default and one JSON
document with ``--json``.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, ParamSpec

import typer

from record.audit import (
    CONTINUATION_BROKEN,
    UNSIGNED_TAIL,
    Continues,
    Problem,
    Report,
    verify_store,
)
from record.backends import (
    StoreLocation,
    is_url,
    location,
    open_store,
    reason,
    store_exists,
    store_name,
    unreachable,
)
from record.bundle import export_stream, verify_bundle
from record.checkpoint import CheckpointError, Signer
from record.errors import RecordError, StoreMissing, UnknownStream
from record.log import LOG_KEY_NAME
from record.redact import RedactionRules
from record.seal import KeyPair
from record.show import show_stream

__all__ = [
    "EXIT_MISSING",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "UsageError",
    "counted",
    "home_log_key",
    "home_store",
    "register",
    "report_error",
    "run",
]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3

_P = ParamSpec("_P")


class UsageError(Exception):
    """Bad arguments that the parser could not see (exit 2)."""


# -- errors to exit codes ------------------------------------------------------------------


def report_error(exc: BaseException, where: object = None) -> int | None:
    """Print ``exc`` for people on stderr and return its exit code; ``None`` if not ours.

    ``where`` names the store or bundle a command was reading, for a database error.
    """
    if isinstance(exc, UsageError):
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, StoreMissing | UnknownStream):  # a mistyped stream id is missing, too
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        return EXIT_MISSING
    if isinstance(exc, RecordError):
        print(f"affidavit: {exc.diagnostics()}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, sqlite3.DatabaseError):
        print(
            f"affidavit: {where or 'the store'} is not a readable record store: {exc}",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    if isinstance(exc, json.JSONDecodeError):
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    if type(exc).__module__.split(".")[0] == "psycopg":  # only there when a URL was opened
        return _database_error(exc, where)
    return None


def _database_error(exc: BaseException, where: object) -> int:
    """A PostgreSQL store's error in one line: one gone away is missing (3), any other
    refusal is a store that is not a readable record (1)."""
    import psycopg

    place = where if isinstance(where, str | Path) else "the store"
    if isinstance(exc, psycopg.OperationalError):
        print(f"affidavit: missing: {unreachable(place, exc)}", file=sys.stderr)
        return EXIT_MISSING
    print(
        f"affidavit: {store_name(place)} is not a readable record store: {reason(exc)}",
        file=sys.stderr,
    )
    return EXIT_PROBLEM


def run(command: Callable[[], int], where: object = None) -> int:
    """Call ``command``, turning the errors we know into the documented exit codes."""
    try:
        return command()
    except Exception as exc:
        code = report_error(exc, where)
        if code is None:
            raise
        return code


def _command(body: Callable[_P, int]) -> Callable[_P, None]:
    """A typer command whose ``body`` returns the exit code; errors become exit codes too."""

    def command(*args: _P.args, **kwargs: _P.kwargs) -> None:
        where = kwargs.get("path") or kwargs.get("store")
        code = run(lambda: body(*args, **kwargs), where=where)
        if code != EXIT_OK:
            raise typer.Exit(code)

    # Applied here and in ``register``, never as decorators: mutmut leaves a decorated
    # function unmutated, and these bodies are what ``make mutate`` must reach.
    return functools.wraps(body)(command)


# -- helpers -------------------------------------------------------------------------------


def _read_key(path: str | None) -> KeyPair | None:
    if path is None:
        return None
    try:
        return KeyPair.read(Path(path))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


#: In a home: the store ``up --store URL`` was given, so that readers find it with no ``up``
#: running, and the log's signing key for a database store (a file store keeps its key
#: beside it, ``record.db.signing-key``).
STORE_FILE = "store"
SIGNING_KEY_FILE = "record.signing-key"


def home_root(home: Path | None) -> Path:
    """The state folder: ``home`` as given, else ``$AFFIDAVIT_HOME``, else ``.affidavit``."""
    return home if home is not None else Path(os.environ.get("AFFIDAVIT_HOME") or ".affidavit")


def home_store(home: Path | None) -> StoreLocation:
    """The record store of a state folder (default ``$AFFIDAVIT_HOME``, else ``.affidavit``):
    the one its ``appliance.json`` names while ``affidavit up`` runs, else the one its
    ``store`` file names (written by ``up --store URL``), else ``record.db`` in it, where
    ``up`` keeps it; so reading the record needs no running appliance."""
    root = home_root(home)
    try:
        named = json.loads((root / "appliance.json").read_bytes())["store"]
    except (OSError, ValueError, KeyError, TypeError):
        named = None
    if not isinstance(named, str):
        try:
            named = (root / STORE_FILE).read_text().strip() or None
        except OSError:
            named = None
    if named is None:
        return root / "record.db"
    return location(named)


def home_log_key(home: Path | None, store: StoreLocation | None = None) -> str | None:
    """The log key of the appliance a state folder belongs to: the one its ``appliance.json``
    names (the appliance image's, whose key only its proxy may read), else the verifier of
    its ``record.signing-key`` (``up --store URL``), else None. On a store several appliances
    share, this home's streams are the ones signed by it. ``store``: the store asked about;
    ``appliance.json``'s key counts only for the store it names."""
    root = home_root(home)
    try:
        doc = json.loads((root / "appliance.json").read_bytes())
        named, its_store = doc.get("log_key"), doc.get("store")
    except (OSError, ValueError, AttributeError):
        named = its_store = None
    if isinstance(named, str) and named and (store is None or str(store) == its_store):
        return named
    mine = root / SIGNING_KEY_FILE
    if not mine.is_file():
        return None
    try:
        return Signer.load_or_create(mine, LOG_KEY_NAME).vkey()  # there: loaded, never made
    except (OSError, CheckpointError):
        return None


def _store_of(store: str | None, home: Path | None) -> StoreLocation:
    """``--store`` (a file, a ``postgresql://`` URL or a ``control:`` socket) if given, else
    the home's store; a missing file: exit 3, naming where it looked."""
    source: StoreLocation = home_store(home) if store is None else store
    if not is_url(source):
        source = Path(source)
        if not source.is_file():
            hint = "" if store is not None else ": run `affidavit up` first, or pass --store"
            raise StoreMissing(f"store {source} does not exist{hint}")
    return source


def counted(n: int, thing: str, things: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a count with its noun in the right number."""
    return f"{n} {thing if n == 1 else things or thing + 's'}"


def kept_checkpoint_files(values: Sequence[str]) -> list[Path]:
    """The files ``--against`` names, each once, in the order first named: each value a
    checkpoint file, a folder (every file under it, such as a home's ``checkpoints/``) or a
    quoted glob (``'kept/*.note'``)."""
    import glob

    files: list[Path] = []
    for value in values:
        path = Path(value)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise StoreMissing(f"checkpoint folder {path} holds no file")
            files += found
        elif path.is_file():
            files.append(path)
        elif glob.has_magic(value) and (matched := sorted(glob.glob(value))):
            files += [Path(m) for m in matched if Path(m).is_file()]
        else:
            raise StoreMissing(f"checkpoint file {path} does not exist")
    return list(dict.fromkeys(files))  # a file named twice (its folder and a glob) counts once


def _read_kept(values: Sequence[str]) -> list[bytes]:
    return [path.read_bytes() for path in kept_checkpoint_files(values)]


def _print_report(report: Report, path: str, as_json: bool, *, holder: str = "store") -> None:
    if as_json:
        print(report.dumps())
        return
    if report.ok:
        print(
            f"ok: {path}: {counted(report.entries, 'entry', 'entries')} in "
            f"{counted(len(report.streams), 'stream')}, no problem"
        )
    else:
        print(
            f"FAILED: {path}: {counted(len(report.problems), 'problem')} in "
            f"{counted(report.entries, 'entry', 'entries')}"
        )
        for p in report.problems:
            where = f"{p.stream}/{p.seq}" if p.seq is not None else p.stream
            print(f"  {p.code:<24} {where:<28} {p.detail}")
    if report.allow_unsigned_tail:
        # a stream no checkpoint covers at all is refused even so (docs/record.md §10.4)
        refused = {p.stream for p in report.problems if p.code == UNSIGNED_TAIL}
        for stream, count in sorted(report.unsigned.items()):
            if count and stream not in refused:
                print(
                    f"  allowed: {stream}: {counted(count, 'entry', 'entries')} no checkpoint "
                    "covers (unsigned tail)"
                )
    for stream, link in sorted(report.continues.items()):
        print(f"  {_continuation_line(stream, link, holder)}")


def _continuation_line(stream: str, link: Continues, holder: str) -> str:
    """One line per stream that continues another: whether its link was checked, and how."""
    old = link.stream
    at = "?" if link.checkpoint_size is None else str(link.checkpoint_size)
    head = f"stream {stream} continues {old} at entry {link.size}"
    if not link.checked:
        return (
            f"{head} (checkpoint at {at}, not verified): not checked: {old} is not in this {holder}"
        )
    if link.holds:
        return f"{head} (checkpoint at {at}, signed by {old}'s log key): link checked"
    return f"{head}: link BROKEN ({CONTINUATION_BROKEN} above)"


# -- the commands --------------------------------------------------------------------------

_Json = Annotated[bool, typer.Option("--json", help="print one JSON object")]
_Store = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="STORE",
        help="the record store: a file, a postgresql:// URL or control:/path/to/control.sock "
        "(default: the home's store)",
    ),
]
_Home = Annotated[
    Path | None,
    typer.Option(
        "--home",
        metavar="DIR",
        help="the state folder whose store to read (default: $AFFIDAVIT_HOME or ./.affidavit)",
    ),
]
_Stream = Annotated[str, typer.Argument(metavar="STREAM", help="the stream (session) id")]


def keys_new(
    out: Annotated[
        str | None,
        typer.Option(
            metavar="KEY_FILE",
            help="file for the private key (or --home: the home's user.key, which the harness "
            "opens its sessions with)",
            show_default=False,
        ),
    ] = None,
    home: _Home = None,
    as_json: _Json = False,
) -> int:
    """Write an X25519 keypair (0600) and print its public key."""
    if out is None and home is None:  # a key is never written where nobody asked for it
        raise UsageError("give --out KEY_FILE, or --home DIR for the home's user.key")
    target = Path(out) if out is not None else home_root(home) / "user.key"
    if target.exists():
        raise UsageError(f"{target} already exists; refusing to overwrite a key")
    if out is None:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pair = KeyPair.generate()
    pair.write(target)
    if as_json:
        print(json.dumps({"key_file": str(target), "public_key": pair.recipient.text()}))
    else:
        print(pair.recipient.text())
    return EXIT_OK


def log_verify(
    path: Annotated[
        str | None,
        typer.Argument(
            metavar="[PATH]",
            help="store file or bundle directory (default: the home's store)",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            metavar="KEY_FILE", help="a recipient private key: also open bodies, check digests"
        ),
    ] = None,
    against: Annotated[
        list[str] | None,
        typer.Option(
            metavar="CHECKPOINT",
            help="checkpoints kept earlier: a file, a folder (every file under it) or a quoted "
            "glob; the log must still be consistent with each (repeatable)",
        ),
    ] = None,
    log_key: Annotated[
        str | None, typer.Option(metavar="VKEY", help="pin the checkpoint signer's verifier key")
    ] = None,
    allow_unsigned_tail: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned-tail",
            help="do not fail on entries after a stream's last checkpoint (still counted); "
            "for stores written before every commit was signed",
        ),
    ] = False,
    home: _Home = None,
    as_json: _Json = False,
) -> int:
    """Audit a store (a file, a postgresql:// URL or control:/path/to/control.sock) or a
    bundle directory (default: the home's store)."""
    target = _store_of(None, home) if path is None else location(path)
    pair = _read_key(key)
    kept = _read_kept(against or [])
    bundle = isinstance(target, Path) and target.is_dir()
    if isinstance(target, Path) and bundle:
        report = verify_bundle(
            target, key=pair, kept=kept, log_key=log_key, allow_unsigned_tail=allow_unsigned_tail
        )
    elif store_exists(target):
        try:
            report = verify_store(
                target,
                key=pair,
                kept=kept,
                log_key=log_key,
                allow_unsigned_tail=allow_unsigned_tail,
            )
        except sqlite3.DatabaseError as exc:
            detail = f"{target} is not a readable record store: {exc}"
            report = Report(problems=[Problem("malformed_store", "?", None, detail)])
    else:
        raise StoreMissing(f"{target} is neither a store file nor a bundle directory")
    _print_report(report, store_name(target), as_json, holder="bundle" if bundle else "store")
    return EXIT_OK if report.ok else EXIT_PROBLEM


def log_export(
    stream: _Stream,
    out: Annotated[
        str, typer.Option(metavar="DIR", help="the bundle directory to write (absent or empty)")
    ],
    store: _Store = None,
    home: _Home = None,
    as_json: _Json = False,
) -> int:
    """Write a stream's auditor bundle."""
    source = _store_of(store, home)
    try:
        index = export_stream(source, stream, out)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print(json.dumps({"stream": stream, "bundle": str(out), **index}, default=str))
        return EXIT_OK
    boot = index.get("boot", [])
    print(
        f"exported {counted(index['entries'], 'entry', 'entries')} and "
        f"{counted(index['checkpoints'], 'checkpoint')} of {stream} to {out}"
        + (f", with {counted(len(boot), 'boot bundle')}: {', '.join(boot)}" if boot else "")
    )
    return EXIT_OK


def log_show(
    stream: _Stream,
    store: _Store = None,
    home: _Home = None,
    key: Annotated[
        str | None, typer.Option(metavar="KEY_FILE", help="a recipient private key to open bodies")
    ] = None,
    redact: Annotated[
        str | None,
        typer.Option(
            metavar="RULES", help="rules: FIELD, KIND:FIELD or re:PATTERN, comma-separated"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object a line")] = False,
) -> int:
    """Print a stream's entries, redacted at read time."""
    source = _store_of(store, home)
    try:
        rules = RedactionRules.parse(redact or "")
    except ValueError as exc:
        raise UsageError(f"--redact: {exc}") from None
    pair = _read_key(key)
    for line in show_stream(source, stream, key=pair, rules=rules, as_json=as_json):
        print(line)
    return EXIT_OK


def log_key(store: _Store = None, home: _Home = None, as_json: _Json = False) -> int:
    """Print the log's checkpoint verifier key: the store's, or for a database several
    appliances share, this home's appliance's."""
    source = _store_of(store, home)
    opened = open_store(source, readonly=True)
    try:
        vkey = opened.get_meta("log_key")
        shared = opened.shared
    finally:
        opened.close()
    mine = home_root(home) / SIGNING_KEY_FILE
    if vkey is None and shared:
        vkey = home_log_key(home, source)
    if vkey is None and shared:
        print(
            f"store {store_name(source)} is shared and keeps no one log key (each stream's is "
            f"in its stream.opened), and neither this home's appliance.json nor {mine} names "
            "an appliance's key",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    if vkey is None:
        print(f"store {store_name(source)} has no log key yet", file=sys.stderr)
        return EXIT_PROBLEM
    print(json.dumps({"log_key": vkey}) if as_json else vkey)
    return EXIT_OK


def log_checkpoint(
    stream: _Stream,
    store: _Store = None,
    home: _Home = None,
    out: Annotated[
        str | None, typer.Option(metavar="FILE", help="also write the note to this file")
    ] = None,
    as_json: _Json = False,
) -> int:
    """Sign a checkpoint of a stream now (beside a running appliance too: it adds no entry)."""
    from record.log import sign_stored, signing_key_file

    source = _store_of(store, home)
    opened = open_store(source)  # first: a store that cannot be written makes no key
    try:
        # A database's signing key is not beside it: it is the appliance's, in its home.
        given = home_root(home) / SIGNING_KEY_FILE if is_url(source) else None
        signer = Signer.load_or_create(signing_key_file(source, given), LOG_KEY_NAME)
        cp = sign_stored(opened, signer, stream)
    finally:
        opened.close()
    if out:
        Path(out).write_bytes(cp.note)
    if as_json:
        print(json.dumps({"stream": stream, "size": cp.size, "note": cp.note.decode()}))
    else:
        sys.stdout.write(cp.note.decode())
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Add ``keys`` and ``log`` (as typer sub-apps) to ``app``."""
    keys = typer.Typer(name="keys", help="Recipient keys.", no_args_is_help=True)
    keys.command("new")(_command(keys_new))
    app.add_typer(keys)

    log = typer.Typer(
        name="log", help="The record: verify, export, show, sign.", no_args_is_help=True
    )
    log.command("verify")(_command(log_verify))
    log.command("export")(_command(log_export))
    log.command("show")(_command(log_show))
    log.command("key")(_command(log_key))
    log.command("checkpoint")(_command(log_checkpoint))
    app.add_typer(log)
