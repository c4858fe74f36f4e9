"""One Pydantic AI run against an Affidavit session, as a user would write it.

Run by ``tests/harness/test_third_party_agents.py`` as its own process (under ``strace``),
with the variables ``affidavit session new --env`` prints. The agent has instructions,
streams (``run_stream``), reaches the session's ``ledger`` MCP server through the session's
MCP URL and has a local function tool with an optional parameter; a capability chooses
the tool per step (``append_note``, then ``get_weather``, then the output tool of its
structured answer), since a static ``tool_choice`` would forbid the final answer. It prints one JSON line: the final output
and the local tool's calls.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

CALLS: list[dict[str, Any]] = []


class Answer(BaseModel):
    """The structured final answer (its output tool keeps a small model's answer short)."""

    text: Annotated[str, Field(max_length=40)]


@dataclass
class OneToolPerStep(AbstractCapability[None]):
    """Step 1 calls the MCP tool, step 2 the local one, step 3 gives the answer."""

    def get_model_settings(self) -> Any:
        def per_step(ctx: RunContext[None]) -> dict[str, Any]:
            plan = {1: ["append_note"], 2: ["get_weather"]}
            return {"tool_choice": plan.get(ctx.run_step, ["final_result"])}

        return per_step


async def main() -> dict[str, Any]:
    token = os.environ["OPENAI_API_KEY"]
    provider = OpenAIProvider(base_url=os.environ["OPENAI_BASE_URL"], api_key=token)
    ledger = MCPToolset(
        os.environ["AFFIDAVIT_MCP_URL"] + "/ledger", headers={"Authorization": f"Bearer {token}"}
    )
    agent = Agent(
        OpenAIChatModel(os.environ["AFFIDAVIT_MODEL"], provider=provider),
        instructions="You keep notes. Be brief.",
        toolsets=[ledger],
        capabilities=[OneToolPerStep()],
        output_type=Answer,
    )

    @agent.tool_plain
    def get_weather(city: Annotated[str, Field(max_length=16)], days: int | None = None) -> str:
        """The forecast for a city, days ahead."""
        CALLS.append({"city": city, "days": days})
        return f"sunny in {city}"

    async with agent.run_stream("Note that it is sunny.") as run:
        final = await run.get_output()
    return {"final": final.text, "local_calls": CALLS}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
