"""The operator's config disk: what one operator's appliances need that the release cannot
know, read at boot from a small disk the host attaches, outside the measurement.

Today that is one thing: the record store, a PostgreSQL database several appliances share
(``docs/deploy.md``, "Several appliances, one PostgreSQL store"). Without a config disk the
record stays ``record.db`` on the state disk.

**Why not the kernel command line.** It is measured: an operator's URL there would change
the launch digest, and no appliance would match the published measurement. Nothing here
needs measuring either. The database is untrusted storage: every body is sealed to the
user's keys, every checkpoint is signed by a key born in the guest, and the audit catches a
store that drops, changes or reorders what it was given. A host that lies on this disk can
only deny service, which it can do anyway. The password is the operator's own, for the
operator's own database.

**Finding it.** The disk is the virtio disk whose serial is ``affidavit-config``
(``/sys/block/*/serial``; QEMU: ``-device virtio-blk-pci,serial=affidavit-config``). Its
bytes are one JSON document (``affidavit image config-disk`` writes it), padded with
newlines or NULs; at most :data:`MAX_CONFIG_BYTES`.

**Hostile until parsed.** The disk is the host's, so every byte is checked before use: the
document against :class:`OperatorConfig` (no unknown member), the URL against the libpq
keywords in :data:`STORE_KEYWORDS` (no ``passfile``, ``service``, ``sslkey`` or ``options``:
those would read the guest's files or loosen the store's durability), a host that is a
name or an address (never a Unix socket path), and the CA bundle as PEM certificates. A
disk that is there but wrong stops the boot (``Refused``): a typo must not split one
session's record across two stores.
"""

from __future__ import annotations

import json
import re
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "CONFIG_FORMAT",
    "MAX_CONFIG_BYTES",
    "SERIAL",
    "STORE_KEYWORDS",
    "ConfigError",
    "OperatorConfig",
    "check_store_url",
    "config_disk_bytes",
    "find_config_disk",
    "parse_config",
    "read_config",
    "store_conninfo",
]

SERIAL = "affidavit-config"
CONFIG_FORMAT = "affidavit-config/1"
MAX_CONFIG_BYTES = 64 << 10
BLOCK = 4096  # the disk's size is a multiple of this: QEMU serves whole sectors

#: The libpq keywords a config disk's store URL may use; any other is refused.
STORE_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "sslmode",
        "sslrootcert",  # only ``system``: a CA bundle comes as ``store_ca``
        "connect_timeout",
        "application_name",
        "target_session_attrs",
    }
)
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


class ConfigError(ValueError):
    """The config disk is there but not usable; the message says what to change."""


class OperatorConfig(BaseModel):
    """The config disk's document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["affidavit-config/1"]
    #: The record store: a ``postgresql://`` URL (password included, if the server asks).
    store: str | None = Field(default=None, max_length=4096)
    #: PEM certificates the store's server certificate must chain to (``sslmode=verify-*``).
    store_ca: str | None = Field(default=None, max_length=32 << 10)


def check_store_url(url: str, *, ca_given: bool = False, loopback: bool = False) -> dict[str, str]:
    """The URL's libpq parameters, once every one is allowed; ``ConfigError`` naming the
    first that is not. The URL itself is never quoted back: it may hold a password.
    ``ca_given``: ``sslrootcert`` may name the file the guest wrote ``store_ca`` to.
    ``loopback``: a server on this machine is allowed (tests only: in the guest, a loopback
    listener could only be another uid's)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("store: not a postgresql:// URL")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ConfigError("store: the URL holds a control character")
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except (psycopg.ProgrammingError, UnicodeDecodeError):
        raise ConfigError("store: a postgresql:// URL libpq cannot read") from None
    refused = sorted(set(params) - STORE_KEYWORDS)
    if refused:
        raise ConfigError(
            f"store: the URL sets {', '.join(refused)}; a config disk may set only "
            + ", ".join(sorted(STORE_KEYWORDS))
        )
    hosts = params["host"].split(",") if "host" in params else []
    addrs = params["hostaddr"].split(",") if "hostaddr" in params else []
    if not hosts and not addrs:
        raise ConfigError("store: the URL names no host (the guest has no local server)")
    for host in hosts:
        local = _local_name(host) or _local(host)
        if not _HOST.fullmatch(host) or (_NUMERIC.fullmatch(host) and not _address(host)):
            raise ConfigError(
                f"store: host {host!r} is not a host name or a canonical IP address"
                " (a password holding / or @ must be percent-encoded)"
            )
        if local and not loopback:
            raise ConfigError(
                f"store: host {host!r} is not the name or address of another machine"
                " (a password holding / or @ must be percent-encoded)"
            )
    for addr in addrs:
        if not _address(addr) or (_local(addr) and not loopback):
            raise ConfigError(f"store: hostaddr {addr!r} is not another machine's IP address")
    if hosts and addrs and len(hosts) != len(addrs):
        raise ConfigError("store: host and hostaddr list different numbers of servers")
    ports = params["port"].split(",") if "port" in params else []
    bad_port = any(p and (not p.isdigit() or not 0 < int(p) < 65536) for p in ports)
    if bad_port or len(ports) not in (
        0,
        1,
        max(len(hosts), len(addrs)),
    ):
        raise ConfigError(
            "store: the port is not a number from 1 to 65535 (or empty) for each host"
            " (a password holding / or @ must be percent-encoded)"
        )
    dbname = params.get("dbname")
    if not dbname:
        raise ConfigError("store: the URL names no database")
    if "@" in dbname or "/" in dbname:
        raise ConfigError(
            "store: the database name holds @ or / (a password holding / or @ must be"
            " percent-encoded)"
        )
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        raise ConfigError(f"store: sslmode={sslmode} is not one of {'|'.join(_SSLMODES)}")
    root = params.get("sslrootcert")
    if root is not None and root != "system" and not ca_given:
        raise ConfigError("store: sslrootcert may only be `system`; give a CA bundle as store_ca")
    if root == "system" and sslmode not in (None, "verify-full"):
        raise ConfigError("store: sslrootcert=system needs sslmode=verify-full (libpq's rule)")
    timeout = params.get("connect_timeout")
    if timeout is not None and (not timeout.isdigit() or int(timeout) > 3600):
        raise ConfigError("store: connect_timeout is not a whole number of seconds up to 3600")
    attrs = params.get("target_session_attrs")
    if attrs is not None and attrs not in _SESSION_ATTRS:
        raise ConfigError(
            f"store: target_session_attrs={attrs} is not one of {'|'.join(_SESSION_ATTRS)}"
        )
    if len(params.get("application_name", "")) > 64:
        raise ConfigError("store: application_name is longer than 64 characters")
    return params


_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:-]{0,252}[A-Za-z0-9.])?")
#: What the C library would read as an IPv4 address in another spelling (``127.1``,
#: ``2130706433``, ``0x7f000001``): only the canonical spelling is checked as an address.
_NUMERIC = re.compile(r"[0-9.]+|0[xX][0-9A-Fa-f.xX]*")
_LOCAL_NAMES = ("localhost", "ip6-localhost", "ip6-loopback")
_SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")


def _address(text: str) -> IPv4Address | IPv6Address | None:
    try:
        return ip_address(text)
    except ValueError:
        return None


def _local_name(host: str) -> bool:
    """A name that means this machine wherever it is looked up (RFC 6761's ``localhost``)."""
    name = host.lower().rstrip(".")
    return name in _LOCAL_NAMES or name.endswith(".localhost")


def _local(host: str) -> bool:
    """A loopback or unspecified address: in the guest, only other uids' listeners."""
    found = _address(host)
    return found is not None and (found.is_loopback or found.is_unspecified)


def _check_ca(pem: str) -> None:
    from cryptography.x509 import load_pem_x509_certificates

    try:
        load_pem_x509_certificates(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise ConfigError("store_ca: not PEM certificates") from None


def read_config(device: Path, *, loopback: bool = False) -> OperatorConfig:
    """The document on ``device``, checked; ``ConfigError`` on anything else."""
    try:
        with open(device, "rb") as disk:
            raw = disk.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {device}: {exc.strerror or exc}") from None
    try:
        return parse_config(raw, loopback=loopback)
    except ConfigError as exc:
        raise ConfigError(f"{device}: {exc}") from None


def parse_config(raw: bytes, *, loopback: bool = False) -> OperatorConfig:
    """A config disk's bytes, checked as the guest checks them."""
    text = raw.rstrip(b"\0 \t\r\n")
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"more than {MAX_CONFIG_BYTES} bytes of config")
    if not text:
        raise ConfigError("the config disk is empty")
    from record.limits import JsonRefused, load_json

    try:
        doc = load_json(text, unique_keys=True)
    except (JsonRefused, ValueError) as exc:
        raise ConfigError(f"not one JSON document: {exc}") from None
    try:
        config = OperatorConfig.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise ConfigError(f"{where}: {first['msg']}") from None
    if config.store is not None:
        params = check_store_url(config.store, loopback=loopback)
        if config.store_ca is not None and params.get("sslrootcert"):
            raise ConfigError("store: give either sslrootcert=system or store_ca, not both")
    if config.store_ca is not None:
        if config.store is None:
            raise ConfigError("store_ca: given without a store")
        _check_ca(config.store_ca)
        store_conninfo(config, Path("/run/affidavit/store-ca.pem"), loopback=loopback)  # as booted
    return config


def store_conninfo(config: OperatorConfig, ca_file: Path | None, *, loopback: bool = False) -> str:
    """The URL the proxy opens: the disk's, with ``sslrootcert`` pointing at ``ca_file``
    (where the guest wrote ``store_ca``) when there is one. Still a ``postgresql://`` URL:
    that is how every store location names a database (``record.backends``). With a CA it
    is rebuilt from what libpq read, every parameter in the query (``postgresql://?…``), so
    no quirk of the operator's spelling (a ``#`` or ``?`` in a password, a trailing ``&``)
    can move one."""
    from urllib.parse import quote, urlencode

    if config.store is None:
        raise ConfigError("the config disk names no store")
    if ca_file is None:
        return config.store
    params = check_store_url(config.store, loopback=loopback)
    params["sslrootcert"] = str(ca_file)
    url = "postgresql://?" + urlencode(sorted(params.items()), quote_via=quote)
    if check_store_url(url, ca_given=True, loopback=loopback) != params:
        raise ConfigError("store: the URL does not read back the same with a CA file")
    return url


def find_config_disk(block_dir: Path, dev_dir: Path) -> Path | None:
    """The device whose serial is :data:`SERIAL` (None: the host attached no config disk)."""
    try:
        names = sorted(p.name for p in block_dir.iterdir())
    except OSError:
        return None
    for name in names:
        try:
            serial = (block_dir / name / "serial").read_text(errors="replace").strip()
        except OSError:
            continue
        if serial == SERIAL:
            return dev_dir / name
    return None


def config_disk_bytes(config: OperatorConfig) -> bytes:
    """A config disk's whole content: the document, padded with newlines to whole blocks."""
    body = json.dumps(config.model_dump(exclude_none=True), indent=2).encode() + b"\n"
    if len(body) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config is {len(body)} bytes (at most {MAX_CONFIG_BYTES})")
    return body + b"\n" * (-len(body) % BLOCK)
