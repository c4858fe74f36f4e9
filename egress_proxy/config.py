"""The proxy's one config file: where it listens, which upstreams it may dial, and which route
goes to which upstream (a ``mounts``-style mapping).

TOML (read with ``tomllib``) or JSON, chosen by the file's suffix. Every model refuses unknown
keys, and a bad file fails at start with the offending key named (``ConfigError``). API keys
are never in the file: a provider names the environment variable that holds its key (or a
file only its owner may read: ``api_key_file``), and :func:`api_keys` reads them once at
start (``ConfigMissing`` names the variable or the file).

This module never dials out and never reads the record.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from egress_proxy.errors import ConfigError, ConfigMissing
from egress_proxy.tool_config import FetchConfig, McpServers
from record.schema import describe

#: The data-plane routes a provider can be mounted on, and the wire dialect each one speaks.
ROUTES: dict[str, Literal["openai", "anthropic"]] = {
    "/v1/chat/completions": "openai",
    "/v1/responses": "openai",  # an OpenAI provider's Responses API (its own dialect)
    "/v1/messages": "anthropic",
}
Route = Literal["/v1/chat/completions", "/v1/responses", "/v1/messages"]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Model):
    """Where the data plane listens: loopback only (the harness is the one client)."""

    host: Literal["127.0.0.1", "::1"] = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)  # 0: any free port (tests)


class ProviderConfig(_Model):
    """One upstream. The route's path is appended to ``base_url`` as it is."""

    api: Literal["openai", "anthropic"]  # the wire dialect it speaks
    base_url: str  # e.g. "https://api.openai.com" (the route adds "/v1/chat/completions")
    api_key_env: str | None = None  # environment variable holding the key; None: no key
    # or a file holding it, readable by its owner only (the appliance's engine token)
    api_key_file: str | None = None
    api_version: str | None = None  # anthropic: the anthropic-version header sent upstream
    timeout_s: float = Field(600.0, gt=0)  # the whole reply, streamed or not
    connect_timeout_s: float = Field(10.0, gt=0)
    # An affidavit engine or its vLLM front: it takes the request members ``clock`` and
    # ``strict_cache`` (and, on the Messages and Responses APIs, ``seed``), which other
    # upstreams would refuse or ignore. Either API: the engine serves both.
    engine_extensions: bool = False
    inject_clock: bool = True  # put the clock into every prompt sent to this provider

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^/?#\s]+(/[^?#\s]*)?", value):
            raise ValueError(f"not an http(s) URL without query or fragment: {value!r}")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_RE.fullmatch(value):
            raise ValueError(f"not an environment variable name: {value!r}")
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> ProviderConfig:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("api_key_env and api_key_file: give one of them")
        return self


class CollateralConfig(_Model):
    """``[collateral]``: where the control plane's ``FetchCollateral`` fetches attestation
    collateral (``egress_proxy.collateral``): AMD's KDS unless the operator names another
    (a mirror, or a stand-in on loopback in tests). Like a provider's ``base_url`` it is the
    operator's, so the fetch rule's default refusals do not apply to it."""

    enabled: bool = True
    base_url: str = "https://kdsintf.amd.com"
    timeout_s: float = Field(30.0, gt=0)  # the whole answer
    connect_timeout_s: float = Field(10.0, gt=0)
    max_response_bytes: int = Field(1024 * 1024, gt=0, le=64 * 1024 * 1024)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[A-Za-z0-9.\-:\[\]]+", value.rstrip("/")):
            raise ValueError(f"not an http(s) URL of a host, without a path: {value!r}")
        return value.rstrip("/")


class ProxyConfig(_Model):
    """The whole file. See ``docs/proxy.md`` for a worked example."""

    listen: Listen = Listen()
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, le=256 * 1024 * 1024)
    # A model reply is read to at most this many bytes, then cut and recorded as UNKNOWN with
    # what arrived (docs/proxy.md §limits gives the memory this bounds).
    max_reply_bytes: int = Field(64 * 1024 * 1024, gt=0, le=1024 * 1024 * 1024)
    providers: dict[str, ProviderConfig] = Field(min_length=1)
    mounts: dict[Route, str] = Field(default_factory=dict)
    mcp_servers: McpServers = Field(default_factory=dict)  # tool servers: see tool_config
    fetch: FetchConfig = FetchConfig()
    collateral: CollateralConfig = CollateralConfig()
    # The full image's guest: the file where its PID 1 says whether the appliance's own
    # evidence checked out (``egress_proxy.tee_status``); pinned sessions are refused unless
    # it says attested (or unattested operation allowed). None: nothing checked (``affidavit
    # up`` on a developer's machine).
    tee_status: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _mcp_servers_as_clients_write_them(cls, data: Any) -> Any:
        """``mcpServers`` (Claude Desktop's, Cursor's format: ``egress_proxy.mcp_config``)
        is taken in place of ``mcp_servers``."""
        if not isinstance(data, dict) or "mcpServers" not in data:
            return data
        from egress_proxy.mcp_config import to_proxy_servers

        if "mcp_servers" in data:
            raise ValueError("mcpServers and mcp_servers: give one of them")
        rest = {k: v for k, v in data.items() if k != "mcpServers"}
        try:
            servers = to_proxy_servers({"mcpServers": data["mcpServers"]}, "config")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return {**rest, "mcp_servers": servers}

    @field_validator("providers")
    @classmethod
    def _names(cls, value: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        for name in value:
            if not _NAME_RE.fullmatch(name):
                raise ValueError(f"provider name {name!r} must match {_NAME_RE.pattern}")
        return value

    @model_validator(mode="after")
    def _mounts_name_providers(self) -> ProxyConfig:
        for route, name in self.mounts.items():
            provider = self.providers.get(name)
            if provider is None:
                raise ValueError(f"mounts.{route}: no provider named {name!r}")
            if provider.api != ROUTES[route]:
                raise ValueError(
                    f"mounts.{route}: provider {name!r} speaks {provider.api}, "
                    f"this route needs {ROUTES[route]}"
                )
        return self


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> ProxyConfig:
    """Validate a loaded document; ``ConfigError`` names each offending key."""
    try:
        return ProxyConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, source)) from None


def load_config(path: Path | str) -> ProxyConfig:
    """Read and validate a ``.toml`` or ``.json`` config file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigMissing(f"config file {path} does not exist") from None
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        elif path.suffix == ".json":
            data = json.loads(raw)
        else:
            raise ConfigError(f"{path}: the config must be a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/object")
    return parse_config(data, source=str(path))


def api_keys(config: ProxyConfig, env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Each provider's API key, read once at start from the variable its config names."""
    env = os.environ if env is None else env
    keys: dict[str, str | None] = {}
    for name, provider in config.providers.items():
        if provider.api_key_file is not None:
            keys[name] = _key_file(name, Path(provider.api_key_file))
            continue
        if provider.api_key_env is None:
            keys[name] = None
            continue
        value = env.get(provider.api_key_env)
        if not value:
            raise ConfigMissing(
                f"providers.{name}.api_key_env: environment variable "
                f"{provider.api_key_env} is not set"
            )
        keys[name] = value
    return keys


def _key_file(name: str, path: Path) -> str:
    """``api_key_file``'s key: a file only its owner may read, holding one line."""
    where = f"providers.{name}.api_key_file"
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigMissing(f"{where}: {path} does not exist") from None
    except OSError as exc:
        raise ConfigMissing(f"{where}: cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"{where}: {path} is mode {mode & 0o777:04o}: others may read the key")
    key = text.strip()
    if not key or any(c.isspace() for c in key):
        raise ConfigError(f"{where}: {path} does not hold one key on one line")
    return key
