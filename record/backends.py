"""Where a record lives, and opening it: a SQLite file's path, a PostgreSQL URL, or a
location of a scheme another package registered.

Every reader and writer of a store names it by this one value (``--store``, the home's
``appliance.json`` and ``store`` file, ``Log.open``), so a fleet's PostgreSQL store is read
by the same commands as one appliance's file. The PostgreSQL backend comes with the
``postgres`` extra and is imported only when a URL is opened.

A package above the record adds a way to reach a store with :func:`register_scheme`: the
proxy's ``control:/path/to/control.sock`` (``egress_proxy.control_store``, registered when it
is imported) reads the store through the proxy's control plane, for a reader with no route
to the database. Such a location is text, like a URL, never a path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
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
    "register_scheme",
    "store_exists",
    "store_label",
    "store_name",
    "unreachable",
]

#: A SQLite file (a path), a PostgreSQL database (a ``postgresql://`` URL), or a location of
#: a registered scheme (text).
StoreLocation = Path | str

_SCHEMES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class _Scheme:
    opener: Callable[[str, bool], LogStore]  # (location, readonly) -> the store
    describe: Callable[[str], str]  # the location as messages name it (no secret in it)


_REGISTERED: dict[str, _Scheme] = {}
_PREFIX = re.compile(r"[a-z][a-z0-9+.-]*:(//)?")  # a URI scheme and its colon (and ``//``)

#: Schemes whose reader lives above the record and registers itself when imported, with the
#: module that does: named here only so that a process without it says so, instead of
#: looking for a file by that name.
_REGISTERED_ELSEWHERE = {"control:": "egress_proxy.control_store"}


def register_scheme(
    prefix: str,
    opener: Callable[[str, bool], LogStore],
    describe: Callable[[str], str] = str,
) -> None:
    """Read locations that start with ``prefix`` (``control:``) with ``opener(location,
    readonly)``, and name them in messages by ``describe(location)``. Registering a prefix
    again replaces it (a module imported twice)."""
    if not _PREFIX.fullmatch(prefix) or prefix in _SCHEMES:
        raise ValueError(f"{prefix!r} is not a scheme prefix a backend may register")
    _REGISTERED[prefix] = _Scheme(opener, describe)


def _prefix(location: StoreLocation) -> str | None:
    """The registered (or known, unregistered) scheme prefix ``location`` starts with."""
    if not isinstance(location, str):
        return None
    for prefix in (*_REGISTERED, *_REGISTERED_ELSEWHERE):
        if location.startswith(prefix):
            return prefix
    return None


def is_url(location: StoreLocation) -> bool:
    """Whether ``location`` names a store by URL (a PostgreSQL database, or a scheme such as
    ``control:``) rather than a SQLite file."""
    return isinstance(location, str) and (
        location.startswith(_SCHEMES) or _prefix(location) is not None
    )


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
    password, a registered scheme's location as it says."""
    prefix = _prefix(location)
    if prefix is not None:
        scheme = _REGISTERED.get(prefix)
        return str(location) if scheme is None else scheme.describe(str(location))
    if is_url(location):
        from record.postgres_store import describe

        return describe(str(location))
    return str(location)


def store_label(location: StoreLocation) -> str:
    """The short name an audit's rows carry: a file's name, a database's URL."""
    return store_name(location) if is_url(location) else Path(location).name


def store_exists(location: StoreLocation) -> bool:
    """Whether a store file is there; a URL (a database, a ``control:`` socket) is taken as
    there (opening it says)."""
    return is_url(location) or Path(location).is_file()


def open_store(location: StoreLocation, *, readonly: bool = False) -> LogStore:
    """The store at ``location``; ``readonly`` for audits and readers.

    A database that cannot be reached, or the ``postgres`` extra not installed, is a store
    that is missing (``StoreMissing``, exit 3), said in one line; so is a registered scheme
    (``control:``) whose module this process has not imported.
    """
    prefix = _prefix(location)
    if prefix is not None:
        scheme = _REGISTERED.get(prefix)
        if scheme is None:
            raise StoreMissing(
                f"a {prefix} store is read by {_REGISTERED_ELSEWHERE[prefix]}, which this "
                f"process has not loaded (import it first; the affidavit command does)"
            )
        return scheme.opener(str(location), readonly)
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
