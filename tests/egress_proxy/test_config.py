"""egress_proxy.config: one file, TOML or JSON, and a bad one fails at start naming its key.

Also: the API key comes from the environment variable the config names, read once at start
(``create_app`` fails before serving when it is unset), and the proxy listens on loopback
only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egress_proxy.app import create_app
from egress_proxy.config import ProxyConfig, api_keys, load_config, parse_config
from egress_proxy.errors import ConfigError, ConfigMissing
from record.log import Log

TOML = """
max_body_bytes = 1048576

[listen]
host = "127.0.0.1"
port = 8700

[providers.openai]
api = "openai"
base_url = "https://api.openai.com/"
api_key_env = "OPENAI_API_KEY"

[providers.claude]
api = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"
api_version = "2023-06-01"

[providers.engine]
api = "openai"
base_url = "http://127.0.0.1:8000"

[mounts]
"/v1/chat/completions" = "engine"
"/v1/messages" = "claude"
"""


def test_toml_and_json_read_alike(tmp_path: Path) -> None:
    toml_path = tmp_path / "proxy.toml"
    toml_path.write_text(TOML)
    config = load_config(toml_path)
    json_path = tmp_path / "proxy.json"
    json_path.write_text(json.dumps(config.model_dump()))
    assert load_config(json_path) == config
    assert config.providers["openai"].base_url == "https://api.openai.com"
    assert config.mounts == {"/v1/chat/completions": "engine", "/v1/messages": "claude"}
    assert config.max_body_bytes == 1048576
    keys = api_keys(config, {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"})
    assert keys == {"openai": "a", "claude": "b", "engine": None}


def doc(**change: object) -> dict[str, object]:
    base: dict[str, object] = {
        "providers": {"p": {"api": "openai", "base_url": "http://127.0.0.1:9"}},
        "mounts": {"/v1/chat/completions": "p"},
    }
    base.update(change)
    return base


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (doc(extra_key=1), "extra_key"),
        (doc(listen={"host": "0.0.0.0"}), "listen.host"),
        (doc(listen={"port": 70000}), "listen.port"),
        (doc(max_body_bytes=0), "max_body_bytes"),
        (doc(providers={}), "providers"),
        (doc(providers={"p": {"api": "grpc", "base_url": "http://x"}}), "providers.p.api"),
        (doc(providers={"p": {"api": "openai", "base_url": "ftp://x"}}), "providers.p.base_url"),
        (
            doc(providers={"p": {"api": "openai", "base_url": "http://x", "key": "k"}}),
            "providers.p.key",
        ),
        (doc(providers={"P Q": {"api": "openai", "base_url": "http://x"}}), "providers"),
        (
            doc(providers={"p": {"api": "openai", "base_url": "http://x", "api_key_env": "A-B"}}),
            "providers.p.api_key_env",
        ),
        (doc(mounts={"/v1/embeddings": "p"}), "mounts./v1/embeddings"),
        (doc(mounts={"/v1/chat/completions": "nobody"}), "mounts./v1/chat/completions"),
        (doc(mounts={"/v1/messages": "p"}), "mounts./v1/messages: provider 'p' speaks openai"),
    ],
)
def test_a_bad_config_names_the_offending_key(document: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, source="proxy.toml")
    assert named in str(caught.value)
    assert caught.value.code == "config"
    assert caught.value.exit_code == 2


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigMissing) as missing:
        load_config(tmp_path / "absent.toml")
    assert missing.value.exit_code == 3
    bad = tmp_path / "bad.toml"
    bad.write_text("[providers\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    other = tmp_path / "proxy.yaml"
    other.write_text("{}")
    with pytest.raises(ConfigError, match=r"\.toml or \.json"):
        load_config(other)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ConfigError, match="top level"):
        load_config(listed)


def test_start_fails_when_a_key_variable_is_unset(tmp_path: Path) -> None:
    config = ProxyConfig.model_validate(
        doc(providers={"p": {"api": "openai", "base_url": "http://x", "api_key_env": "NOPE_KEY"}})
    )
    with Log.open(tmp_path / "record.db") as log, pytest.raises(ConfigMissing) as caught:
        create_app(config, log, env={})
    assert "providers.p.api_key_env" in str(caught.value)
    assert "NOPE_KEY" in str(caught.value)
