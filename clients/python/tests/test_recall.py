"""The recall tool against a live server: a result a render cleared comes back byte-exact through
`Client.recall`, `handle_recall`, the LangChain tool and the Agents SDK tool; another session's
reference is not found; a malformed one is refused naming `reference`; and the definitions this
package ships equal what the server's `RecallTool` returns."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from agents.tool_context import ToolContext
from langchain_core.messages import ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from ctxd_client import (
    RECALL_TOOL_NAME,
    Client,
    InvalidArgument,
    NotFound,
    handle_recall,
    recall_references,
    recall_tool_definition,
)
from ctxd_client.langchain import recall_tool as langchain_recall_tool
from ctxd_client.openai_agents import CtxdSession
from ctxd_client.openai_agents import recall_tool as agents_recall_tool

PLACEHOLDER = re.compile(r"recall ([0-9a-f]{12})")
# A step at every tool result from the second on, the newest kept: the older results are cleared.
CLEARING = {
    "microcompact_first": 2,
    "microcompact_every": 1,
    "microcompact_keep": 1,
    "clear_at_least_tokens": 0,
}


def output(n: int) -> str:
    """A long tool output whose exact bytes matter: non-ASCII, tabs, CRLF, trailing spaces."""
    return "".join(f"{n}:{i} é 漢字 🙂\tend  \r\n" for i in range(150))


@dataclass
class Cleared:
    session_id: str
    reference: str
    original: str


def cleared_reference(client: Client, session_id: str, originals: dict[str, str]) -> Cleared:
    """Renders with a clearing policy and reads the first cleared result's reference out of its
    placeholder; `originals` maps each call id to the text appended for it."""
    # An hour after the last call the provider's cache has expired: the render steps, for free.
    later = int(time.time() * 1000) + 3_600_000
    rendered = client.render(
        session_id, budget=100_000, policy=CLEARING, format="openai", now_unix_ms=later
    )
    assert rendered.report.results_cleared >= 1, rendered.report
    for m in rendered.messages:
        if m["role"] == "tool" and (found := PLACEHOLDER.search(m["content"])):
            assert m["content"] != originals[m["tool_call_id"]]
            assert recall_references(m["content"]) == [found.group(1)]
            return Cleared(session_id, found.group(1), originals[m["tool_call_id"]])
    raise AssertionError(f"no placeholder names a reference: {rendered.messages}")


@pytest.fixture(scope="module")
def module_client(server: str) -> Iterator[Client]:
    with Client(server, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def cleared(module_client: Client) -> Cleared:
    """A session of three tool turns whose render clears the older results."""
    client = module_client
    session = client.create_session({"test": "recall"})
    originals = {}
    for n in range(3):
        call_id = f"read_{n}"
        client.append_user(session, f"read file {n}")
        client.append_assistant(
            session, "", [{"id": call_id, "name": "read_file", "arguments": {"path": f"{n}.txt"}}]
        )
        originals[call_id] = output(n)
        client.append_tool_result(session, call_id, originals[call_id])
    client.append_assistant(session, "Read them all.")
    return cleared_reference(client, session.id, originals)


def test_a_cleared_result_comes_back_byte_exact(module_client: Client, cleared: Cleared) -> None:
    client = module_client
    recalled = client.recall(cleared.session_id, cleared.reference)
    assert recalled.content.encode() == cleared.original.encode()
    assert recalled.kind == "tool_result"
    assert (recalled.total_chars, recalled.truncated) == (len(cleared.original), False)
    assert recalled.tool_name == "read_file"
    assert recalled.tool_call_id.startswith("read_")
    assert recalled.node_id

    # Longer than max_chars: the head, and the tool's text says how much was left out.
    head = client.recall(cleared.session_id, cleared.reference, max_chars=100)
    assert (head.content, head.truncated) == (cleared.original[:100], True)
    assert head.chars_left_out == len(cleared.original) - 100
    reference = {"reference": cleared.reference}
    text = handle_recall(client, cleared.session_id, reference, max_chars=100)
    assert not text.is_error
    assert text.text.startswith(cleared.original[:100])
    assert f"{len(cleared.original) - 100} more characters left out" in text.text

    # A model's call as OpenAI gives it (JSON text) and as Anthropic gives it (a dict).
    for arguments in (json.dumps(reference), reference):
        result = handle_recall(client, cleared.session_id, arguments)
        assert (result.text, result.is_error) == (cleared.original, False)


def test_the_langchain_tool_recalls(module_client: Client, cleared: Cleared) -> None:
    tool = langchain_recall_tool(cleared.session_id, module_client)
    assert tool.name == RECALL_TOOL_NAME
    assert convert_to_openai_tool(tool) == recall_tool_definition("openai")
    assert tool.invoke({"reference": cleared.reference}) == cleared.original
    # As a model's tool call: a ToolMessage answering it.
    call = {"type": "tool_call", "id": "call_r", "name": "recall", "args": {"reference": "zz"}}
    refused = tool.invoke(call)
    assert isinstance(refused, ToolMessage)
    assert (refused.tool_call_id, refused.status) == ("call_r", "error")
    assert "reference" in refused.content
    assert asyncio.run(tool.ainvoke({"reference": cleared.reference})) == cleared.original


def test_the_agents_sdk_tool_recalls_from_a_ctxd_session(module_client: Client) -> None:
    client = module_client
    session = CtxdSession(f"recall-{uuid.uuid4()}", client=client)
    originals = {}
    items: list[dict] = []
    for n in range(3):
        call_id = f"call_{n}"
        originals[call_id] = output(n)
        items += [
            {"role": "user", "content": f"read file {n}"},
            {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": originals[call_id]},
        ]
    asyncio.run(session.add_items(items))
    found = cleared_reference(client, session.ctxd_session_id, originals)

    tool = agents_recall_tool(session)
    assert (tool.name, tool.description) == (
        RECALL_TOOL_NAME,
        recall_tool_definition("responses")["description"],
    )
    assert tool.params_json_schema == recall_tool_definition("responses")["parameters"]

    def invoke(arguments: str) -> str:
        context = ToolContext(
            context=None, tool_name=tool.name, tool_call_id="call_r", tool_arguments=arguments
        )
        return asyncio.run(tool.on_invoke_tool(context, arguments))

    assert invoke(json.dumps({"reference": found.reference})) == found.original
    refused = invoke(json.dumps({"reference": "not-a-reference"}))
    assert refused.startswith("recall failed:") and "reference" in refused


def test_another_sessions_reference_is_not_found(module_client: Client, cleared: Cleared) -> None:
    other = module_client.create_session({"test": "recall-other"})
    with pytest.raises(NotFound):
        module_client.recall(other, cleared.reference)
    answer = handle_recall(module_client, other, {"reference": cleared.reference})
    assert answer.is_error and answer.recalled is None
    assert answer.text.startswith("recall failed:")


def test_a_malformed_reference_is_refused_naming_it(
    module_client: Client, cleared: Cleared
) -> None:
    for bad in ("3f9a2c1b7d0", "3f9a2c1b7d04ff", "zzzzzzzzzzzz", ""):
        with pytest.raises(InvalidArgument, match="reference"):
            module_client.recall(cleared.session_id, bad)
    # Arguments a model got wrong are answered, not raised.
    for arguments in ("{not json", {}, {"reference": 7}, '"3f9a2c1b7d04"'):
        answer = handle_recall(module_client, cleared.session_id, arguments)
        assert answer.is_error and "reference" in answer.text, arguments


def test_the_shipped_definitions_are_the_servers(module_client: Client) -> None:
    server = module_client.recall_tool()
    assert server.name == RECALL_TOOL_NAME == "recall"
    raw = server.raw
    for shape, text in (
        ("anthropic", raw.anthropic_json),
        ("openai", raw.openai_json),
        ("responses", raw.responses_json),
    ):
        assert json.loads(text) == recall_tool_definition(shape), shape
    assert server.anthropic == recall_tool_definition("anthropic")
    with pytest.raises(ValueError, match="shape"):
        recall_tool_definition("gemini")  # type: ignore[arg-type]
