"""The engine answers only its token (``inference.engine_token``, ``engine serve --token-file``).

The real engine on the tiny model, its real FastAPI app under uvicorn on a loopback socket,
called over HTTP: without the token, or with another, every route is 401 and the request never
reaches a handler; with it (as a Bearer credential, or ``x-api-key`` as the proxy sends an
Anthropic-style provider) it answers. The CLI reads the token file before it loads a model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inference.cli import EXIT_MISSING, EXIT_USAGE
from inference.engine_token import TokenFileError, new_token, read_token_file, write_token_file
from tests.inference.serving import serve_in_thread

pytest.importorskip("torch", reason="the engine tests need the `engine` extra")

TOKEN = new_token()
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    from inference.server import Engine, create_app

    engine = Engine(tiny_model_dir, model_name="tiny", batch_invariance=False).start()
    try:
        yield from serve_in_thread(create_app(engine, token=TOKEN))
    finally:
        engine.close()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-the-engine-token-at-all"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"x-api-key": TOKEN[:-1]},
    ],
    ids=["none", "wrong", "not-bearer", "longer", "shorter-key"],
)
def test_without_the_token_every_route_is_401(engine_url: str, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=engine_url, headers=headers) as client:
        replies = [
            client.get("/v1/models"),
            client.get("/v1/engine/stats"),
            client.post("/v1/chat/completions", json=CHAT),
            client.post("/v1/messages", json=CHAT),
            client.get("/no/such/route"),
        ]
    for reply in replies:
        assert reply.status_code == 401, (reply.request.url, reply.text)
        assert reply.json()["error"]["code"] == "invalid_api_key"
        assert reply.headers["www-authenticate"].startswith("Bearer")
        assert TOKEN not in reply.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {TOKEN}"},
        {"authorization": f"bearer {TOKEN}"},
        {"x-api-key": TOKEN},
    ],
    ids=["bearer", "lowercase", "x-api-key"],
)
def test_with_the_token_it_answers(engine_url: str, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=engine_url, headers=headers, timeout=60) as client:
        models = client.get("/v1/models")
        chat = client.post("/v1/chat/completions", json=CHAT)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
    assert chat.status_code == 200, chat.text
    assert chat.json()["object"] == "chat.completion"


def test_the_token_file_is_its_owners_alone(tmp_path: Path) -> None:
    path = write_token_file(tmp_path / "engine.token", TOKEN)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_token_file(path) == TOKEN
    path.chmod(0o640)
    with pytest.raises(TokenFileError, match="mode 0640: group or others may read"):
        read_token_file(path)
    short = write_token_file(tmp_path / "short.token", "abc")
    with pytest.raises(TokenFileError, match="not a token"):
        read_token_file(short)
    with pytest.raises(FileNotFoundError):
        read_token_file(tmp_path / "absent.token")


def test_engine_serve_checks_the_token_file_before_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main

    model = str(tmp_path / "no-model-here")  # never reached: the token file is read first
    assert main(["engine", "serve", "--model", model, "--token-file", str(tmp_path / "x")]) == (
        EXIT_MISSING
    )
    assert "token file" in capsys.readouterr().err
    loose = write_token_file(tmp_path / "loose.token", TOKEN)
    loose.chmod(0o644)
    assert main(["engine", "serve", "--model", model, "--token-file", str(loose)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "mode 0644" in err and TOKEN not in err
    tight = write_token_file(tmp_path / "tight.token", TOKEN)
    assert main(["engine", "serve", "--model", model, "--token-file", str(tight)]) == EXIT_MISSING
    assert "cannot load the model" in capsys.readouterr().err
