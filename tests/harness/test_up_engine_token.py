"""``affidavit up`` (``harness.up.running_appliance``) hands its engine a token of this run.

The real engine on the tiny model and the real proxy, in this process, as ``affidavit up``
starts them: the engine answers a call through the proxy (which holds the token, in a 0600
file in the state folder) and refuses the same call made to it directly; the file is gone
once the appliance stops.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness.state import Home
from harness.up import TINY_MODEL, running_appliance
from record.seal import KeyPair

pytest.importorskip("torch", reason="the engine needs the `engine` extra")


def test_the_engine_answers_the_proxy_and_no_one_else(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    with running_appliance(home, engine=TINY_MODEL) as up:
        a = up.appliance
        assert a.engine_url is not None
        token_file = home.root / "engine.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        body = {"model": a.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        direct = httpx.post(a.engine_url + "/v1/chat/completions", json=body, timeout=60)
        opened = up.proxy.registry.open_session([KeyPair.generate().recipient])
        proxied = httpx.post(
            f"{opened.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {opened.token}"},
            json=body,
            timeout=60,
        )
        token = token_file.read_text().strip()
        keyed = httpx.get(a.engine_url + "/v1/models", headers={"x-api-key": token})
    assert direct.status_code == 401, direct.text
    assert proxied.status_code == 200, proxied.text
    assert keyed.status_code == 200
    assert not token_file.exists()
