"""Any prompt shape through a pinned session (#14 line 1), with the official ``openai`` SDK
against the proxy and the real engine behind it: several client system messages and the
``developer`` role, content as lists of text parts, ``name`` fields, an assistant message
with ``tool_calls`` and ``content: null``, a ``tool`` message, and a tool whose parameter is
``Optional`` (JSON Schema ``anyOf`` with ``null``, once refused). The clock is folded into
the client's first system message (no message is added), the record keeps the rule, the
engine's block names the prompt the proxy recorded and the token ids it ran, and a second
pinned call gives the same bytes. Then the outsider's way in: what ``session new`` prints
(text, ``--json``, ``--env``) is all the SDKs need, and docs/harness.md's agent-framework
example runs as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

import openai

from harness.session import open_session
from record.seal import KeyPair
from tests.harness.rig import CLOCK, PINS, HarnessRig, harness_rig, model_exchanges

REPO = Path(__file__).resolve().parents[2]
LINE = f"Current date and time: {CLOCK} (UTC)"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            },
            "required": ["city"],
        },
    },
}
MESSAGES: Any = [
    {"role": "system", "content": "You are a framework's assistant."},
    {"role": "developer", "content": [{"type": "text", "text": "Use tools when needed."}]},
    {"role": "system", "content": "Be brief.", "name": "policy"},
    {
        "role": "user",
        "name": "alice",
        "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "the weather?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessRig]:
    with harness_rig(tmp_path_factory.mktemp("shapes"), mcp=False) as running:
        yield running


@pytest.mark.parametrize(
    "tool_choice", ["auto", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_every_prompt_shape_reaches_the_engine_through_a_pinned_session(
    rig: HarnessRig, tool_choice: Any
) -> None:
    state = open_session(rig.home, PINS)
    client = openai.OpenAI(base_url=f"{state.base_url}/v1", api_key=state.token, max_retries=0)
    replies = [
        client.chat.completions.with_raw_response.create(
            model=rig.up.appliance.model,
            messages=MESSAGES,
            tools=[WEATHER],
            tool_choice=tool_choice,
        )
        for _ in range(2)
    ]
    client.close()
    first, second = (json.loads(r.content) for r in replies)
    assert first["choices"] == second["choices"]  # pinned: the same reply
    if tool_choice != "auto":
        (call,) = first["choices"][0]["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        assert isinstance(arguments["city"], str)
        assert arguments.get("days") is None or isinstance(arguments["days"], int)
    key = KeyPair.read(rig.home.user_key_file)
    pairs = model_exchanges(rig.up.appliance.store, state.session_id, key)
    assert len(pairs) == 2
    (request, reply), (_, again) = pairs
    sent = json.loads(request.request_bytes)
    # the clock folded into the client's first system message: no message added
    assert len(sent["messages"]) == len(MESSAGES)
    assert sent["messages"][0] == {
        "role": "system",
        "content": f"{LINE}\n\n{MESSAGES[0]['content']}",
    }
    assert sent["messages"][1:] == MESSAGES[1:]  # names, parts, null content: as sent
    assert request.clock == CLOCK and request.clock_rule == "fold"
    assert reply.outcome == "COMMITTED" and reply.reproducibility is not None
    assert reply.reproducibility["prompt_digest"] == request.prompt_digest
    ran = reply.reproducibility["prompt_tokens_digest"]
    assert isinstance(ran, str) and ran.startswith("sha256:")
    assert again.reproducibility is not None
    assert again.reproducibility["prompt_tokens_digest"] == ran
    assert again.response_digest == reply.response_digest


def test_session_new_gives_any_client_what_it_needs(
    rig: HarnessRig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outsider's flow: the CLI opens a session, the SDKs use what it printed: the JSON,
    the text, or the shell lines that set the variables the SDKs read by themselves."""
    import anthropic

    from affidavit.cli import main

    args = ["session", "new", "--pin", "seed=3,max_tokens=8", "--home", str(rig.home.root)]
    assert main([*args, "--json"]) == 0
    opened = json.loads(capsys.readouterr().out)
    assert opened["openai_base_url"] == opened["base_url"] + "/v1"
    assert opened["mcp_url"] == opened["base_url"] + "/mcp"
    chat = openai.OpenAI(base_url=opened["openai_base_url"], api_key=opened["token"])
    reply = chat.chat.completions.create(
        model=rig.up.appliance.model, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].finish_reason == "length"  # the session's max_tokens pin: 8
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    wrong = openai.OpenAI(base_url=opened["openai_base_url"], api_key="not-the-token")
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=rig.up.appliance.model, messages=[])

    assert main(args) == 0
    text = capsys.readouterr().out.splitlines()
    session = text[0]
    facts = dict(line.split(maxsplit=1) for line in text[1:])
    assert facts["base_url"].endswith(f"/s/{session}") and len(facts["token"]) >= 32
    assert facts["mcp_url"].startswith(facts["base_url"] + "/mcp/SERVER")

    assert main([*args, "--env"]) == 0
    lines = capsys.readouterr().out
    shell = subprocess.run(
        ["bash", "-c", f"{lines}\nenv -0"], capture_output=True, check=True, text=True
    )
    env = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, env[name])
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"]
    from_env = openai.OpenAI()  # nothing passed: the SDK reads the variables
    reply = from_env.chat.completions.create(
        model=rig.up.appliance.model, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    message = anthropic.Anthropic().messages.create(
        model=rig.up.appliance.model, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    assert main([*args, "--env", "--json"]) == 2


def _block(text: str, after: str, language: str) -> str:
    """The first fenced ``language`` block after the line ``after``."""
    rest = text[text.index(after) :]
    start = rest.index(f"```{language}\n") + len(f"```{language}\n")
    return rest[start : rest.index("```", start)]


def test_the_docs_agent_framework_example_runs_as_written(rig: HarnessRig, tmp_path: Path) -> None:
    """docs/harness.md's commands and agent.py, run literally (an outsider's first try)."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK comes with the `frameworks` extra")
    doc = (REPO / "docs" / "harness.md").read_text()
    commands = _block(doc, "## Any client, any framework", "sh")
    (tmp_path / "agent.py").write_text(_block(doc, "runs this file as written", "python"))
    env = {
        **os.environ,
        "AFFIDAVIT_HOME": str(rig.home.root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "-ec", commands + 'echo "session=$AFFIDAVIT_SESSION"\n'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer, probe = done.stdout.strip().splitlines()[-2:]
    assert answer.startswith("sunny in ")  # the tool's own return: the call went through
    session = probe.removeprefix("session=")
    key = KeyPair.read(rig.home.user_key_file)
    ((request, reply),) = model_exchanges(rig.up.appliance.store, session, key)
    assert request.provider.endpoint.endswith("/v1/responses") and reply.outcome == "COMMITTED"
    assert json.loads(request.request_bytes)["seed"] == 42  # the pin from the docs' command
