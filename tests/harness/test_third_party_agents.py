"""Proof with third-party agents (#15 line 8): agent frameworks from PyPI that Affidavit does
not otherwise depend on (the `frameworks` extra), each run as its own process against a
pinned session, exactly as a user would: the OpenAI Agents SDK with its default Responses
model and with its Chat Completions model, and Pydantic AI. The scripts are in
``tests/harness/frameworks/``; they take the session from the variables
``affidavit session new --env`` prints.

Each run has instructions and streams; it reaches the session's ``ledger`` MCP server (a
side effect: ``append_note`` adds a line to a file) through the session's MCP URL, forced
on its first step, and has a local function tool with an optional parameter whose calls are
counted; tracing is off and ``strace`` shows that the process connected to nothing but the
proxy. Then, for each run: every recorded call is ``COMMITTED``, ``log verify --key`` is
clean, ``replay --calls --reconstruct`` matches, and a ``--replay-of`` session re-runs the
same script with no live MCP call (the ledger does not grow) and the same final answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

from affidavit.cli import main
from record.schema import ModelResponse, ToolCall, ToolResult
from record.seal import KeyPair
from tests.harness.rig import HarnessRig, harness_rig

for _module in ("agents", "pydantic_ai"):
    pytest.importorskip(_module, reason="the agent frameworks come with the `frameworks` extra")

FRAMEWORKS = Path(__file__).with_name("frameworks")
PIN = "seed=42,temperature=0.7,top_p=0.95,max_tokens=200"
RUNS = {
    "openai-agents-responses": ["openai_agents_run.py", "responses"],
    "openai-agents-chat": ["openai_agents_run.py", "chat"],
    "pydantic-ai": ["pydantic_ai_run.py"],
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessRig]:
    with harness_rig(tmp_path_factory.mktemp("third-party")) as running:
        yield running


def _session_env(rig: HarnessRig, capsys: pytest.CaptureFixture[str], *how: str) -> dict[str, str]:
    """``affidavit session new --env``'s lines, as a shell's ``eval`` would set them (a
    pinned session, or ``how``: ``--replay-of SESSION``, which takes the recorded pins)."""
    home = str(rig.home.root)
    assert main(["session", "new", *(how or ("--pin", PIN)), "--home", home, "--env"]) == 0
    lines = capsys.readouterr().out
    shell = subprocess.run(
        ["bash", "-c", f"{lines}\nenv -0"], capture_output=True, check=True, text=True
    )
    return dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)


def _run(rig: HarnessRig, script: list[str], env: dict[str, str], trace: Path) -> dict[str, Any]:
    """The framework's script as its own process, every connect() it makes traced."""
    command = [sys.executable, str(FRAMEWORKS / script[0]), *script[1:]]
    if shutil.which("strace") is not None:
        command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _only_the_proxy(rig: HarnessRig, trace: Path) -> None:
    if not trace.exists():
        pytest.skip("strace is not installed (the Makefile installs it): connects not checked")
    lines = [x for x in trace.read_text().splitlines() if "connect(" in x]
    inet = [x for x in lines if "AF_INET" in x]
    port = int(rig.up.appliance.proxy_url.rsplit(":", 1)[1])
    assert inet, lines  # it did talk to the proxy
    assert all(f"sin_port=htons({port})" in x and "127.0.0.1" in x for x in inet), inet
    assert not [x for x in lines if "AF_INET6" in x], lines


@pytest.mark.parametrize("name", list(RUNS))
def test_a_third_party_agent_runs_replays_and_re_runs_on_its_record(
    rig: HarnessRig, name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = {**os.environ, **_session_env(rig, capsys)}
    session = env["AFFIDAVIT_SESSION"]
    notes_before = _lines(rig.ledger)
    first = _run(rig, RUNS[name], env, tmp_path / "connects.txt")
    _only_the_proxy(rig, tmp_path / "connects.txt")
    assert _lines(rig.ledger) > notes_before  # the forced MCP call reached the real server

    key = KeyPair.read(rig.home.user_key_file)
    bodies = [b for _, b in _read(rig, session, key)]
    replies = [b for b in bodies if isinstance(b, ModelResponse)]
    results = [b for b in bodies if isinstance(b, ToolResult)]
    assert len(replies) >= 2 and all(r.outcome == "COMMITTED" for r in replies)
    assert [c.tool for c in bodies if isinstance(c, ToolCall)][:1] == ["append_note"]
    assert results and all(r.outcome == "COMMITTED" for r in results)

    home = ["--home", str(rig.home.root)]
    store, key_file = rig.up.appliance.store, str(rig.home.user_key_file)
    assert main(["log", "verify", store, "--key", key_file]) == 0
    assert main(["replay", session, "--calls", "--reconstruct", *home]) == 0
    capsys.readouterr()

    replay_env = {**os.environ, **_session_env(rig, capsys, "--replay-of", session)}
    notes = _lines(rig.ledger)
    again = _run(rig, RUNS[name], replay_env, tmp_path / "replay-connects.txt")
    assert _lines(rig.ledger) == notes  # 0 live MCP calls: results came from the record
    assert again == first  # the same final answer and the same local tool calls
    replayed = replay_env["AFFIDAVIT_SESSION"]
    assert main(["replay", replayed, "--calls", "--reconstruct", *home]) == 0
    judged = capsys.readouterr().out.splitlines()[-1]  # every model call judged identical
    assert judged.startswith(f"Recorded verdicts: {len(replies)} of {len(replies)} calls")


def _read(rig: HarnessRig, session: str, key: KeyPair) -> list[tuple[int, Any]]:
    from harness.session import read_bodies

    return read_bodies(rig.up.appliance.store, session, key)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_newer_mcp_clients_list_and_call_through_the_session(rig: HarnessRig) -> None:
    """The frameworks' MCP clients negotiate protocol 2026-07-28, whose results need members
    (``resultType``, ``ttlMs``, ``cacheScope``) an upstream on an older version does not send:
    the gateway adds the protocol's defaults, so they can list the tools at all."""
    import asyncio

    from agents.mcp import MCPServerStreamableHttp

    from harness.session import open_session

    state = open_session(rig.home, {"seed": 1})

    async def listed() -> list[str]:
        server = MCPServerStreamableHttp(
            params={
                "url": f"{state.base_url}/mcp/ledger",
                "headers": {"Authorization": f"Bearer {state.token}"},
            }
        )
        async with server:
            return sorted(tool.name for tool in await server.list_tools())

    assert asyncio.run(listed()) == ["append_note", "count_notes", "hang_once"]
