"""Running the build's command-line tools (apt-get, dpkg-deb, pip, mksquashfs, edk2's build).

One place for what a failed tool looks like: the command, its exit code and the end of what
it printed, raised as the caller's own error type so each stage names itself.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["run_tool"]


def run_tool(
    args: list[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    error: type[Exception] = RuntimeError,
    umask: int = -1,
) -> str:
    """``args``' stdout; ``error`` with the command, exit code and output tail if it fails.
    ``umask``: the child's (-1: this process's)."""
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, umask=umask
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise error(f"{' '.join(args)} failed ({done.returncode}):\n{tail}")
    return done.stdout
