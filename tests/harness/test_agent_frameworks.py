"""An agent framework nobody here wrote, pointed at a pinned session: the OpenAI Agents SDK
(``openai-agents`` from PyPI) with its own instructions and a typed function tool whose
parameter is ``Optional``, through both of its model classes: the Responses API (its
default) and Chat Completions. Each run goes through the proxy to the embedded engine: the
framework's tool is called with arguments its own pydantic model accepts, every model call
is recorded and committed, the clock rides in the framework's instructions (never as a
message a template refuses), and a second pinned run answers the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="the engine test needs the `engine` extra")

from openai import AsyncOpenAI

from harness.session import open_session
from record.seal import KeyPair
from tests.harness.rig import CLOCK, PINS, HarnessRig, harness_rig, model_exchanges

agents = pytest.importorskip(
    "agents", reason="the OpenAI Agents SDK comes with the `frameworks` extra"
)

LINE = f"Current date and time: {CLOCK} (UTC)"
INSTRUCTIONS = "You are a weather assistant. Always use the tool."


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessRig]:
    agents.set_tracing_disabled(True)  # the SDK would export traces to api.openai.com
    with harness_rig(tmp_path_factory.mktemp("frameworks"), mcp=False) as running:
        yield running


def _run(rig: HarnessRig, api: str) -> tuple[str, list[dict[str, Any]], str]:
    """One pinned session, one agent run; ``(final output, tool calls seen, session id)``."""
    state = open_session(rig.home, PINS)
    client = AsyncOpenAI(base_url=f"{state.base_url}/v1", api_key=state.token, max_retries=0)
    model_class = (
        agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    )
    seen: list[dict[str, Any]] = []

    @agents.function_tool
    def get_weather(city: str, days: int | None = None) -> str:
        """The forecast for a city.

        Args:
            city: Where.
            days: How many days ahead (optional).
        """
        seen.append({"city": city, "days": days})
        return f"sunny in {city}"

    agent = agents.Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        tools=[get_weather],
        model=model_class(model=rig.up.appliance.model, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=60),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    return str(result.final_output), seen, state.session_id


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_agents_sdk_runs_a_tool_through_a_pinned_session(rig: HarnessRig, api: str) -> None:
    output, seen, session = _run(rig, api)
    assert len(seen) == 1 and isinstance(seen[0]["city"], str)  # its own pydantic check passed
    assert output == f"sunny in {seen[0]['city']}"
    key = KeyPair.read(rig.home.user_key_file)
    ((request, reply),) = model_exchanges(rig.up.appliance.store, session, key)
    assert reply.outcome == "COMMITTED" and reply.reproducibility is not None
    assert reply.reproducibility["prompt_digest"] == request.prompt_digest
    sent = json.loads(request.request_bytes)
    if api == "responses":
        assert request.provider.endpoint.endswith("/v1/responses")
        assert sent["instructions"] == f"{LINE}\n\n{INSTRUCTIONS}"
    else:
        assert request.provider.endpoint.endswith("/v1/chat/completions")
        assert sent["messages"][0] == {"role": "system", "content": f"{LINE}\n\n{INSTRUCTIONS}"}
        assert [m["role"] for m in sent["messages"]].count("system") == 1
    assert request.clock_rule == "fold"
    assert '"anyOf"' in json.dumps(sent["tools"])  # the Optional parameter, once refused
    again, seen_again, _ = _run(rig, api)  # pinned: the same call, the same answer
    assert (again, seen_again) == (output, seen)
