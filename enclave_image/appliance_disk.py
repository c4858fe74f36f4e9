"""The encrypted state disk: LUKS2 over the raw disk, ext4 inside, mounted for the services.

The disk key comes from the TEE (``enclave_image.appliance_tee``), so the keys born in the
guest survive a reboot and are readable only by this image. The key is 32 bytes of full
strength, so the PBKDF is the cheapest cryptsetup allows (PBKDF2, 1000 iterations): a
memory-hard KDF would only cost minutes under TCG and add nothing.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskError", "StateDisk"]


class DiskError(Exception):
    """A step of preparing the state disk failed (the message names the command)."""


@dataclass(frozen=True)
class StateDisk:
    """How to reach the disk and its tools (the guest's paths by default)."""

    device: Path
    mountpoint: Path = Path("/var/lib/affidavit")
    mapper_name: str = "affidavit-state"
    cryptsetup: str = "/sbin/cryptsetup"
    mke2fs: str = "/sbin/mke2fs"
    mount: str = "mount"
    umount: str = "umount"

    @property
    def mapped(self) -> Path:
        return Path("/dev/mapper") / self.mapper_name

    def _run(
        self, argv: list[str], *, key: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            done = subprocess.run(argv, input=key, capture_output=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DiskError(f"{' '.join(argv)}: {exc}") from None
        return done

    def _check(self, argv: list[str], *, key: bytes | None = None) -> None:
        done = self._run(argv, key=key)
        if done.returncode != 0:
            err = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
            raise DiskError(f"{' '.join(argv)} exited {done.returncode}: {' / '.join(err[-3:])}")

    def is_luks(self) -> bool:
        """Whether the disk already carries a LUKS header (not: the first boot)."""
        if not self.device.exists():
            raise DiskError(f"the state disk {self.device} does not exist")
        return self._run([self.cryptsetup, "isLuks", str(self.device)]).returncode == 0

    def format(self, key: bytes) -> None:
        """Write a fresh LUKS2 header whose one keyslot opens with ``key``."""
        self._check(
            [self.cryptsetup, "luksFormat", "--type", "luks2", "--batch-mode",
             "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--hash", "sha256",
             "--label", "affidavit-state", "--key-file", "-", str(self.device)],
            key=key,
        )  # fmt: skip

    def key_opens(self, key: bytes) -> bool:
        """Whether ``key`` opens a keyslot (no device-mapper needed)."""
        argv = [self.cryptsetup, "open", "--test-passphrase", "--key-file", "-", str(self.device)]
        return self._run(argv, key=key).returncode == 0

    def open(self, key: bytes) -> None:
        self._check(
            [self.cryptsetup, "open", "--type", "luks2", "--key-file", "-", str(self.device),
             self.mapper_name],
            key=key,
        )  # fmt: skip

    def make_filesystem(self) -> None:
        self._check([self.mke2fs, "-t", "ext4", "-q", "-F", "-L", "affidavit", str(self.mapped)])

    def mount_it(self) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._check(
            [self.mount, "-t", "ext4", "-o", "nodev,nosuid,noexec", str(self.mapped),
             str(self.mountpoint)]
        )  # fmt: skip

    def prepare(self, key: bytes) -> bool:
        """Open and mount the disk, formatting it first when it has no header; returns
        whether this was the first boot."""
        first = not self.is_luks()
        if first:
            self.format(key)
        elif not self.key_opens(key):
            raise DiskError(
                f"the state disk {self.device} does not open with this image's key "
                "(another image or chip formatted it)"
            )
        self.open(key)
        if first:
            self.make_filesystem()
        self.mount_it()
        return first

    def close(self) -> list[str]:
        """Unmount and close the LUKS device; returns what failed (best effort at shutdown)."""
        problems = []
        for argv in (
            [self.umount, str(self.mountpoint)],
            [self.cryptsetup, "close", self.mapper_name],
        ):
            done = self._run(argv)
            if done.returncode != 0:
                problems.append(f"{' '.join(argv)}: {done.stderr.decode(errors='replace').strip()}")
        return problems
