"""One OpenAI Agents SDK run against an Affidavit session, as a user would write it.

Run by ``tests/harness/test_third_party_agents.py`` as its own process (under ``strace``).
The session comes from the variables ``affidavit session new --env`` prints
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AFFIDAVIT_MODEL``, ``AFFIDAVIT_MCP_URL``);
``argv[1]`` picks the model class (``responses``, the SDK's default, or ``chat``). The
agent has instructions, streams, reaches the session's ``ledger`` MCP server through the
session's MCP URL (its ``append_note`` forced in the first run) and has a local function
tool with an optional parameter (forced in the second run of the same conversation). It
prints one JSON line: the outputs and the local tool's calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Annotated, Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI
from pydantic import Field

set_tracing_disabled(True)  # its traces would go to api.openai.com, past the proxy
CALLS: list[dict[str, Any]] = []


@function_tool
def get_weather(city: Annotated[str, Field(max_length=16)], days: int | None = None) -> str:
    """The forecast for a city, days ahead."""
    CALLS.append({"city": city, "days": days})
    return f"sunny in {city}"


async def main(api: str) -> dict[str, Any]:
    client = AsyncOpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    model = model_class(model=os.environ["AFFIDAVIT_MODEL"], openai_client=client)
    ledger = MCPServerStreamableHttp(
        params={
            "url": os.environ["AFFIDAVIT_MCP_URL"] + "/ledger",
            "headers": {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        },
        cache_tools_list=True,
    )
    history: list[Any] = []
    outputs = []
    async with ledger:
        # two runs of one conversation, each ending at the tool it forces: the MCP tool, then
        # the local one (a small model's free text could run past max_tokens)
        for tool, ask in (("append_note", "Note that it is sunny."), ("get_weather", "Paris?")):
            agent = Agent(
                name="notes",
                instructions="You keep notes. Be brief.",
                tools=[get_weather],
                mcp_servers=[ledger],
                model=model,
                model_settings=ModelSettings(tool_choice=tool),
                tool_use_behavior="stop_on_first_tool",
            )
            turn = [*history, {"role": "user", "content": ask}]
            run = Runner.run_streamed(agent, turn, max_turns=2)
            async for _ in run.stream_events():
                pass
            history = run.to_input_list()
            outputs.append(str(run.final_output))
    return {"final": outputs[-1], "outputs": outputs, "local_calls": CALLS}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
