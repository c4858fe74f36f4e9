"""``affidavit up --mcp-config FILE`` and ``affidavit tools list``, as a user runs them.

A real ``affidavit up`` process (the tiny engine) is handed a Claude Desktop ``mcpServers``
file: our counter server (stdio, per session), ``mcp-server-time`` from PyPI (stdio), a
remote streamable-HTTP server on loopback that wants a header carrying a secret named as
``${VAR}``, and a server whose command does not exist. ``tools list`` shows each one, its
status and its tools; the broken one is named with its error, a ``tool.unavailable`` note is
recorded in the listing session, a turn still runs, and the secret is printed nowhere. A bad
file exits 2 naming the path of the fault; a missing file or an unset variable exits 3.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.up import _serve

REPO = Path(__file__).resolve().parents[2]
COUNTER = REPO / "tests" / "egress_proxy" / "_counter_server.py"
SECRET = "hdr-s3cret-7f1c"


def _cli(*args: str, home: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args, "--home", str(home)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _remote_app() -> Any:
    """A remote MCP server that lists its tool only to a caller with the right header."""
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp.shared.exceptions import MCPError

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        if ctx.request.headers.get("x-api-key") != SECRET:
            raise MCPError(types.INVALID_REQUEST, "wrong or missing x-api-key")
        return types.ListToolsResult(
            tools=[types.Tool(name="peek", input_schema={"type": "object"})]
        )

    server = Server("test-remote", on_list_tools=list_tools)
    return server.streamable_http_app(json_response=True, host="127.0.0.1")


def _config(tmp: Path, remote_url: str) -> Path:
    doc = {
        "mcpServers": {
            "counter": {"command": sys.executable, "args": [str(COUNTER)]},
            "time": {
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                "idempotent_tools": ["get_current_time"],
            },
            "remote": {"url": remote_url, "headers": {"X-Api-Key": "${TEST_MCP_SECRET}"}},
            "missing": {"command": "/nonexistent/no-such-mcp-server", "args": ["--serve"]},
        }
    }
    path = tmp / "mcp.json"
    path.write_text(json.dumps(doc))
    return path


def test_up_with_an_mcp_config_and_tools_list(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="`affidavit up` runs the embedded engine (`engine` extra)")
    from harness.session import read_bodies, user_key
    from harness.state import Home
    from record.schema import ToolUnavailable

    home = tmp_path / "home"
    env = {**os.environ, "TEST_MCP_SECRET": SECRET}
    with _serve(_remote_app()) as far:
        config = _config(tmp_path, far + "/mcp")
        command = ["up", "--model", "tiny", "--mcp-config", str(config), "--home", str(home)]
        up = subprocess.Popen(
            [sys.executable, "-m", "affidavit", *command],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 120
            while not (home / "appliance.json").is_file():
                assert up.poll() is None, up.stdout.read() if up.stdout else ""
                assert time.monotonic() < deadline, "affidavit up did not come up"
                time.sleep(0.1)
            listed = _cli("tools", "list", "--json", home=home)
            assert listed.returncode == 1, listed.stderr  # a server failed: a problem found
            doc = json.loads(listed.stdout)
            servers = {s["server"]: s for s in doc["servers"]}
            assert sorted(servers) == ["counter", "missing", "remote", "time"]
            assert servers["counter"] == {
                "server": "counter",
                "status": "ok",
                "tools": ["bump", "pid"],
                "error": None,
            }
            assert servers["remote"]["status"] == "ok"  # the header's ${VAR} was filled in
            assert servers["remote"]["tools"] == ["peek"]
            assert "get_current_time" in servers["time"]["tools"]
            missing = servers["missing"]
            assert missing["status"] == "failed" and missing["tools"] == []
            assert "MCP server 'missing'" in missing["error"]
            assert "/nonexistent/no-such-mcp-server" in missing["error"]

            store = Home(home).appliance().store
            bodies = read_bodies(store, doc["session"], user_key(Home(home)))
            notes = [b for _, b in bodies if isinstance(b, ToolUnavailable)]
            assert [n.server for n in notes] == ["missing"]

            table = _cli("tools", "list", "--session", doc["session"], home=home)
            assert table.returncode == 1
            lines = table.stdout.splitlines()
            assert lines[0].split() == ["SERVER", "STATUS", "TOOLS"]
            assert any(ln.split()[:3] == ["counter", "ok", "bump,"] for ln in lines)
            assert any(ln.split()[:2] == ["missing", "failed"] for ln in lines)

            opened = _cli("session", "new", "--json", home=home)
            assert opened.returncode == 0, opened.stderr
            session = json.loads(opened.stdout)["session"]
            turn = _cli("turn", session, "hello", "--json", home=home)
            assert turn.returncode == 0, turn.stdout + turn.stderr  # the broken one is left out
            turn_bodies = read_bodies(store, session, user_key(Home(home)))
            assert [b.server for _, b in turn_bodies if isinstance(b, ToolUnavailable)] == [
                "missing"
            ]
            rebuilt = _cli("replay", session, "0", "--reconstruct", "--json", home=home)
            assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr  # the note is no step
            assert json.loads(rebuilt.stdout)["ok"] is True
            everything = listed.stdout + listed.stderr + table.stdout + turn.stdout + turn.stderr
            assert SECRET not in everything
            assert SECRET not in (home / "appliance.json").read_text()
        finally:
            up.send_signal(signal.SIGTERM)
            out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert SECRET not in out


@pytest.mark.parametrize(
    ("doc", "code", "says"),
    [
        ({"mcpServers": {"git": {"command": "x", "shell": True}}}, 2, "mcpServers.git.shell"),
        ({"mcpServers": {"git": {"command": "x", "args": [1]}}}, 2, "mcpServers.git.args.0"),
        ({"servers": {"r": {"type": "sse", "url": "http://x"}}}, 2, "servers.r.type"),
        (
            {"mcpServers": {"r": {"url": "http://x/mcp", "headers": {"A": "${UNSET_MCP_VAR}"}}}},
            3,
            "mcpServers.r.headers.A: UNSET_MCP_VAR",
        ),
    ],
)
def test_up_refuses_a_bad_mcp_config_before_starting(
    tmp_path: Path, doc: dict[str, Any], code: int, says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != "UNSET_MCP_VAR"}
    done = _cli("up", "--model", "tiny", "--mcp-config", str(path), home=tmp_path / "h", env=env)
    assert done.returncode == code, done.stdout + done.stderr
    assert says in done.stderr and str(path) in done.stderr
    assert not (tmp_path / "h" / "appliance.json").exists()


def test_up_with_no_such_mcp_config_and_tools_list_with_no_appliance(tmp_path: Path) -> None:
    done = _cli("up", "--mcp-config", str(tmp_path / "nope.json"), home=tmp_path / "h")
    assert done.returncode == 3 and "nope.json does not exist" in done.stderr
    listed = _cli("tools", "list", home=tmp_path / "h")
    assert listed.returncode == 3 and "no appliance is running" in listed.stderr
