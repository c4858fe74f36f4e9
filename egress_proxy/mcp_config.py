"""MCP servers written the way MCP clients already write them: the ``mcpServers`` JSON of
Claude Desktop and Cursor, or VS Code's ``servers`` (with ``"type": "stdio"|"http"``).

::

    {"mcpServers": {
        "git":    {"command": "uvx", "args": ["mcp-server-git"], "env": {"TOKEN": "${GIT_TOKEN}"}},
        "search": {"url": "https://mcp.example.com/mcp",
                   "headers": {"Authorization": "Bearer ${SEARCH_KEY}"}}}}

A stdio server takes ``command``, ``args``, ``env`` and ``cwd``; a remote (streamable-HTTP)
server takes ``url`` and ``headers``. ``type`` is optional (``stdio``, or ``http`` /
``streamable-http`` / ``streamableHttp`` for a remote one); ``sse`` is refused. A server with
``"disabled": true`` is left out. Affidavit's own knobs sit beside them as extra members:
``shared``, ``network``, ``idle_timeout_s``, ``idempotent_tools``, ``timeout_s``,
``connect_timeout_s``, ``bearer_token_env``. ``autoApprove`` and ``alwaysAllow`` (other
clients' approval lists) are accepted and have no effect: the proxy admits a tool call only
as a committed model reply asked for it. Any other member is refused, naming its path.

Secrets are named, never written: ``${VAR}`` (or VS Code's ``${env:VAR}``) in ``args``,
``env`` values or ``headers`` values is filled in by the proxy from its environment at start
(``tool_config.resolved``); :func:`missing_variables` lets a command fail early, naming each
variable that is not set.

:func:`to_proxy_servers` turns the document into the proxy config's ``mcp_servers`` table
(``tool_config``), which then validates every value. This module never spawns or dials.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from egress_proxy.errors import ConfigError, ConfigMissing
from egress_proxy.tool_config import McpServers, RemoteServer, StdioServer, variables

__all__ = ["load_mcp_config", "missing_variables", "parse_mcp_config", "to_proxy_servers"]

_STDIO = frozenset({"command", "args", "env", "cwd"})
_REMOTE = frozenset({"url", "headers", "bearer_token_env", "connect_timeout_s"})
_OURS = frozenset({"idempotent_tools", "timeout_s"})
_OURS_STDIO = frozenset({"shared", "network", "idle_timeout_s"})
_IGNORED = frozenset({"type", "disabled", "autoApprove", "alwaysAllow"})
_REMOTE_TYPES = frozenset({"http", "streamable-http", "streamableHttp", "streamable_http"})
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_VARIABLE = re.compile(r"(?:env:)?[A-Za-z_][A-Za-z0-9_]*")
_ADAPTER: TypeAdapter[dict[str, StdioServer | RemoteServer]] = TypeAdapter(McpServers)


def to_proxy_servers(document: Mapping[str, Any], source: str = "mcp config") -> dict[str, Any]:
    """The ``mcp_servers`` table for the proxy config; ``ConfigError`` names the path of a
    fault (``source``: the file, for the message)."""
    tables = [key for key in ("mcpServers", "servers") if key in document]
    if not tables:
        raise ConfigError(f"{source}: no 'mcpServers' (or VS Code's 'servers') object")
    out: dict[str, Any] = {}
    table_of: dict[str, str] = {}
    for key in tables:
        table = document[key]
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: {key}: must be an object of servers by name")
        for name, entry in table.items():
            where = f"{key}.{name}"
            if name in out:
                raise ConfigError(f"{source}: {where}: the name is used twice")
            server = _server(entry, f"{source}: {where}")
            if server is not None:
                out[name], table_of[name] = server, key
    try:
        _ADAPTER.validate_python(out)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_faults(exc, table_of))) from None
    return out


def _faults(exc: ValidationError, table_of: Mapping[str, str]) -> list[str]:
    """Each fault at the path the user wrote: ``mcpServers.git.args.0``, not the proxy
    table's (which adds the transport's tag)."""
    faults = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        if len(loc) > 1 and loc[1] in ("stdio", "streamable_http"):
            del loc[1]
        if loc and loc[0] in table_of:
            loc.insert(0, table_of[loc[0]])
        faults.append(f"{'.'.join(loc) or '/'.join(sorted(set(table_of.values())))}: {err['msg']}")
    return faults


def _server(entry: object, where: str) -> dict[str, Any] | None:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be an object")
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type")
    if kind == "sse":
        raise ConfigError(f"{where}.type: 'sse' servers are not served; use streamable HTTP")
    remote = "url" in entry or kind in _REMOTE_TYPES
    if kind not in (None, "stdio", *_REMOTE_TYPES) or (kind == "stdio" and "url" in entry):
        raise ConfigError(f"{where}.type: {kind!r} is not 'stdio' or 'http'")
    allowed = (_REMOTE if remote else _STDIO | _OURS_STDIO) | _OURS | _IGNORED
    for member in entry:
        if member not in allowed:
            what = "a remote server (url)" if remote else "a stdio server (command)"
            raise ConfigError(f"{where}.{member}: not a member of {what}")
    if remote and "url" not in entry:
        raise ConfigError(f"{where}.url: a remote server needs its url")
    if not remote and "command" not in entry:
        raise ConfigError(f"{where}.command: a stdio server needs its command (or a url)")
    for member in ("args", "env", "headers"):
        _check_placeholders(entry.get(member), f"{where}.{member}")
    server = {k: v for k, v in entry.items() if k not in _IGNORED}
    server["transport"] = "streamable_http" if remote else "stdio"
    return server


def _check_placeholders(value: object, where: str) -> None:
    texts: list[tuple[str, object]] = []
    if isinstance(value, list):
        texts = [(f"{where}.{i}", v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        texts = [(f"{where}.{k}", v) for k, v in value.items()]
    for path, text in texts:
        if not isinstance(text, str):
            continue
        for inner in _PLACEHOLDER.findall(text):
            if not _VARIABLE.fullmatch(inner):
                raise ConfigError(
                    f"{path}: ${{{inner}}} is not an environment variable; "
                    "name a secret as ${VAR} or ${env:VAR}"
                )


def missing_variables(servers: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``mcp_servers.NAME.MEMBER: VAR`` for each ``${VAR}`` (and ``bearer_token_env``) that
    ``env`` does not set, in order."""
    missing = []
    for name, server in servers.items():
        places: list[tuple[str, str]] = []
        for member in ("args", "env", "headers"):
            value = server.get(member) or ()
            items = value.items() if isinstance(value, dict) else enumerate(value)
            places += [(f"{member}.{k}", v) for k, v in items if isinstance(v, str)]
        for path, text in places:
            missing += [f"{name}.{path}: {v}" for v in variables(text) if v not in env]
        token = server.get("bearer_token_env")
        if isinstance(token, str) and not env.get(token):
            missing.append(f"{name}.bearer_token_env: {token}")
    return missing


def parse_mcp_config(text: str | bytes, source: str = "mcp config") -> dict[str, Any]:
    """A JSON document's servers as the proxy's ``mcp_servers`` table."""
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be an object")
    return to_proxy_servers(document, source)


def load_mcp_config(path: Path | str) -> dict[str, Any]:
    """Read ``path`` (``ConfigMissing`` if it is not there) and :func:`parse_mcp_config` it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigMissing(f"MCP config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigMissing(f"MCP config file {path} cannot be read: {exc}") from None
    return parse_mcp_config(raw, str(path))
