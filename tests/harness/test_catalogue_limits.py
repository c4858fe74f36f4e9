"""The harness's catalogue from hostile ``tools/list`` answers (found by an adversarial
review): a tool name the model APIs refuse (control characters, 10,000 characters) or a
megabyte schema went into every model request of the session, and a server listing 100,000
tools made each request too large for the proxy, so one bad server broke every turn.

Real MCP server processes behind the real proxy route, the harness's own toolbox: the bad
tools are left out with their reasons (``left_out``), a server whose listing would take the
catalogue past ``MAX_TOOLS`` is left out whole (``unavailable``), every other tool stays,
and a model request carrying that catalogue goes through the proxy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from egress_proxy.server import ProxyServer
from harness.tools import ProxyToolbox
from record.limits import MAX_TOOLS
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, Script, proxy_config

LISTER = Path(__file__).with_name("_hostile_lister_server.py")


def _server(listing: str) -> dict[str, object]:
    command = {"command": sys.executable, "args": [str(LISTER)]}
    return {"transport": "stdio", **command, "env": {"LISTING": listing}}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("catalogue")
    servers = {"odd": _server("odd"), "many": _server("many")}
    appliance, model = KeyPair.generate(), FakeUpstream()
    log = Log.open(tmp / "record.db", appliance_key=appliance)
    with (
        LoopbackServer(model) as up,
        ProxyServer(proxy_config(up.url, mcp_servers=servers), log, env=ENV) as proxy,
    ):
        yield Rig(model, up.url, proxy, log, tmp / "record.db", KeyPair.generate(), appliance)
    log.close()


def test_hostile_listings_leave_out_their_tools_and_the_session_goes_on(rig: Rig) -> None:
    session = rig.open_session()
    box = ProxyToolbox(session.base_url, session.token)
    try:
        specs = box.catalogue({"odd": [], "many": []})
    finally:
        box.close()
    names = [spec.name for spec in specs]
    assert "odd__fine" in names
    assert not any(name.startswith("many__") for name in names)
    assert "many" in box.unavailable and str(MAX_TOOLS) in box.unavailable["many"]
    reasons = box.left_out
    assert len(reasons) == 3, reasons
    assert "its input schema is" in reasons["odd__huge"]
    assert sum("its name is not" in why for why in reasons.values()) == 2

    rig.upstream.script = Script(chunks=[b'{"choices":[{"message":{"content":"hi"}}]}'])
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    tools = [spec.function() for spec in specs]
    reply = client.chat.completions.create(model="m", messages=[], tools=tools)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "hi"
