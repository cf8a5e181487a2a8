"""A fake Agents SDK `Model` (no network): the first answer to a user message calls the `lookup`
tool, the answer after the tool's output is a canned message quoting it. Every input it is given
is recorded in `FakeModel.inputs`.

Run as a script, it is one process of a conversation: `agents_fake.py ADDRESS SESSION_ID TEXT`
runs the agent once with a `CtxdSession` and prints what the model saw and answered, as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


class FakeModel(Model):
    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any):
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        turn = sum(1 for i in items if i.get("role") == "user")
        last = items[-1]
        if last.get("type") == "function_call_output":
            text = f"turn {turn}: the tool said {last['output']}"
            output: list[Any] = [
                ResponseOutputMessage(
                    id=f"msg_{turn}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            ]
        else:
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{turn}",
                    call_id=f"call_{turn}",
                    name="lookup",
                    arguments=json.dumps({"query": last.get("content")}),
                    status="completed",
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("the fake model does not stream")


@function_tool
def lookup(query: str) -> str:
    """Looks something up."""
    return f"<{query}>"


def agent(model: FakeModel) -> Agent:
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=[lookup])


async def _main(address: str, session_id: str, text: str) -> None:
    from ctxd_client.openai_agents import CtxdSession

    set_tracing_disabled(True)
    model = FakeModel()
    session = CtxdSession(session_id, address=address)
    try:
        result = await Runner.run(agent(model), text, session=session)
    finally:
        session.close()
    print(json.dumps({"final_output": result.final_output, "inputs": model.inputs}))


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:4]))
