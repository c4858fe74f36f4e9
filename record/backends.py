"""Where a record lives, and opening it: a SQLite file's path, or a PostgreSQL URL.

Every reader and writer of a store names it by this one value (``--store``, the home's
``appliance.json`` and ``store`` file, ``Log.open``), so a fleet's PostgreSQL store is read
by the same commands as one appliance's file. The PostgreSQL backend comes with the
``postgres`` extra and is imported only when a URL is opened.
"""

from __future__ import annotations

from pathlib import Path

from record.errors import BadStoreLocation, StoreMissing
from record.sqlite_store import SQLiteStore
from record.store import LogStore

__all__ = [
    "StoreLocation",
    "is_url",
    "location",
    "open_store",
    "reason",
    "store_exists",
    "store_label",
    "store_name",
    "unreachable",
]

#: A SQLite file (a path) or a PostgreSQL database (a ``postgresql://`` URL).
StoreLocation = Path | str

_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: StoreLocation) -> bool:
    """Whether ``location`` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(_SCHEMES)


def location(text: str) -> StoreLocation:
    """A store as given on a command line or in a file: a URL stays text, the rest is a path
    (a ``Path`` would fold the URL's ``//``)."""
    return text if is_url(text) else Path(text)


def reason(exc: BaseException) -> str:
    """A database driver's error in one line: its reason, not the hints that follow it."""
    said = str(exc).strip().splitlines()
    return said[0] if said else type(exc).__name__


def unreachable(location: StoreLocation, exc: BaseException) -> StoreMissing:
    """A database that does not answer: a store that is missing (exit 3)."""
    return StoreMissing(f"cannot reach store {store_name(location)}: {reason(exc)}")


def store_name(location: StoreLocation) -> str:
    """How messages name the store: a file by its path, a database by its URL without a
    password."""
    if is_url(location):
        from record.postgres_store import describe

        return describe(str(location))
    return str(location)


def store_label(location: StoreLocation) -> str:
    """The short name an audit's rows carry: a file's name, a database's URL."""
    return store_name(location) if is_url(location) else Path(location).name


def store_exists(location: StoreLocation) -> bool:
    """Whether a store file is there; a database URL is taken as there (opening it says)."""
    return is_url(location) or Path(location).is_file()


def open_store(location: StoreLocation, *, readonly: bool = False) -> LogStore:
    """The store at ``location``; ``readonly`` for audits and readers.

    A database that cannot be reached, or the ``postgres`` extra not installed, is a store
    that is missing (``StoreMissing``, exit 3), said in one line.
    """
    if not is_url(location):
        return SQLiteStore(location, readonly=readonly)
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        from record.postgres_store import PostgresStore
    except ImportError:
        raise StoreMissing(
            "a PostgreSQL store needs the postgres extra: pip install 'affidavit[postgres]'"
        ) from None
    try:
        conninfo_to_dict(str(location))
    except psycopg.ProgrammingError as exc:  # not echoed: the URL may hold a password
        why = reason(exc).replace(str(location), "…")  # libpq quotes the URL back
        raise BadStoreLocation(f"the store is not a PostgreSQL URL libpq reads: {why}") from None
    try:
        return PostgresStore(str(location), readonly=readonly)
    except psycopg.OperationalError as exc:
        raise unreachable(location, exc) from None
