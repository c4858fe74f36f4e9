"""Bounded memory and time for a model reply: ``max_reply_bytes`` and ``timeout_s``.

- A 150 MiB reply through a proxy in a process of its own, with ``max_reply_bytes`` set to
  16 MiB: the reply is cut at the limit and recorded (``UNKNOWN``) with exactly what arrived
  before it, and the proxy's peak RSS stays at or below its baseline + k × limit + C, the
  bound ``docs/proxy.md`` §limits states (k = 6, C = 64 MiB).
- ``timeout_s`` is the whole reply's deadline: an upstream that drips an event every 0.2 s,
  each well inside any per-read timeout, is cut at the deadline and recorded with what came.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from egress_proxy.server import ProxyServer
from record.log import Log
from record.schema import ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Script,
    proxy_config,
    read_bodies,
)

MIB = 1024 * 1024
LIMIT = 16 * MIB
#: The bound docs/proxy.md states: peak RSS <= baseline + K * max_reply_bytes + C.
K, C = 6, 64 * MIB
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def peak_rss(pid: int) -> int:
    """The process's high-water resident set size, in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with LoopbackServer(fake) as server:
        yield fake, server.url


def test_a_reply_past_max_reply_bytes_is_cut_and_memory_stays_bounded(
    tmp_path: Path, upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = upstream
    event = b"data: " + b'{"x":"' + b"a" * (64 * 1024 - 16) + b'"}\n\n'
    total = 150 * MIB
    small = Script(chunks=[b"data: {}\n\n", b"data: [DONE]\n\n"], content_type="text/event-stream")
    huge = Script(chunks=[event] * (total // len(event)), content_type="text/event-stream")
    fake.queue[:] = [small, huge]
    user = KeyPair.generate()
    store = tmp_path / "record.db"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tests.egress_proxy._limited_proxy", str(store),
         user.recipient.text(), url, json.dumps({"max_reply_bytes": LIMIT})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proxy.stdout is not None
        opened = json.loads(proxy.stdout.readline())
        headers = {"authorization": f"Bearer {opened['token']}"}
        endpoint = opened["base_url"] + "/v1/chat/completions"
        assert httpx.post(endpoint, json=CHAT, headers=headers, timeout=60).status_code == 200
        baseline = peak_rss(proxy.pid)
        delivered = 0
        with (
            pytest.raises(httpx.RemoteProtocolError),  # the client's stream is cut, too
            httpx.stream("POST", endpoint, json=CHAT, headers=headers, timeout=120) as r,
        ):
            for chunk in r.iter_raw():
                delivered += len(chunk)
        peak = peak_rss(proxy.pid)
        print(f"baseline {baseline / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB, "
              f"limit {LIMIT / MIB:.0f} MiB: k so far {(peak - baseline) / LIMIT:.2f}")  # fmt: skip
        assert peak <= baseline + K * LIMIT + C
        assert delivered <= LIMIT
    finally:
        assert proxy.stdin is not None
        proxy.stdin.close()
        proxy.wait(60)
    bodies = read_bodies(store, opened["session_id"], user)
    answer = [b for _, b in bodies.values() if isinstance(b, ModelResponse)][-1]
    assert answer.outcome == "UNKNOWN"
    assert answer.response_bytes is not None and len(answer.response_bytes) == LIMIT
    whole = event * (LIMIT // len(event) + 1)
    assert answer.response_bytes == whole[:LIMIT]  # exactly what arrived, to the limit


def test_timeout_s_is_the_whole_replys_deadline(
    tmp_path: Path, upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = upstream
    drip = [f'data: {{"n":{i}}}\n\n'.encode() for i in range(40)] + [b"data: [DONE]\n\n"]
    fake.script = Script(chunks=drip, content_type="text/event-stream", delay_s=0.2)
    config = proxy_config(url)
    providers = {
        name: p.model_copy(update={"timeout_s": 1.5}) for name, p in config.providers.items()
    }
    config = config.model_copy(update={"providers": providers})
    user = KeyPair.generate()
    got = bytearray()
    with (
        Log.open(tmp_path / "record.db", appliance_key=KeyPair.generate()) as log,
        ProxyServer(config, log, env=ENV) as proxy,
    ):
        opened = proxy.registry.open_session([user.recipient])
        url = opened.openai_base_url + "/chat/completions"
        headers = {"authorization": f"Bearer {opened.token}"}
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", url, json=CHAT, headers=headers, timeout=30) as reply,
        ):
            for chunk in reply.iter_raw():
                got += chunk
    bodies = read_bodies(tmp_path / "record.db", opened.session_id, user)
    answer = [b for _, b in bodies.values() if isinstance(b, ModelResponse)][-1]
    assert answer.outcome == "UNKNOWN"
    assert answer.response_bytes is not None
    kept = answer.response_bytes.count(b"data: ")
    assert 0 < kept < len(drip)  # cut before its end, with what had come
    assert answer.response_bytes == b"".join(drip[:kept])
    assert b"[DONE]" not in got
