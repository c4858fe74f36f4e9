"""What a client needs to connect to a session: its URLs and its token.

Any client can drive a session, not only the harness's own agent loop: the official SDKs,
an agent framework, an MCP client. ``affidavit session new`` prints this, as text, as JSON
(``--json``) or as shell lines to ``eval`` (``--env``: the variables the official SDKs
read, so ``eval "$(affidavit session new --env)"`` points them at the session). The token
is the session's bearer credential: it is printed to the person who opened the session and
never recorded. It outlives the appliance's process: after ``affidavit up`` restarts (even
after a SIGKILL) the proxy takes the same port and restores its sessions, so these URLs and
this token keep working.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

__all__ = ["Connection"]


@dataclass(frozen=True)
class Connection:
    """A session's addresses: the proxy's routes for it, and the token they all take."""

    session: str
    base_url: str  # …/s/{session}: the Anthropic SDK's base_url
    token: str
    model: str  # the model id the appliance serves (what a client's ``model`` must say)
    pins: dict[str, JsonValue] | None = None
    mcp_servers: tuple[str, ...] = field(default=())
    #: The same session at the appliance's external TLS address (``up --external``), for a
    #: client on another machine: it checks the appliance first (``affidavit connect``).
    external_base_url: str | None = None

    @classmethod
    def of(
        cls,
        session: str,
        base_url: str,
        token: str,
        model: str,
        pins: dict[str, JsonValue] | None,
        mcp_servers: Iterable[str] = (),
        proxy_url: str | None = None,
        external_url: str | None = None,
    ) -> Connection:
        """``external_url`` (with the ``proxy_url`` it stands for): the external address."""
        servers = tuple(sorted(mcp_servers))
        base = base_url.rstrip("/")
        outside = None
        if external_url and proxy_url and base.startswith(proxy_url.rstrip("/")):
            outside = external_url.rstrip("/") + base[len(proxy_url.rstrip("/")) :]
        return cls(session, base, token, model, pins, servers, outside)

    @property
    def openai_base_url(self) -> str:
        """The OpenAI SDK's base_url (Chat Completions, Responses, fetch)."""
        return self.base_url + "/v1"

    @property
    def mcp_url(self) -> str:
        """Each MCP server is at ``mcp_url + "/" + server`` (streamable HTTP)."""
        return self.base_url + "/mcp"

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "base_url": self.base_url,
            "openai_base_url": self.openai_base_url,
            "anthropic_base_url": self.base_url,
            "token": self.token,
            "model": self.model,
            "mcp_url": self.mcp_url,
            "mcp_servers": {name: f"{self.mcp_url}/{name}" for name in self.mcp_servers},
            "pins": self.pins,
            "external_base_url": self.external_base_url,
        }

    def text(self) -> list[str]:
        """The lines ``session new`` prints by default: the id first, then one per fact."""
        servers = ", ".join(self.mcp_servers) if self.mcp_servers else "none configured"
        pins = json.dumps(self.pins) if self.pins else "none (unpinned)"
        return [
            self.session,
            f"base_url {self.base_url}",
            f"openai   {self.openai_base_url}",
            f"token    {self.token}",
            f"model    {self.model}",
            f"mcp_url  {self.mcp_url}/SERVER  (servers: {servers})",
            f"pins     {pins}",
            *(
                [
                    f"outside  {self.external_base_url}  (TLS; check the appliance first: "
                    "affidavit connect URL --published FILE)"
                ]
                if self.external_base_url
                else []
            ),
        ]

    def env(self) -> list[str]:
        """``export`` lines for the variables the official SDKs read, quoted for the shell."""
        values = {
            "OPENAI_BASE_URL": self.openai_base_url,
            "OPENAI_API_KEY": self.token,
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": self.token,
            "AFFIDAVIT_SESSION": self.session,
            "AFFIDAVIT_MODEL": self.model,
            "AFFIDAVIT_MCP_URL": self.mcp_url,
        }
        return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
