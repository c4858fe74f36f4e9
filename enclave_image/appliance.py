"""What the full image runs as PID 1: ``python3.11 -m enclave_image.appliance`` (from ``/init``).

In order, one console line per step (``docs/image.md``, "The full profile's guest"):

1. **Network rules**: ``egress_proxy.netrules.render`` with ``proxy_uid``: only the proxy's uid
   may open a connection that leaves the machine, or reach the engine over loopback (root
   too, for the health checks); every other uid, the harness's among them, reaches only the
   proxy's port and is refused elsewhere. ``affidavit.probe=HOST:PORT`` proves the first.
2. **State disk**: the key from ``affidavit.keysource`` (``snp``: derived by the AMD-SP;
   ``test-insecure``: a fixed key, loudly), LUKS2 formatted at first boot, mounted.
3. **Keys and store**: the sealing key and the log signing key, born here at first boot and
   kept on the state disk; ``report_data`` binds their public halves; an SNP report carries
   it. The record is ``record.db`` on the state disk, or the PostgreSQL database the
   operator's config disk names (``appliance_config``: unmeasured, checked as hostile input),
   which only the proxy reaches; the harness reads it through the proxy's control socket.
4. **Proxy and evidence**: the proxy first, under its own uid; the boot evidence (an SNP
   report carrying ``report_data``) kept in the record through it, with its chain (the
   host's certificate table, or AMD's KDS fetched through the proxy).
5. **Self-check**: the appliance checks its own evidence (``attestation.self_check``:
   signature and chain, TCB, policy bits, the binding of its keys; never its own launch
   digest, which only outsiders can compare with the published values) and writes the
   outcome where the proxy reads it (``egress_proxy.tee_status``). Failed (no TEE, the test
   key source, a bad chain …): the proxy refuses pinned sessions, unless
   ``affidavit.unattested=allow`` is on the (measured) command line, said loudly.
6. **Services**: the engine (``AFFIDAVIT_TEE_TYPE``: what the self-check showed, else
   ``none``, in every reproducibility block) and the harness panel, each under its own uid,
   supervised; the engine serves what the model disk's ``model.json`` names (the release
   model, or a test build's tiny one, said loudly), and answers only the token born at this
   boot, which only the engine's and the proxy's uids can read. The external TLS port
   (``harness.front``: the attested key kept on the state disk, ``/attestation`` answered
   with fresh evidence, the rest relayed to the proxy).
7. **Timer**: ``affidavit diverge`` as the harness every 7 days.
8. **Health**: one ``affidavit-appliance ready …`` line once all three answer; an optional
   self-test turn (pinned: refused, in one line, by an appliance whose self-check failed);
   then supervision until SIGTERM/SIGUSR2/the power button, a clean stop (services,
   unmount, LUKS close) and power-off.

Every path and port is a field of ``GuestLayout`` with the guest's value as default, so the
tests run each piece on a host.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING

from enclave_image.appliance_disk import DiskError, StateDisk
from enclave_image.appliance_supervise import Service, Supervisor, WeeklyTimer
from enclave_image.appliance_tee import KEY_SOURCES, KeySource, TeeError, disk_key
from enclave_image.appliance_tsm import TSM_REPORTS, Collected, collect_evidence

if TYPE_CHECKING:
    from attestation.channel import EvidenceSource
    from attestation.self_check import SelfCheck
    from attestation.snp_report import Product, SnpReport
    from egress_proxy.control import ControlClient
    from egress_proxy.netrules import HarnessRules
    from harness.front import Front

__all__ = [
    "BootOptions",
    "GuestLayout",
    "Keys",
    "ModelDisk",
    "Refused",
    "StartError",
    "cpu_product",
    "guest_rules",
    "main",
    "network_rules",
    "parse_cmdline",
    "prepare_keys",
    "probe_connect",
    "read_model_disk",
    "ready_line",
    "run_appliance",
    "services",
    "write_engine_token",
]

Say = Callable[[str], None]


class Refused(Exception):
    """The appliance will not start as configured (the message says what to change)."""


class StartError(Exception):
    """A step of bringing the appliance up failed."""


@dataclass(frozen=True)
class ModelDisk:
    """What the model disk serves, as its ``model.json`` (written by the build) says."""

    name: str  # the model id the engine serves it under
    path: Path  # what ``engine serve --model`` loads: a ``.gguf`` file or a model folder
    test_model: str | None  # a test build's model (``tiny``): never a release's


def read_model_disk(model_dir: Path) -> ModelDisk:
    """The model disk's ``model.json``: the guest finds its model from the disk's content,
    so the build decides what ships and the guest has nothing to hard-code."""
    where = model_dir / "model.json"
    try:
        doc = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StartError(f"model disk: cannot read {where}: {exc}") from None
    if not isinstance(doc, dict):
        raise StartError(f"model disk: {where} is not a JSON object")
    name, rel, test = doc.get("name"), doc.get("path"), doc.get("test_model")
    if not isinstance(name, str) or not name or not isinstance(rel, str) or not rel:
        raise StartError(f"model disk: {where} names no model (name and path)")
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not (model_dir / rel).exists():
        raise StartError(f"model disk: {where}: path {rel!r} is not on the disk")
    if test is not None and not isinstance(test, str):
        raise StartError(f"model disk: {where}: test_model {test!r} is not a name")
    return ModelDisk(name, model_dir / rel, test)


@dataclass(frozen=True)
class GuestLayout:
    """Where everything is. The defaults are the guest's; tests override them."""

    cmdline: Path = Path("/proc/cmdline")
    state_mount: Path = Path("/var/lib/affidavit")
    run_dir: Path = Path("/run/affidavit")
    sev_guest: Path = Path("/dev/sev-guest")
    tsm_reports: Path = TSM_REPORTS
    model_dir: Path = Path("/opt/model")  # the model disk, mounted by /init
    input_devices: Path = Path("/proc/bus/input/devices")
    cpuinfo: Path = Path("/proc/cpuinfo")  # the product, for a report that names none
    pci_devices: Path = Path("/sys/bus/pci/devices")  # a GPU passed through, said at boot
    block_dir: Path = Path("/sys/block")  # where the operator's config disk is looked for
    dev_dir: Path = Path("/dev")
    #: Tests only: the config disk may name a database on loopback (the tests' private
    #: PostgreSQL). In the guest a loopback listener could only be another uid's.
    store_on_loopback: bool = False
    python: str = "python3.11"
    nft: str = "/usr/sbin/nft"
    cryptsetup: str = "/sbin/cryptsetup"
    mke2fs: str = "/sbin/mke2fs"
    engine_port: int = 8000
    proxy_port: int = 8700
    harness_port: int = 8600
    tls_port: int = 8443  # the external TLS port: the attested front (``harness.front``)
    tls_host: str = "0.0.0.0"  # where the front listens (tests: loopback)
    kds_url: str = "https://kdsintf.amd.com"  # where the proxy fetches a missing SNP chain
    proxy_uid: int = 1001
    engine_uid: int = 1002
    harness_uid: int = 1003
    switch_users: bool = True  # False: every service runs as this process's uid (tests)
    engine_start_timeout: float = 1800.0  # torch under TCG is slow
    start_timeout: float = 300.0
    diverge_period: timedelta = timedelta(days=7)
    diverge_timeout: float = 6 * 3600.0
    selftest_timeout: float = 1800.0
    #: The ARKs the self-check trusts in place of AMD's pinned roots: None in the guest
    #: (nothing on the kernel command line sets it); tests give the TEE double's.
    self_check_roots: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to every service's environment

    @cached_property
    def model(self) -> ModelDisk:
        """The model disk's ``model.json``, read once (``StartError`` if it is unusable)."""
        return read_model_disk(self.model_dir)

    @property
    def record_dir(self) -> Path:
        return self.state_mount / "record"

    @property
    def home_dir(self) -> Path:
        return self.state_mount / "home"

    @property
    def evidence_dir(self) -> Path:
        return self.state_mount / "evidence"

    @property
    def timer_file(self) -> Path:
        return self.state_mount / "diverge-timer.json"

    @property
    def control_socket(self) -> Path:
        return self.run_dir / "proxy" / "control.sock"

    @property
    def tee_status_file(self) -> Path:
        """The self-check's outcome (``egress_proxy.tee_status``): root's, 0644, in the run
        folder (root's, fresh at each boot), so the proxy's uid reads it and cannot change it."""
        return self.run_dir / "tee-status.json"

    @property
    def tls_dir(self) -> Path:
        """The external TLS key and certificate: root's only (0700), on the state disk."""
        return self.state_mount / "tls"

    @property
    def store_file(self) -> Path:
        """The shared store's connection string (password and all), the proxy's only (0600):
        never on a command line, which every uid can read in ``/proc``."""
        return self.run_dir / "home" / "proxy" / "store.conninfo"

    @property
    def store_ca_file(self) -> Path:
        """The config disk's ``store_ca``, as the proxy's libpq reads it."""
        return self.run_dir / "home" / "proxy" / "store-ca.pem"

    def token_file(self, service: str) -> Path:
        """``service``'s copy (``engine`` or ``proxy``) of the engine's token, in its own
        0700 folder."""
        return self.run_dir / "home" / service / "engine.token"

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


# -- the kernel command line -------------------------------------------------------------------


@dataclass(frozen=True)
class BootOptions:
    state: Path
    keysource: KeySource
    probe: tuple[str, int] | None = None
    selftest: bool = False
    allow_unattested: bool = False  # affidavit.unattested=allow: pins even when not attested


def parse_cmdline(text: str) -> BootOptions:
    """The ``affidavit.*`` words of ``/proc/cmdline``; ``Refused`` when one is missing or bad.

    No default key source on purpose: a typo must stop the boot, not pick the test key."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    given: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if name.startswith("affidavit.") and sep:
            given[name.removeprefix("affidavit.")] = value
    state = given.get("state")
    if not state:
        raise Refused("no affidavit.state=DEVICE on the kernel command line")
    source = given.get("keysource")
    if source is None:
        raise Refused(
            f"no affidavit.keysource= on the kernel command line ({'|'.join(KEY_SOURCES)})"
        )
    if source not in KEY_SOURCES:
        raise Refused(f"affidavit.keysource={source}: not one of {'|'.join(KEY_SOURCES)}")
    probe = None
    if "probe" in given:
        host, sep, port = given["probe"].rpartition(":")
        try:
            IPv4Address(host)
            probe = (host, int(port))
        except ValueError:
            raise Refused(f"affidavit.probe={given['probe']}: not IPV4:PORT") from None
        if not sep or not 0 < probe[1] < 65536:
            raise Refused(f"affidavit.probe={given['probe']}: not IPV4:PORT")
    selftest = given.get("selftest")
    if selftest not in (None, "turn"):
        raise Refused(f"affidavit.selftest={selftest}: the only self-test is `turn`")
    unattested = given.get("unattested")
    if unattested not in (None, "allow"):
        raise Refused(f"affidavit.unattested={unattested}: the only value is `allow`")
    return BootOptions(Path(state), source, probe, selftest == "turn", unattested == "allow")


# -- 1. network rules --------------------------------------------------------------------------

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError as exc:
    print(exc.strerror or type(exc).__name__); sys.exit(1)
"""


def probe_connect(
    host: str, port: int, uid: int | None, *, python: str = sys.executable, timeout: float = 5.0
) -> str | None:
    """Try a TCP connect as ``uid`` (a child process); None when it connected, else why not."""
    done = subprocess.run(
        [python, "-c", _CONNECT, host, str(port), str(timeout)],
        user=uid,
        extra_groups=[] if uid is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=False,
    )
    if done.returncode == 0:
        return None
    if done.stdout.strip():
        return done.stdout.strip()
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def guest_rules(layout: GuestLayout) -> HarnessRules:
    """The guest's ruleset: only the proxy's uid leaves the machine or passes loopback's proxy
    port, and on loopback it reaches only the engine's; root reaches every loopback port (PID
    1's health checks); the others are refused there."""
    from egress_proxy.netrules import HarnessRules

    return HarnessRules(
        proxy_address=IPv4Address("127.0.0.1"),
        proxy_ports=(layout.proxy_port,),
        api_port=layout.harness_port,
        proxy_uid=layout.proxy_uid,
        loopback_uids=(0,),
        proxy_loopback_ports=(layout.engine_port,),
        tls_port=layout.tls_port,
    )


def network_rules(layout: GuestLayout, probe: tuple[str, int] | None, say: Say) -> None:
    """Load the ruleset (only the proxy's uid may leave the machine); prove it on ``probe``."""
    from egress_proxy.netrules import TABLE, render

    done = subprocess.run(
        [layout.nft, "-f", "-"],
        input=render(guest_rules(layout)),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise StartError(f"nft -f - exited {done.returncode}: {done.stderr.strip()}")
    say(f"netrules: loaded table inet {TABLE}: only uid {layout.proxy_uid} may leave the machine")
    say(
        f"netrules: loopback: uid 0 reaches every port, uid {layout.proxy_uid} only"
        f" {layout.engine_port} (the engine), any other uid only {layout.proxy_port} (the rest"
        " refused)"
    )
    if probe is None:
        return
    host, port = probe
    target = f"{host}:{port}"
    blocked = probe_connect(host, port, layout.harness_uid, python=layout.python)
    if blocked is None:
        raise StartError(
            f"netrules: uid {layout.harness_uid} -> {target} CONNECTED: the rules leak"
        )
    say(f"netrules: uid {layout.harness_uid} -> {target} blocked ({blocked})")
    refused = probe_connect(host, port, layout.proxy_uid, python=layout.python)
    if refused is not None:
        raise StartError(f"netrules: uid {layout.proxy_uid} -> {target} failed: {refused}")
    say(f"netrules: uid {layout.proxy_uid} -> {target} connected")


# -- 3. keys -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Keys:
    log_key: str  # the C2SP verifier key of the checkpoints
    sealing: str  # the appliance's X25519 recipient key, base64
    sealing_raw: bytes
    created: bool

    def report_data(self, nonce: bytes = b"") -> bytes:
        from attestation.binding import report_data

        return report_data(self.log_key, self.sealing_raw, nonce)


def _own(path: Path, uid: int, gid: int, mode: int, layout: GuestLayout) -> None:
    if layout.switch_users:
        os.chown(path, uid, gid)
    os.chmod(path, mode)


def prepare_dirs(layout: GuestLayout) -> None:
    """Folders and owners: the proxy owns the record (the harness's group may read it), the
    harness owns its Home, root keeps the evidence and the timer."""
    p, h, e = layout.proxy_uid, layout.harness_uid, layout.engine_uid
    layout.state_mount.chmod(0o755)
    for path, uid, gid, mode in (
        (layout.record_dir, p, h, 0o2750),
        (layout.home_dir, h, h, 0o700),
        (layout.evidence_dir, 0, 0, 0o700),
        (layout.tls_dir, 0, 0, 0o700),
        (layout.run_dir, 0, 0, 0o755),
        (layout.control_socket.parent, p, h, 0o2750),
        (layout.run_dir / "home", 0, 0, 0o755),
        (layout.run_dir / "home" / "engine", e, e, 0o700),
        (layout.run_dir / "home" / "proxy", p, p, 0o700),
        (layout.run_dir / "home" / "harness", h, h, 0o700),
    ):
        path.mkdir(parents=True, exist_ok=True)
        _own(path, uid, gid, mode, layout)


def prepare_keys(layout: GuestLayout) -> Keys:
    """The sealing key and the log signing key: made here the first time, kept after. The
    harness's own key (``user.key``, a recipient of its sessions) is made here too, so the
    weekly divergence run finds it before anyone opened a session."""
    from record.checkpoint import Signer
    from record.log import LOG_KEY_NAME
    from record.seal import KeyPair

    key_file = layout.record_dir / "appliance.key"
    signing = layout.record_dir / "record.db.signing-key"
    user_key = layout.home_dir / "user.key"
    created = not key_file.exists()
    if created:
        KeyPair.generate().write(key_file)
    signer = Signer.load_or_create(signing, LOG_KEY_NAME)
    if not user_key.exists():
        KeyPair.generate().write(user_key)
    for path, uid in (
        (key_file, layout.proxy_uid),
        (signing, layout.proxy_uid),
        (user_key, layout.harness_uid),
    ):
        _own(path, uid, uid, 0o600, layout)
    recipient = KeyPair.read(key_file).recipient
    raw = recipient.public.public_bytes_raw()
    return Keys(signer.vkey(), recipient.text(), raw, created)


def write_engine_token(layout: GuestLayout) -> str:
    """A new engine token for this boot, one copy for the engine and one for the proxy, each
    0600 in its owner's 0700 folder: no other uid (the harness's) can read it."""
    from inference.engine_token import new_token, write_token_file

    token = new_token()
    for service, uid in (("engine", layout.engine_uid), ("proxy", layout.proxy_uid)):
        path = write_token_file(layout.token_file(service), token)
        _own(path, uid, uid, 0o600, layout)
    return token


def prepare_store(layout: GuestLayout, say: Say) -> bool:
    """The record store: ``record.db`` on the state disk, or the PostgreSQL database the
    operator's config disk names (``appliance_config``). Returns whether it is the database;
    then its connection string is in ``store_file``, for the proxy alone.

    ``Refused`` when a config disk is there but unusable: falling back to ``record.db`` would
    split the operator's record across two stores."""
    from enclave_image.appliance_config import (
        ConfigError,
        find_config_disk,
        read_config,
        store_conninfo,
    )

    for stale in (layout.store_file, layout.store_ca_file):
        stale.unlink(missing_ok=True)  # never an earlier boot's word
    device = find_config_disk(layout.block_dir, layout.dev_dir)
    if device is None:
        say(f"store: {layout.record_dir / 'record.db'} on the state disk (no config disk)")
        return False
    try:
        config = read_config(device, loopback=layout.store_on_loopback)
        if config.store is None:
            say(f"store: {layout.record_dir / 'record.db'} on the state disk ({device} names none)")
            return False
        ca = None
        if config.store_ca is not None:
            ca = layout.store_ca_file
            _write_private(ca, config.store_ca.encode("ascii"), layout.proxy_uid, layout)
        conninfo = store_conninfo(config, ca, loopback=layout.store_on_loopback)
    except ConfigError as exc:
        raise Refused(f"config disk: {exc}") from None
    _write_private(layout.store_file, conninfo.encode("utf-8"), layout.proxy_uid, layout)
    from record.postgres_store import describe  # psycopg: only an appliance with a database

    say(
        f"store: {describe(conninfo)} (from the config disk {device}); the harness reads it"
        " through the proxy's control socket"
    )
    return True


def _write_private(path: Path, data: bytes, uid: int, layout: GuestLayout) -> None:
    """``data`` in a new file only ``uid`` may read, made 0600 before a byte is written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    _own(path, uid, uid, 0o600, layout)


def write_appliance_json(
    layout: GuestLayout, shared_store: bool = False, log_key: str | None = None
) -> None:
    """``appliance.json`` in the harness's Home: where the proxy, its control socket and the
    record are (the harness commands and the panel read it). A shared store is named by the
    control socket (``control:``): the harness's uid may not reach the database itself, so it
    reads the store through the proxy. ``log_key``: the appliance's, which the harness's
    readers hold that store's streams to (others' share the database)."""
    from harness.state import Appliance, Home

    home = Home(layout.home_dir)
    home.write_appliance(
        Appliance(
            proxy_url=layout.url(layout.proxy_port),
            control_socket=str(layout.control_socket),
            store=(
                f"control:{layout.control_socket}"
                if shared_store
                else str(layout.record_dir / "record.db")
            ),
            model=layout.model.name,
            api="openai",
            engine_url=layout.url(layout.engine_port),
            log_key=log_key,
        )
    )
    _own(home.appliance_file, layout.harness_uid, layout.harness_uid, 0o644, layout)


# -- 4. services ------------------------------------------------------------------------------


def _service(
    layout: GuestLayout,
    name: str,
    uid: int,
    gid: int,
    argv: list[str],
    umask: int,
    extra: dict[str, str] | None = None,
) -> Service:
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(layout.run_dir / "home" / name),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "AFFIDAVIT_HOME": str(layout.home_dir),
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
        **layout.env,
        **(extra or {}),
    }
    switch = layout.switch_users
    return Service(
        name,
        tuple(argv),
        uid if switch else None,
        gid if switch else None,
        env,
        layout.run_dir,
        umask,
    )


def services(
    layout: GuestLayout, tee_type: str = "none", shared_store: bool = False
) -> dict[str, Service]:
    """The three services (and the divergence job), as the supervisor runs them. ``tee_type``:
    what the self-check showed (``sev-snp``, ``tdx``, or ``none``), which the engine puts in
    every reproducibility block (``AFFIDAVIT_TEE_TYPE``); ``shared_store``: the proxy writes
    the database ``store_file`` names, not ``record.db``."""
    from harness.panel.prefix import PANEL_ROOT

    cli = [layout.python, "-m", "affidavit"]
    p, e, h = layout.proxy_uid, layout.engine_uid, layout.harness_uid
    home = ["--home", str(layout.home_dir)]
    return {
        "engine": _service(
            layout, "engine", e, e,
            [*cli, "engine", "serve", "--model", str(layout.model.path), "--host", "127.0.0.1",
             "--port", str(layout.engine_port), "--model-name", layout.model.name,
             "--token-file", str(layout.token_file("engine")), "--log-level", "warning"],
            0o077,
            {"AFFIDAVIT_TEE_TYPE": tee_type},
        ),
        "proxy": _service(
            layout, "proxy", p, h,  # gid: new record files are the harness's group to read
            [layout.python, "-m", "enclave_image.appliance_proxy", "--record",
             str(layout.record_dir), "--control", str(layout.control_socket), "--port",
             str(layout.proxy_port), "--engine", layout.url(layout.engine_port),
             "--engine-token-file", str(layout.token_file("proxy")), "--kds", layout.kds_url,
             "--tee-status", str(layout.tee_status_file),
             *(["--store-file", str(layout.store_file)] if shared_store else [])],
            0o027,
        ),
        "harness": _service(
            layout, "harness", h, h,
            [*cli, "panel", *home, "--port", str(layout.harness_port), "--root-path",
             PANEL_ROOT],
            0o077,
        ),
        "diverge": _service(layout, "diverge", h, h, [*cli, "diverge", *home], 0o077),
    }  # fmt: skip


def answers(url: str, *, any_status: bool = False, token: str | None = None) -> bool:
    """Whether ``url`` answers 200 (``any_status``: any HTTP answer at all); ``token``: sent
    as the Bearer credential (the engine's)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=5
        ) as reply:
            return bool(reply.status == 200)
    except urllib.error.HTTPError:
        return any_status
    except (OSError, ValueError):
        return False


def wait_for(
    name: str,
    url: str,
    timeout: float,
    stop: threading.Event,
    *,
    any_status: bool = False,
    token: str | None = None,
) -> float:
    """Seconds until ``url`` answered; ``StartError`` at ``timeout`` or when stopping."""
    start = time.monotonic()
    while not answers(url, any_status=any_status, token=token):
        if time.monotonic() - start > timeout:
            raise StartError(f"{name} did not answer {url} within {timeout:.0f} s")
        if stop.wait(0.5):
            raise StartError(f"stopped while waiting for {name}")
    return time.monotonic() - start


def ready_line(layout: GuestLayout, first_boot: bool, report_data: bytes) -> str:
    return (
        f"affidavit-appliance ready engine={layout.url(layout.engine_port)}"
        f" proxy={layout.url(layout.proxy_port)} harness={layout.url(layout.harness_port)}"
        f" state={'first-boot' if first_boot else 'kept'} report_data={report_data.hex()}"
    )


def keep_evidence(layout: GuestLayout, keys: Keys, evidence: Collected, say: Say) -> bytes:
    """Keep the boot evidence on the state disk and in the record, through the proxy's
    control plane (``ArchiveEvidence``) in a stream of its own, sealed to the appliance's key:
    the SNP report and its certificate chain, under the names ``bind-check`` pairs them by.
    The chain comes from the host's certificate table (configfs-tsm's ``auxblob``) when the
    host gives one, else from AMD's KDS through the proxy (``FetchCollateral``: both answers
    recorded in the same stream). A chain that cannot be had is said, and the report is kept
    regardless: ``bind-check --certs`` takes the chain later. Returns the chain kept (PEM:
    VCEK, ASK, ARK), empty when none: what the self-check and the attested front use."""
    from attestation.bind_check import evidence_names
    from attestation.binding import binding_digest
    from attestation.snp import parse_report
    from attestation.snp_cert_table import CertTableError, chain_pem, read_cert_table
    from egress_proxy.control import ControlClient

    if evidence.kind != "sev-snp":
        say(
            f"evidence: a {evidence.kind} report ({len(evidence.report)} bytes) came through"
            f" {evidence.via}; keeping {evidence.kind} evidence is not built yet"
        )
        return b""
    report = evidence.report
    parsed = parse_report(report)
    if bytes(parsed.report_data)[:32] != binding_digest(keys.log_key, keys.sealing_raw):
        raise StartError("the SNP report does not carry this appliance's binding")
    try:
        chain = chain_pem(read_cert_table(evidence.aux))
    except CertTableError as exc:  # the host's table, not ours: keep the report regardless
        say(f"evidence: the host's certificate table is not kept: {exc}")
        chain = b""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name, certs_name, _ = evidence_names("snp", stamp)
    client = ControlClient(layout.control_socket)
    try:
        opened = client.open_session([], {"affidavit/boot-evidence": stamp})
        stream = opened.session_id
        (layout.evidence_dir / name).write_bytes(report)
        kept = client.archive_evidence(stream, "sev-snp", name, report)
        say(
            f"evidence: SNP report kept as {name} at seq {kept.seq} of stream {stream}"
            f" (through {evidence.via})"
        )
        whence = "the host's certificates"
        if not chain:
            chain = _chain_from_kds(client, stream, parsed, cpu_product(layout.cpuinfo), say)
            whence = "the certificates from AMD's KDS"
        if chain:
            (layout.evidence_dir / certs_name).write_bytes(chain)
            kept = client.archive_evidence(stream, "sev-snp", certs_name, chain)
            say(f"evidence: {whence} kept as {certs_name} at seq {kept.seq}")
        else:
            say("evidence: no certificate chain kept: bind-check needs it given (--certs)")
    finally:
        client.channel.close()
    return chain


def cpu_product(cpuinfo: Path) -> Product | None:
    """The SEV-SNP product the guest's CPUID names (``/proc/cpuinfo``'s first ``cpu family``
    and ``model``), or None: what KDS is asked about when the report (version 2) names none."""
    from attestation.snp_report import product_from_cpuid

    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    if not (family.isdigit() and model.isdigit()):
        return None
    return product_from_cpuid(int(family), int(model))


def _chain_from_kds(
    client: ControlClient, stream: str, parsed: SnpReport, product: Product | None, say: Say
) -> bytes:
    """The report's chain (VCEK, ASK, ARK) from AMD's KDS, asked through the proxy, which
    records both answers in ``stream``; empty, having said why, when it cannot be had.
    ``product``: the one the guest's CPUID names, for a report that names none."""
    import grpc

    from attestation.amd_kds import KdsError, chain_from_kds, chain_path, vcek_path

    try:
        paths = (vcek_path(parsed, product), chain_path(parsed, product))
    except KdsError as exc:
        say(f"evidence: no certificates from the host, and none to ask KDS for: {exc}")
        return b""
    answers: list[bytes] = []
    for path in paths:
        try:
            got = client.fetch_collateral(stream, path)
        except grpc.RpcError as exc:
            say(f"evidence: KDS {path}: {exc.details()}")
            return b""
        if got.status != 200:
            say(f"evidence: KDS {path}: HTTP {got.status} (recorded at seq {got.response_seq})")
            return b""
        say(f"evidence: KDS {path}: {len(got.body)} bytes, recorded at seq {got.response_seq}")
        answers.append(got.body)
    try:
        return chain_from_kds(parsed, answers[0], answers[1], product)
    except KdsError as exc:
        say(f"evidence: KDS's answers are not kept: {exc}")
        return b""


def _last_json(lines: list[str]) -> dict[str, object] | None:
    """The last JSON object a command printed (progress lines may come before it)."""
    for start in reversed([i for i, line in enumerate(lines) if line.startswith("{")]):
        try:
            value = json.loads("\n".join(lines[start:]))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


class _Refused(Exception):
    """The proxy refused the self-test's pinned session (the message says why)."""


def selftest_turn(layout: GuestLayout, sup: Supervisor, say: Say) -> None:
    """One pinned agent turn through the proxy, as the harness: ``session new`` then ``turn``.
    An appliance that refuses pinned sessions (its self-check failed) says so in one line
    (``selftest: refused: …``) and goes on running."""
    from egress_proxy.tee_status import REFUSAL

    base = services(layout)["diverge"]
    cli = [layout.python, "-m", "affidavit"]
    home = ["--home", str(layout.home_dir)]

    def job(name: str, *args: str) -> dict[str, object]:
        argv = (*cli, *args, *home, "--json")
        done = sup.run(
            Service(name, argv, base.uid, base.gid, base.env, base.cwd, base.umask),
            layout.selftest_timeout,
        )
        refused = next((line for line in done.lines if REFUSAL in line), None)
        if done.returncode != 0 and refused is not None:
            raise _Refused(refused.split(REFUSAL, 1)[1])
        parsed = _last_json(done.lines)
        if done.returncode != 0 or parsed is None:
            raise StartError(f"selftest: {' '.join(args[:2])} exited {done.returncode}")
        return parsed

    try:
        opened = job("selftest", "session", "new", "--pin", "default")
    except _Refused as exc:
        say(f"selftest: refused: {exc}")
        return
    session = str(opened["session"])
    result = job("selftest", "turn", session, "Say hello in five words.")
    answer = str(result.get("answer") or "")
    steps = result.get("steps")
    digest = hashlib.sha256(answer.encode()).hexdigest()
    say(
        f"selftest: turn {result.get('turn')} of session {session} {result.get('outcome')}"
        f" reply sha256={digest} steps={len(steps) if isinstance(steps, list) else 0}"
    )


def self_check(
    layout: GuestLayout,
    options: BootOptions,
    keys: Keys,
    nonce: bytes,
    evidence: Collected | None,
    chain: bytes,
    say: Say,
) -> SelfCheck:
    """Check this boot's own evidence (``attestation.self_check``), write the outcome where
    the proxy reads it (``layout.tee_status_file``: root's, 0644) and say it: attested, or
    FAILED and pinned sessions refused, or FAILED and, by ``affidavit.unattested=allow``,
    allowed all the same, loudly."""
    from datetime import UTC, datetime

    from attestation.evidence import read_trusted_roots
    from attestation.self_check import SelfCheck, check_own
    from egress_proxy.tee_status import TeeStatus, write_tee_status

    now = datetime.now(UTC)
    if options.keysource != "snp":
        absent = f"keysource={options.keysource} asks no TEE"
    else:
        absent = f"neither {layout.tsm_reports} nor {layout.sev_guest} is here"
    try:
        trusted = read_trusted_roots(layout.self_check_roots) if layout.self_check_roots else None
        checked = check_own(
            evidence.kind if evidence is not None else None,
            evidence.report if evidence is not None else None,
            chain,
            log_key=keys.log_key,
            sealing_public=keys.sealing_raw,
            nonce=nonce,
            now=now,
            trusted=trusted,
            absent=absent,
        )
    except Exception as exc:  # a check that cannot run is a check that failed, never a crash
        checked = SelfCheck(
            False, "none", [], f"the check did not run: {type(exc).__name__}: {exc}"
        )
    status = TeeStatus(
        attested=checked.attested,
        tee_type=checked.tee_type,
        allow_unattested=options.allow_unattested,
        reason=checked.reason,
        checked_at=now,
    )
    try:
        write_tee_status(layout.tee_status_file, status)
    except OSError as exc:
        raise StartError(f"selfcheck: cannot write {layout.tee_status_file}: {exc}") from None
    if checked.attested:
        say(f"selfcheck: {checked.summary()}")
        for check in checked.checks:
            if check.ok is None:
                say(f"selfcheck: not checked here: {check.name}: {check.detail}")
    elif options.allow_unattested:
        say(f"selfcheck: FAILED: {checked.reason}")
        say(
            "selfcheck: WARNING: unattested operation allowed by affidavit.unattested=allow:"
            " every reply says tee_type none"
        )
    else:
        say(f"selfcheck: FAILED: {checked.reason}: pinned sessions are refused")
    gpus = nvidia_devices(layout.pci_devices)
    if gpus:
        say(
            f"selfcheck: not checked here: gpu: NVIDIA device {', '.join(gpus)} is present, but"
            " this image has no NVIDIA driver: it is neither used nor attested (docs/deploy.md)"
        )
    return checked


#: NVIDIA's PCI vendor id.
NVIDIA_VENDOR = "0x10de"


def nvidia_devices(pci_devices: Path) -> list[str]:
    """The PCI addresses of NVIDIA devices passed through to this guest (sysfs), sorted."""
    try:
        devices = sorted(pci_devices.iterdir())
    except OSError:
        return []
    found = []
    for device in devices:
        try:
            vendor = (device / "vendor").read_text("ascii").strip().lower()
        except (OSError, UnicodeDecodeError):
            continue
        if vendor == NVIDIA_VENDOR:
            found.append(device.name)
    return found


def start_front(layout: GuestLayout, keys: Keys, source: EvidenceSource, say: Say) -> Front:
    """The external TLS port (``harness.front``): TLS with the key kept in ``layout.tls_dir``
    (made at first boot), ``/attestation`` answered from ``source`` bound to that key,
    ``/panel/…`` relayed to the panel's own process on loopback (which serves under that
    root, as its own uid), every other request to the proxy on loopback."""
    from attestation.channel import ChannelIdentity, claimed_release
    from attestation.relay import Relay
    from attestation.tls_identity import TlsIdentityError, tls_identity
    from harness.front import PANEL_ROOT, SESSION_ROUTES, Attested, Front, NoTee

    try:
        tls = tls_identity(layout.tls_dir)
    except (TlsIdentityError, OSError) as exc:
        raise StartError(f"front: the TLS key: {exc}") from None
    identity = ChannelIdentity(keys.log_key, keys.sealing_raw, tls.spki_sha256)
    relay = Relay(layout.url(layout.proxy_port), only=SESSION_ROUTES)
    panel = Relay(layout.url(layout.harness_port), only=(PANEL_ROOT,), forwarded=True)
    app = Attested(relay, identity, source, claimed_release(), panel=panel)
    try:
        front = Front(layout.tls_host, layout.tls_port, tls, app).start()
    except (OSError, RuntimeError) as exc:
        raise StartError(
            f"front: cannot serve {layout.tls_host}:{layout.tls_port}: {exc}"
        ) from None
    answers = "503 no_tee (no TEE)" if isinstance(source, NoTee) else "fresh evidence"
    say(
        f"front: {front.url}: TLS key spki sha256={tls.spki_sha256.hex()}; /attestation"
        f" answers {answers}; {PANEL_ROOT}/ goes to the panel (its URL with the token:"
        " the harness's line), every other request to the proxy"
    )
    return front


def run_appliance(
    layout: GuestLayout, options: BootOptions, first_boot: bool, say: Say, stop: threading.Event
) -> int:
    """Steps 3 to 8 on a mounted state disk, then supervision until ``stop``."""
    prepare_dirs(layout)
    keys = prepare_keys(layout)
    where = layout.record_dir
    say(
        f"keys: {'created at first boot' if keys.created else 'kept from an earlier boot'} in {where}"
    )
    say(f"keys: log key {keys.log_key}")
    say(f"keys: sealing key {keys.sealing}")
    nonce = os.urandom(32)
    data = keys.report_data(nonce)
    say(f"keys: report_data={data.hex()}")
    evidence: Collected | None = None
    if options.keysource != "snp":
        say(f"evidence: none collected: keysource={options.keysource} (no TEE to ask)")
    else:
        evidence = collect_evidence(data, reports=layout.tsm_reports, sev_guest=layout.sev_guest)
        if evidence is None:
            say(
                f"evidence: none collected: neither {layout.tsm_reports} nor"
                f" {layout.sev_guest} is here"
            )
    model = layout.model
    layout.tee_status_file.unlink(missing_ok=True)  # never an earlier boot's word
    if model.test_model is None:
        say(f"model: {model.name} ({model.path})")
    else:
        say(
            f"model: WARNING: TEST MODEL {model.name} ({model.path}): a test build"
            f" (test model {model.test_model}), NOT the release's model"
        )
    shared = prepare_store(layout, say)
    write_appliance_json(layout, shared, keys.log_key)
    token = write_engine_token(layout)
    specs = services(layout, shared_store=shared)
    sup = Supervisor(say, reap_all=os.getpid() == 1)
    sup.start_reaper()
    timer: WeeklyTimer | None = None
    front: Front | None = None
    try:
        # the proxy first: keeping the evidence (and fetching its chain from KDS) needs it;
        # until the self-check's status is written it refuses pinned sessions
        sup.start(specs["proxy"])
        wait_for("proxy", layout.url(layout.proxy_port) + "/metrics", layout.start_timeout, stop)
        say("health: proxy answers /metrics")
        from enclave_image.appliance_channel import GuestEvidence
        from harness.front import PANEL_ROOT, NoTee

        chain = keep_evidence(layout, keys, evidence, say) if evidence is not None else b""
        checked = self_check(layout, options, keys, nonce, evidence, chain, say)
        # the engine puts what the check showed in every reproducibility block
        sup.start(services(layout, checked.tee_type, shared)["engine"])
        sup.start(specs["harness"])
        source: EvidenceSource = (
            GuestEvidence(chain, reports=layout.tsm_reports, sev_guest=layout.sev_guest)
            if options.keysource == "snp"
            else NoTee()
        )
        front = start_front(layout, keys, source, say)

        def diverge() -> None:
            say("timer: divergence check starting")
            done = sup.run(specs["diverge"], layout.diverge_timeout)
            say(
                f"timer: divergence check exited {done.returncode}; next {timer.next_due().isoformat() if timer else '?'}"
            )

        timer = WeeklyTimer(layout.timer_file, diverge, period=layout.diverge_period)
        days = layout.diverge_period / timedelta(days=1)
        say(
            f"timer: divergence check every {days:g}d, next {timer.next_due().isoformat(timespec='seconds')}"
        )
        wait_for(
            "harness",
            layout.url(layout.harness_port) + PANEL_ROOT + "/",
            layout.start_timeout,
            stop,
            any_status=True,
        )
        say("health: harness panel answers")
        took = wait_for(
            "engine",
            layout.url(layout.engine_port) + "/v1/models",
            layout.engine_start_timeout,
            stop,
            token=token,
        )
        say(f"health: engine answers /v1/models ({took:.0f} s)")
        say(ready_line(layout, first_boot, data))
        timer.start()
        if options.selftest:
            selftest_turn(layout, sup, say)
        stop.wait()
        return 0
    finally:
        if timer is not None:
            timer.stop()
        if front is not None:
            front.stop()
        say("appliance: stopping the services")
        sup.stop_all()


# -- PID 1 ---------------------------------------------------------------------------------------


def _console(line: str) -> None:
    print(line, flush=True)


_KEY_POWER, _EV_KEY = 116, 1


def watch_power_button(layout: GuestLayout, stop: threading.Event, say: Say) -> None:
    """Turn an ACPI power-button press (QEMU ``system_powerdown``) into a clean stop; needs
    the kernel's ``button`` and ``evdev`` (``/dev/input/event*``)."""
    try:
        blocks = layout.input_devices.read_text().split("\n\n")
    except OSError:
        return
    for block in blocks:
        if 'Name="Power Button"' not in block:
            continue
        for word in block.split():
            if word.startswith("event"):

                def read(path: Path = Path("/dev/input") / word) -> None:
                    with open(path, "rb") as events:
                        while chunk := events.read(24):
                            _, _, kind, code, value = struct.unpack("qqHHi", chunk)
                            if kind == _EV_KEY and code == _KEY_POWER and value == 1:
                                say("appliance: power button pressed")
                                stop.set()
                                return

                threading.Thread(target=read, name="power-button", daemon=True).start()


def _end(code: int, say: Say) -> int:
    """As PID 1, power the machine off (exiting would panic the kernel); else return."""
    if os.getpid() != 1:
        return code
    say(f"appliance: powering off (exit {code})")
    os.sync()
    ctypes.CDLL(None, use_errno=True).reboot(0x4321FEDC)  # LINUX_REBOOT_CMD_POWER_OFF
    return code


def main(layout: GuestLayout | None = None, say: Say = _console) -> int:
    layout = layout or GuestLayout()
    try:
        options = parse_cmdline(layout.cmdline.read_text())
    except (Refused, OSError) as exc:
        say(f"appliance: refusing to start: {exc}")
        return _end(2, say)
    say(f"appliance: starting (state={options.state} keysource={options.keysource})")
    stop = threading.Event()

    def on_signal(signum: int, _: object) -> None:
        say(f"appliance: {signal.Signals(signum).name}: stopping")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    watch_power_button(layout, stop, say)
    disk: StateDisk | None = None
    code = 1
    try:
        network_rules(layout, options.probe, say)
        if options.keysource == "test-insecure":
            say(
                "state: WARNING: keysource=test-insecure: the state disk's key is a fixed, public"
                " value; this boot is NOT confidential (QEMU test boots only)"
            )
        else:
            say("state: key from the AMD-SP (SNP_GET_DERIVED_KEY: VCEK root, measurement, policy)")
        key = disk_key(options.keysource, layout.sev_guest)
        disk = StateDisk(
            options.state, layout.state_mount, cryptsetup=layout.cryptsetup, mke2fs=layout.mke2fs
        )
        first = disk.prepare(key)
        if first:
            say(
                f"state: first boot, formatted {options.state} (LUKS2, ext4), mounted at {layout.state_mount}"
            )
        else:
            say(
                f"state: kept from an earlier boot: {options.state} opened, mounted at {layout.state_mount}"
            )
        code = run_appliance(layout, options, first, say, stop)
    except (StartError, TeeError, DiskError, Refused) as exc:
        say(f"appliance: FAILED: {exc}")
    except Exception as exc:  # PID 1 must still stop cleanly and power off
        say(f"appliance: FAILED: {type(exc).__name__}: {exc}")
    finally:
        if disk is not None and (os.path.ismount(layout.state_mount) or disk.mapped.exists()):
            problems = disk.close()
            say(
                "state: unmounted and closed"
                if not problems
                else f"state: close: {'; '.join(problems)}"
            )
    return _end(code, say)


if __name__ == "__main__":
    sys.exit(main())
