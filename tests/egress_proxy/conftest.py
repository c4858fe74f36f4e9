"""Fixtures of the proxy's tests: one scripted upstream and one proxy per module, on loopback,
and the real embedded engine on the tiny model where a test needs the engine itself.

The helpers they use live in ``loopback.py``; tests import those from there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, Script, proxy_config


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One upstream and one proxy per test module; tests open their own sessions."""
    store_path = tmp_path_factory.mktemp("proxy") / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    with LoopbackServer(upstream) as up:
        proxy = ProxyServer(proxy_config(up.url), log, env=ENV)
        with proxy:
            yield Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
    log.close()


@pytest.fixture
def fresh(rig: Rig) -> Iterator[Rig]:
    """The module's rig with the upstream's script and memory reset."""
    rig.upstream.script = Script()
    rig.upstream.queue.clear()
    rig.upstream.received.clear()
    rig.upstream.on_request = None
    rig.upstream.errors.clear()
    yield rig
    assert not rig.upstream.errors, rig.upstream.errors


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real embedded engine on the shipped tiny model, on loopback."""
    pytest.importorskip("torch", reason="the engine test needs the `engine` extra")
    from inference.make_model import make_model
    from inference.server import Engine, create_app

    made = make_model(tmp_path_factory.mktemp("tiny") / "model")
    engine = Engine(made.path, model_name="tiny").start()
    try:
        with LoopbackServer(create_app(engine)) as server:
            yield server.url
    finally:
        engine.close()
