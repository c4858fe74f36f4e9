"""egress_proxy.mcp_config: MCP servers as Claude Desktop, Cursor and VS Code write them.

Both key styles (``mcpServers``; VS Code's ``servers`` with ``type``) become the proxy's
``mcp_servers`` table; affidavit's knobs sit beside the standard members; a fault names its
path; ``${VAR}`` / ``${env:VAR}`` name secrets, filled in by the proxy from its environment
at start and never kept in the config; an unset one is named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from egress_proxy.config import parse_config
from egress_proxy.errors import ConfigError, ConfigMissing
from egress_proxy.mcp_config import (
    load_mcp_config,
    missing_variables,
    parse_mcp_config,
    to_proxy_servers,
)
from egress_proxy.tool_config import RemoteServer, StdioServer, resolved

CLAUDE = {
    "mcpServers": {
        "git": {
            "command": "uvx",
            "args": ["mcp-server-git", "--repository", "${REPO}"],
            "env": {"GIT_TOKEN": "${GIT_TOKEN}", "PLAIN": "x"},
        },
        "search": {
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer ${SEARCH_KEY}"},
        },
    },
    "globalShortcut": "Ctrl+Space",  # other members of a client's file are left alone
}

VSCODE = {
    "inputs": [],
    "servers": {
        "time": {"type": "stdio", "command": "mcp-server-time", "args": []},
        "far": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "${env:K}"}},
        "off": {"type": "stdio", "command": "x", "disabled": True},
    },
}


def test_claude_desktop_format_becomes_the_proxy_table() -> None:
    servers = to_proxy_servers(CLAUDE)
    assert servers["git"] == {
        "transport": "stdio",
        "command": "uvx",
        "args": ["mcp-server-git", "--repository", "${REPO}"],
        "env": {"GIT_TOKEN": "${GIT_TOKEN}", "PLAIN": "x"},
    }
    assert servers["search"] == {
        "transport": "streamable_http",
        "url": "https://mcp.example.com/mcp",
        "headers": {"Authorization": "Bearer ${SEARCH_KEY}"},
    }


def test_vscode_servers_with_type_are_taken_and_disabled_ones_left_out() -> None:
    servers = to_proxy_servers(VSCODE)
    assert sorted(servers) == ["far", "time"]
    assert servers["time"]["transport"] == "stdio"
    assert servers["far"]["transport"] == "streamable_http"
    assert "type" not in servers["far"]


def test_affidavit_knobs_sit_beside_the_standard_members() -> None:
    doc = {
        "mcpServers": {
            "ledger": {
                "command": sys.executable,
                "shared": True,
                "network": "host",
                "idle_timeout_s": 30,
                "idempotent_tools": ["count"],
                "timeout_s": 12,
                "autoApprove": ["count"],  # another client's list: accepted, no effect
            }
        }
    }
    config = parse_config(_proxy(to_proxy_servers(doc)))
    ledger = config.mcp_servers["ledger"]
    assert isinstance(ledger, StdioServer)
    assert (ledger.shared, ledger.network, ledger.idle_timeout_s) == (True, "host", 30)
    assert ledger.idempotent_tools == ("count",) and ledger.timeout_s == 12


def test_the_proxy_config_file_takes_mcp_servers_as_clients_write_them() -> None:
    providers = {"providers": _proxy({})["providers"]}
    config = parse_config({**providers, "mcpServers": CLAUDE["mcpServers"]})
    assert isinstance(config.mcp_servers["git"], StdioServer)
    assert isinstance(config.mcp_servers["search"], RemoteServer)
    with pytest.raises(ConfigError, match="mcpServers and mcp_servers"):
        parse_config({**_proxy({"a": {"transport": "stdio", "command": "x"}}), "mcpServers": {}})
    with pytest.raises(ConfigError, match=r"mcpServers\.git\.shell"):
        parse_config({**providers, "mcpServers": {"git": {"command": "x", "shell": True}}})


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({}, "no 'mcpServers'"),
        ({"mcpServers": []}, "mcpServers: must be an object"),
        ({"mcpServers": {"a": "cmd"}}, "mcpServers.a: must be an object"),
        ({"mcpServers": {"a": {"args": ["x"]}}}, "mcpServers.a.command"),
        ({"mcpServers": {"a": {"command": "x", "shell": True}}}, "mcpServers.a.shell"),
        ({"mcpServers": {"a": {"url": "http://x/mcp", "args": []}}}, "mcpServers.a.args"),
        ({"mcpServers": {"a": {"url": "http://x", "type": "sse"}}}, "mcpServers.a.type"),
        ({"servers": {"a": {"type": "pipe", "command": "x"}}}, "servers.a.type"),
        ({"mcpServers": {"a": {"command": "x", "args": "-v"}}}, "mcpServers.a.args:"),
        ({"servers": {"a": {"command": "x", "args": [1]}}}, "servers.a.args.0:"),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": "${input:k}"}}}}, "a.env.K"),
        ({"mcpServers": {"Bad Name": {"command": "x"}}}, "must match"),
        ({"mcpServers": {"a": {"command": "x", "network": "lan"}}}, "mcpServers.a.network:"),
        ({"mcpServers": {"a": {"command": "x"}}, "servers": {"a": {"command": "y"}}}, "twice"),
    ],
)
def test_a_fault_names_its_path(doc: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("$", r"\$")) as err:
        to_proxy_servers(doc, "f.json")
    assert not isinstance(err.value, ConfigMissing)
    assert str(err.value).startswith("f.json")


def test_variables_are_named_never_filled_into_the_table() -> None:
    servers = to_proxy_servers(CLAUDE)
    assert missing_variables(servers, {"REPO": "/r"}) == [
        "git.env.GIT_TOKEN: GIT_TOKEN",
        "search.headers.Authorization: SEARCH_KEY",
    ]
    env = {"REPO": "/r", "GIT_TOKEN": "s3cret", "SEARCH_KEY": "k3y"}
    assert missing_variables(servers, env) == []
    assert "s3cret" not in json.dumps(servers)
    config = parse_config(_proxy(servers))
    git = resolved("git", config.mcp_servers["git"], env)
    search = resolved("search", config.mcp_servers["search"], env)
    assert isinstance(git, StdioServer) and isinstance(search, RemoteServer)
    assert git.args == ("mcp-server-git", "--repository", "/r")
    assert git.env == {"GIT_TOKEN": "s3cret", "PLAIN": "x"}
    assert search.headers == {"Authorization": "Bearer k3y"}
    assert "s3cret" not in config.model_dump_json()  # the config keeps only the names
    with pytest.raises(ConfigMissing, match=r"mcp_servers\.git\.env\.GIT_TOKEN: .*GIT_TOKEN"):
        resolved("git", config.mcp_servers["git"], {"REPO": "/r"})


def test_vscode_env_variables_are_filled_in_too() -> None:
    config = parse_config(_proxy(to_proxy_servers(VSCODE)))
    far = resolved("far", config.mcp_servers["far"], {"K": "v"})
    assert isinstance(far, RemoteServer) and far.headers == {"X-Key": "v"}


def test_files_missing_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigMissing, match="does not exist"):
        load_mcp_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match=r"bad\.json: not valid JSON"):
        load_mcp_config(bad)
    with pytest.raises(ConfigError, match="top level"):
        parse_mcp_config("[]")


def _proxy(servers: dict[str, Any]) -> dict[str, Any]:
    return {
        "providers": {"m": {"api": "openai", "base_url": "http://127.0.0.1:1"}},
        "mcp_servers": servers,
    }
