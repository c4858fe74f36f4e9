"""The proxy holds the engine's token (``providers.<name>.api_key_file``) and sends it.

Config: the key file must exist (``ConfigMissing``, exit 3), be readable by its owner alone and
hold one key (``ConfigError``, exit 2), and a provider names one key source. Then the real
engine on the tiny model, answering only its token, behind a real proxy on loopback: with the
key file the call is answered and recorded; the same proxy without it gets the engine's 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxy.config import api_keys, parse_config
from egress_proxy.errors import ConfigError, ConfigMissing
from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import LoopbackServer

TOKEN = "engine-token-" + "k" * 32
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _config(engine_url: str, key_file: Path | None) -> Any:
    model: dict[str, Any] = {"api": "openai", "base_url": engine_url, "engine_extensions": True}
    if key_file is not None:
        model["api_key_file"] = str(key_file)
    return parse_config(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "providers": {"model": model},
            "mounts": {"/v1/chat/completions": "model"},
        }
    )


def _key_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_key_file_must_exist_be_private_and_hold_one_key(tmp_path: Path) -> None:
    good = _key_file(tmp_path / "good", TOKEN + "\n")
    assert api_keys(_config("http://127.0.0.1:1", good)) == {"model": TOKEN}
    with pytest.raises(ConfigMissing, match=r"providers\.model\.api_key_file: .*does not exist"):
        api_keys(_config("http://127.0.0.1:1", tmp_path / "absent"))
    loose = _key_file(tmp_path / "loose", TOKEN, 0o644)
    with pytest.raises(ConfigError, match="mode 0644: others may read the key") as caught:
        api_keys(_config("http://127.0.0.1:1", loose))
    assert caught.value.exit_code == 2 and TOKEN not in str(caught.value)
    two = _key_file(tmp_path / "two", "one two")
    with pytest.raises(ConfigError, match="one key on one line"):
        api_keys(_config("http://127.0.0.1:1", two))
    with pytest.raises(ConfigError, match="api_key_env and api_key_file: give one of them"):
        parse_config(
            {
                "providers": {
                    "m": {
                        "api": "openai",
                        "base_url": "http://127.0.0.1:1",
                        "api_key_env": "X",
                        "api_key_file": str(good),
                    }
                }
            }
        )


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real engine on the tiny model, answering only ``TOKEN``."""
    pytest.importorskip("torch", reason="the engine test needs the `engine` extra")
    from inference.make_model import make_model
    from inference.server import Engine, create_app

    made = make_model(tmp_path_factory.mktemp("tiny") / "model")
    engine = Engine(made.path, model_name="tiny", batch_invariance=False).start()
    try:
        with LoopbackServer(create_app(engine, token=TOKEN)) as server:
            yield server.url
    finally:
        engine.close()


def _call(proxy: ProxyServer, user: KeyPair) -> httpx.Response:
    opened = proxy.registry.open_session([user.recipient])
    return httpx.post(
        f"{opened.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {opened.token}"},
        json=CHAT,
        timeout=60,
    )


def test_only_the_proxy_with_the_key_file_is_answered(engine_url: str, tmp_path: Path) -> None:
    assert httpx.get(engine_url + "/v1/models").status_code == 401  # nobody else is
    user = KeyPair.generate()
    key_file = _key_file(tmp_path / "engine.token", TOKEN + "\n")
    with Log.open(tmp_path / "record.db", appliance_key=KeyPair.generate()) as log:
        with ProxyServer(_config(engine_url, key_file), log) as proxy:
            answered = _call(proxy, user)
        with ProxyServer(_config(engine_url, None), log) as keyless:
            refused = _call(keyless, user)
    assert answered.status_code == 200, answered.text
    assert answered.json()["object"] == "chat.completion"
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "invalid_api_key"  # the engine's, relayed
