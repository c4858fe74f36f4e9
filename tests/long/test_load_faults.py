"""Load with faults (``make test-long``): 64 sessions × 50 calls, half of them streamed,
through a proxy in a process of its own to a fast loopback upstream, while the proxy is
SIGKILLed and started again three times on the same port; once over a SQLite file and once
over a PostgreSQL database (the run's private cluster, ``tests.pg_server``).

Each client keeps its session's base URL and token across the kills (the session book brings
the sessions back) and retries a call until one is acknowledged: a whole reply carrying the
proxy's annotation. Afterwards, read with the user's key:

- every acknowledged call has exactly one request entry and one reply entry, the ones its
  annotation names, ``COMMITTED``;
- every request entry of every stream has exactly one answer (``COMMITTED``, ``FAILED`` or
  ``UNKNOWN``: those the kills interrupted are answered ``UNKNOWN`` by recovery);
- no stream has a gap, and ``affidavit log verify --key`` is clean.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from record.schema import ModelRequest, ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import LoopbackServer, read_bodies, request_body, split_annotation
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)

pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
SESSIONS, CALLS, KILLS = 64, 50, 3


async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A fast provider: a chat completion, or its stream when the request asks for one."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = await request_body(receive)
    streamed = json.loads(body).get("stream") is True
    if streamed:
        chunks = [
            b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
            b'"delta":{"content":"ok"}}]}\n\n',
            b"data: [DONE]\n\n",
        ]
        kind = b"text/event-stream"
    else:
        chunks = [
            b'{"id":"c","object":"chat.completion","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
        ]
        kind = b"application/json"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@dataclass
class Proxy:
    """The proxy process: started, killed and started again on one port."""

    argv: list[str]
    process: subprocess.Popen[str] | None = None
    restored: list[int] = field(default_factory=list)

    def start(self, first: list[str] = ()) -> Any:  # type: ignore[assignment]
        self.process = subprocess.Popen(
            self.argv + list(first), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        opened = json.loads(self.process.stdout.readline()) if first else None
        ready = json.loads(self.process.stdout.readline())
        self.restored.append(ready["ready"])
        return opened

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(60)


@dataclass
class Tally:
    acknowledged: list[tuple[str, int, int]] = field(default_factory=list)  # stream, req, reply
    retries: int = 0
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def annotation_of(reply: httpx.Response, streamed: bool) -> dict[str, Any] | None:
    if reply.status_code != 200:
        return None
    try:
        if streamed:
            return split_annotation(reply.content)[1]
        note = reply.json().get("affidavit")
    except (AssertionError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def client(session: dict[str, str], tally: Tally) -> None:
    headers = {"authorization": f"Bearer {session['token']}"}
    url = session["base_url"] + "/v1/chat/completions"
    with httpx.Client(timeout=30) as http:
        for index in range(CALLS):
            streamed = index % 2 == 0
            body = {"model": "m", "stream": streamed,
                    "messages": [{"role": "user", "content": f"call {index}"}]}  # fmt: skip
            for _ in range(600):
                try:
                    note = annotation_of(http.post(url, json=body, headers=headers), streamed)
                except httpx.HTTPError:
                    note = None
                if note is not None and note["outcome"] == "COMMITTED":
                    with tally.lock:
                        tally.acknowledged.append(
                            (note["stream"], note["request_seq"], note["seq"])
                        )
                    break
                with tally.lock:
                    tally.retries += 1
                time.sleep(0.05)
            else:
                with tally.lock:
                    tally.problems.append(
                        f"{session['session_id']} call {index}: never acknowledged"
                    )
                return


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def provider() -> Iterator[str]:
    with LoopbackServer(upstream) as server:
        yield server.url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where the record goes: a SQLite file, or a fresh database of the run's cluster."""
    if request.param == "sqlite":
        yield str(tmp_path / "record.db")
        return
    server = request.getfixturevalue("postgres_server")
    url: str = server.fresh_database()
    yield url
    server.drop_database(url)


@pytest.mark.timeout(900)
def test_every_acknowledged_call_is_recorded_once_through_three_kills(
    tmp_path: Path, provider: str, store: str
) -> None:
    appliance, user = KeyPair.generate(), KeyPair.generate()
    appliance.write(tmp_path / "appliance.pem")
    proxy = Proxy(
        [sys.executable, "-m", "tests.long._load_proxy", store,
         str(tmp_path / "appliance.pem"), provider, str(free_port()),
         str(tmp_path / "sessions.db")]
    )  # fmt: skip
    tally = Tally()
    try:
        sessions = proxy.start([user.recipient.text(), str(SESSIONS)])
        threads = [threading.Thread(target=client, args=(s, tally)) for s in sessions]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        total = SESSIONS * CALLS
        kills_at = [total * (k + 1) // (KILLS + 1) for k in range(KILLS)]
        landed: list[int] = []
        for at in kills_at:
            while len(tally.acknowledged) < at and any(t.is_alive() for t in threads):
                time.sleep(0.01)
            landed.append(len(tally.acknowledged))
            proxy.kill()
            proxy.start()
        for thread in threads:
            thread.join(600)
        elapsed = time.monotonic() - started
    finally:
        proxy.stop()
    print(
        f"{len(tally.acknowledged)} calls acknowledged in {elapsed:.0f} s, {tally.retries} "
        f"retries; kills after {landed} acknowledgements; sessions restored {proxy.restored[1:]}"
    )
    assert not tally.problems, tally.problems[:5]
    assert len(tally.acknowledged) == SESSIONS * CALLS
    assert proxy.restored == [0] + [SESSIONS] * KILLS

    key_file = tmp_path / "user.pem"
    user.write(key_file)
    verified = subprocess.run(
        [sys.executable, "-m", "affidavit", "log", "verify", store,
         "--key", str(key_file)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]

    acknowledged = Counter(tally.acknowledged)
    assert max(acknowledged.values()) == 1  # no annotation names one reply twice
    outcomes: Counter[str] = Counter()
    for session in sessions:
        stream = session["session_id"]
        bodies = read_bodies(store, stream, user)
        assert sorted(bodies) == list(range(len(bodies))), f"{stream}: a gap"
        requests = {seq for seq, (_, body) in bodies.items() if isinstance(body, ModelRequest)}
        answers = Counter(
            body.request_seq for _, body in bodies.values() if isinstance(body, ModelResponse)
        )
        outcomes.update(b.outcome for _, b in bodies.values() if isinstance(b, ModelResponse))
        assert set(answers) == requests, f"{stream}: requests without answers, or the reverse"
        assert max(answers.values()) == 1, f"{stream}: a request answered twice"
        mine = [(r, s) for st, r, s in tally.acknowledged if st == stream]
        assert len(mine) == CALLS
        for request_seq, seq in mine:
            reply = bodies[seq][1]
            assert isinstance(bodies[request_seq][1], ModelRequest)
            assert isinstance(reply, ModelResponse) and reply.request_seq == request_seq
            assert reply.outcome == "COMMITTED"
    print(f"answers by outcome: {dict(outcomes)}")
