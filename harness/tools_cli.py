"""``affidavit tools list``: each MCP server of the running appliance, its status and its tools.

It asks the proxy, as a session does: every server is listed through the proxy's route
``/s/{session}/mcp/{server}`` with the official SDK, so what it shows is what a session's
agent gets. A server that cannot start or list its tools shows ``failed`` with the proxy's
words, and the session's stream records a ``tool.unavailable`` entry for it. Without
``--session`` a session is opened for the listing (labelled ``purpose=tools-list``).

Exit codes: 0 every server listed its tools, 1 a server failed, 2 usage error, 3 no running
appliance (or no such session).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["ServerStatus", "register", "server_statuses"]


@dataclass
class ServerStatus:
    server: str
    status: str  # "ok" or "failed"
    tools: list[str] = field(default_factory=list)
    error: str | None = None


def server_statuses(home: Any, session_id: str | None = None) -> tuple[str, list[ServerStatus]]:
    """The session used and each configured server's status, in name order."""
    from harness.session import open_session
    from harness.tools import ProxyToolbox, ToolCallFailed

    appliance = home.appliance()
    if session_id is None:
        state = open_session(home, None, labels={"purpose": "tools-list"})
    else:
        state = home.session(session_id)
    toolbox = ProxyToolbox(state.base_url, state.token)
    statuses = []
    try:
        for server in sorted(appliance.mcp_servers):
            try:
                tools = toolbox.list_tools(server)
            except ToolCallFailed as exc:
                statuses.append(ServerStatus(server, "failed", error=str(exc)))
                continue
            statuses.append(ServerStatus(server, "ok", sorted(t.name for t in tools)))
    finally:
        toolbox.close()
    return state.session_id, statuses


def _table(session_id: str, statuses: list[ServerStatus]) -> str:
    if not statuses:
        return "no MCP servers are configured (affidavit up --mcp-config FILE)"
    width = max(6, *(len(s.server) for s in statuses))
    lines = [f"{'SERVER':<{width}}  STATUS  TOOLS"]
    for s in statuses:
        what = ", ".join(s.tools) if s.status == "ok" else (s.error or "")
        lines.append(f"{s.server:<{width}}  {s.status:<6}  {what}")
    lines.append(f"(listed in session {session_id})")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``tools list`` to ``app``."""
    tools_app = typer.Typer(help="MCP tool servers: list them", no_args_is_help=True)
    app.add_typer(tools_app, name="tools")

    @tools_app.command("list")
    def tools_list(
        session: Annotated[
            str | None,
            typer.Option(
                "--session", help="list as this session sees them (default: a new session)"
            ),
        ] = None,
        home: Annotated[
            Path | None,
            typer.Option(
                "--home", help="the state folder (default: $AFFIDAVIT_HOME or ./.affidavit)"
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    ) -> None:
        """Show each MCP server, its status (ok or failed, with the error) and its tools."""
        import sys

        import grpc

        from harness.state import Home, HomeMissing

        try:
            session_id, statuses = server_statuses(Home.at(home), session)
        except (HomeMissing, FileNotFoundError, grpc.RpcError) as exc:
            print(f"affidavit: missing: {exc}", file=sys.stderr, flush=True)
            raise typer.Exit(3) from None
        if as_json:
            doc = {"session": session_id, "servers": [asdict(s) for s in statuses]}
            print(json.dumps(doc, indent=2))
        else:
            print(_table(session_id, statuses))
        raise typer.Exit(1 if any(s.status != "ok" for s in statuses) else 0)
