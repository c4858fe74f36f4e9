"""The guest program run on the host: a ``GuestLayout`` of a test's own folder and free
loopback ports, and ``run_appliance`` booted in a thread, as the appliance tests use them."""

from __future__ import annotations

import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enclave_image.appliance import BootOptions, GuestLayout, run_appliance

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def host_layout(tmp: Path, **fields: Any) -> GuestLayout:
    """The guest's layout under ``tmp``: its state, run folder and model disk there, every
    service on its own free loopback port, under this uid; ``fields`` override."""
    engine, proxy, harness, tls = free_ports(4)
    given: dict[str, Any] = {
        "state_mount": tmp / "state",
        "run_dir": tmp / "run",
        "sev_guest": tmp / "no-sev-guest",
        "model_dir": tmp / "model",
        "python": sys.executable,
        "engine_port": engine,
        "proxy_port": proxy,
        "harness_port": harness,
        "tls_port": tls,
        "tls_host": "127.0.0.1",
        "switch_users": False,
        "start_timeout": 60,
        "engine_start_timeout": 60,
        "env": {"PYTHONPATH": str(REPO)},
    }
    return GuestLayout(**{**given, **fields})


@dataclass
class Booted:
    """``run_appliance`` in a thread: what it said, and its exit code once stopped."""

    layout: GuestLayout
    said: list[str] = field(default_factory=list)
    selftest: threading.Event = field(default_factory=threading.Event)  # its line is said
    stop: threading.Event = field(default_factory=threading.Event)
    result: list[int] = field(default_factory=list)
    thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        self.said.append(line)
        if line.startswith("selftest: "):
            self.selftest.set()

    def shut(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(60)


def boot(layout: GuestLayout, options: BootOptions, first_boot: bool = True) -> Booted:
    """Start the guest program's steps 3 to 8 on ``layout`` (its state folder made)."""
    booted = Booted(layout)
    layout.state_mount.mkdir(exist_ok=True)

    def run() -> None:
        booted.result.append(run_appliance(layout, options, first_boot, booted.say, booted.stop))

    booted.thread = threading.Thread(target=run)
    booted.thread.start()
    return booted
