"""Another checkout and another venv, for the builds that must come out byte-identical
whoever runs them and from wherever (``test_boot.py``, ``test_full_image.py``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def second_checkout(where: Path) -> Path:
    """A copy of this checkout's files (tracked and not ignored) at another path: a clean tree
    with no build outputs, .venv or caches in it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / rel)
    return where


def second_venv(where: Path) -> Path:
    """A venv of its own at another path, whose interpreter finds this environment's
    dependencies (pip, setuptools and the image's build tools) through a ``.pth`` line, not
    this checkout: that comes from ``PYTHONPATH``. Its ``python`` is what the build runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    theirs = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(theirs, "dependencies.pth").write_text(ours + "\n")
    assert python.resolve() == Path(sys.executable).resolve()  # the same CPython...
    assert str(python) != sys.executable  # ...started from another path
    return python
