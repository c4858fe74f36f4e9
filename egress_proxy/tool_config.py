"""Config sections for tools: ``[mcp_servers.<name>]`` (MCP tool servers) and ``[fetch]``.

They live in the proxy's one config file (``egress_proxy.config`` holds them as the fields
``mcp_servers`` and ``fetch``) and follow its rules: unknown keys are refused and a bad value
fails at start naming its key. Secrets are never in the file: a remote server's bearer token
is read from the environment variable ``bearer_token_env`` names, and a ``${VAR}`` in a stdio
server's ``args`` or ``env`` values or a remote server's ``headers`` values is filled in from
the environment (:func:`resolved`), once, at start.

A stdio server is spawned by the proxy itself. By default (``network = "none"``) it runs in a
network namespace of its own (``unshare --net``), so the tool reaches nothing, loopback
included; ``network = "host"`` is the explicit, documented opt-out. Each session gets a
process of its own, started on first use and stopped after ``idle_timeout_s`` unused, unless
the server is ``shared``.

This module never spawns, dials or reads the record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, IPvAnyNetwork, field_validator

from egress_proxy.errors import ConfigMissing

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Server(_Model):
    """What every tool server has: which of its tools resume may safely re-issue."""

    #: Tools whose call may be repeated when its outcome is UNKNOWN (recorded per call).
    idempotent_tools: tuple[str, ...] = ()
    timeout_s: float = Field(300.0, gt=0)  # longest wait for one tools/list or tools/call


class StdioServer(_Server):
    """A local MCP server the proxy spawns and talks to over its stdin and stdout."""

    transport: Literal["stdio"]
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)  # added to a minimal PATH/HOME environment
    cwd: str | None = None
    network: Literal["none", "host"] = "none"  # none: its own empty network namespace
    #: False: each session gets its own process, started on its first use; True: one process
    #: for every session (its state is then seen by all of them).
    shared: bool = False
    idle_timeout_s: float = Field(600.0, gt=0)  # a process unused this long is stopped

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_RE.fullmatch(name):
                raise ValueError(f"not an environment variable name: {name!r}")
        return value


class RemoteServer(_Server):
    """A remote MCP server the proxy reaches over streamable HTTP, through its own network."""

    transport: Literal["streamable_http"]
    url: str
    bearer_token_env: str | None = None  # the variable holding the upstream's token
    headers: dict[str, str] = Field(default_factory=dict)  # values may name ${VARIABLES}
    connect_timeout_s: float = Field(10.0, gt=0)
    #: The most one HTTP reply of the server may hold (``transports.network.mcp_http_client``).
    max_reply_bytes: int = Field(64 * 1024 * 1024, gt=0, le=1024 * 1024 * 1024)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^/?#\s]+(/[^#\s]*)?", value):
            raise ValueError(f"not an http(s) URL without fragment: {value!r}")
        return value

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
                raise ValueError(f"not a header name: {name!r}")
        return value

    @field_validator("bearer_token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_RE.fullmatch(value):
            raise ValueError(f"not an environment variable name: {value!r}")
        return value


McpServerConfig = Annotated[StdioServer | RemoteServer, Field(discriminator="transport")]


def _server_names(
    value: dict[str, StdioServer | RemoteServer],
) -> dict[str, StdioServer | RemoteServer]:
    for name in value:
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"MCP server name {name!r} must match {_NAME_RE.pattern}")
    return value


#: The ``mcp_servers`` table: each name is served at ``/s/{session}/mcp/{name}``.
McpServers = Annotated[dict[str, McpServerConfig], AfterValidator(_server_names)]


class FetchConfig(_Model):
    """The ``/s/{session}/v1/fetch`` endpoint; off unless ``enabled``.

    ``allow`` and ``deny`` are IP networks (``"127.0.0.1/32"``, ``"fd00::/8"``; a bare address
    is its own network): ``allow`` opens addresses the fetch rule refuses by default (loopback,
    private, link-local …: ``egress_proxy.fetch_guard``), ``deny`` closes any, and wins.
    """

    enabled: bool = False
    max_response_bytes: int = Field(16 * 1024 * 1024, gt=0, le=256 * 1024 * 1024)
    timeout_s: float = Field(60.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    user_agent: str = Field("affidavit-proxy", min_length=1, pattern=r"[\x21-\x7e][\x20-\x7e]*")
    allow: tuple[IPvAnyNetwork, ...] = ()
    deny: tuple[IPvAnyNetwork, ...] = ()


_VARIABLE_RE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(text: str, env: Mapping[str, str], where: str) -> str:
    """``text`` with each ``${VAR}`` (or VS Code's ``${env:VAR}``) replaced by the variable's
    value in ``env``; an unset one fails naming ``where`` and the variable (never a value)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigMissing(f"{where}: environment variable {name} is not set")
        return env[name]

    return _VARIABLE_RE.sub(value, text)


def variables(text: str) -> list[str]:
    """The variables ``text`` names with ``${VAR}`` or ``${env:VAR}``."""
    return _VARIABLE_RE.findall(text)


def resolved(
    name: str, server: StdioServer | RemoteServer, env: Mapping[str, str]
) -> StdioServer | RemoteServer:
    """The server with every ``${VAR}`` in its args, env values and header values filled in
    from ``env`` (read once, at start); the config itself keeps only the names."""
    where = f"mcp_servers.{name}"
    if isinstance(server, StdioServer):
        args = tuple(expand(a, env, f"{where}.args") for a in server.args)
        values = {k: expand(v, env, f"{where}.env.{k}") for k, v in server.env.items()}
        return server.model_copy(update={"args": args, "env": values})
    headers = {k: expand(v, env, f"{where}.headers.{k}") for k, v in server.headers.items()}
    return server.model_copy(update={"headers": headers})


def bearer_tokens(
    servers: Mapping[str, StdioServer | RemoteServer], env: Mapping[str, str]
) -> dict[str, str | None]:
    """Each remote server's token, read once at start; a named variable that is unset fails."""
    tokens: dict[str, str | None] = {}
    for name, server in servers.items():
        variable = server.bearer_token_env if isinstance(server, RemoteServer) else None
        if variable is None:
            tokens[name] = None
            continue
        value = env.get(variable)
        if not value:
            raise ConfigMissing(
                f"mcp_servers.{name}.bearer_token_env: environment variable {variable} is not set"
            )
        tokens[name] = value
    return tokens
