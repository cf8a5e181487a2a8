"""`ctxd_client.langchain.CtxdChatMessageHistory` against a live server, checked the way
langchain-core's own `InMemoryChatMessageHistory` behaves: order, clear, exact round trips of each
message type (AI tool calls and ToolMessage's tool_call_id included), the async methods, and bad
addresses and keys. (langchain-tests has no standard suite for chat histories.)"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from conftest import RpcRecorder, Server
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from test_security import KEY, write_keys

from ctxd_client import Client, Unauthenticated, Unavailable
from ctxd_client.langchain import CtxdChatMessageHistory


def history(client: Client) -> CtxdChatMessageHistory:
    return CtxdChatMessageHistory(f"lc-{uuid.uuid4()}", client=client)


CONVERSATION = [
    SystemMessage("You are terse."),
    HumanMessage("What is in README.md?"),
    AIMessage(
        "Let me read it.",
        tool_calls=[
            {"name": "read_file", "args": {"path": "README.md"}, "id": "call_1"},
            {"name": "read_file", "args": {"path": "NOTES.md"}, "id": "call_2"},
        ],
    ),
    ToolMessage("# ctxd", tool_call_id="call_1"),
    ToolMessage("no such file", tool_call_id="call_2", status="error"),
    AIMessage(
        "It is ctxd's README.",
        id="run-1",
        response_metadata={"model_name": "fake", "finish_reason": "stop"},
        usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    ),
    HumanMessage([{"type": "text", "text": "and this?"}, {"type": "image_url", "image_url": "x"}]),
    ChatMessage("a custom role", role="critic"),
]


@pytest.mark.filterwarnings("ignore:The class `InMemoryChatMessageHistory` was deprecated")
def test_behaves_like_langchains_in_memory_history(client: Client) -> None:
    ours, reference = history(client), InMemoryChatMessageHistory()
    for h in (ours, reference):
        h.add_messages(CONVERSATION[:2])
        h.add_user_message("one more")
        h.add_ai_message("sure")
        h.add_message(CONVERSATION[2])
        h.add_messages(CONVERSATION[3:])
    assert ours.messages == reference.messages
    assert [type(m) for m in ours.messages] == [type(m) for m in reference.messages]
    ours.clear()
    reference.clear()
    assert ours.messages == reference.messages == []
    ours.add_messages([HumanMessage("after clear")])
    assert ours.messages == [HumanMessage("after clear")]


def test_each_message_type_round_trips_exactly(client: Client) -> None:
    h = history(client)
    h.add_messages(CONVERSATION)
    got = h.messages
    assert got == CONVERSATION
    assert got[2].tool_calls == CONVERSATION[2].tool_calls
    assert [m.tool_call_id for m in got[3:5]] == ["call_1", "call_2"]
    assert got[4].status == "error"
    # A second history with the same id (another client, another process) reads the same.
    with Client(client.address, timeout=30) as other:
        assert CtxdChatMessageHistory(h.session_id, client=other).messages == CONVERSATION


def test_messages_render_as_a_tool_exchange(client: Client) -> None:
    h = history(client)
    h.add_messages(CONVERSATION[:6])
    messages = client.render(h.ctxd_session_id).messages
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[1] == {"role": "user", "content": "What is in README.md?"}
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "# ctxd"}


def test_tool_messages_may_come_one_add_at_a_time(client: Client) -> None:
    h = history(client)
    for m in CONVERSATION[1:6]:
        h.add_message(m)
    assert h.messages == CONVERSATION[1:6]
    roles = [m["role"] for m in client.render(h.ctxd_session_id).messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]


def test_an_unanswered_tool_call_does_not_block_the_history(client: Client) -> None:
    h = history(client)
    calling = AIMessage("", tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "call_7"}])
    h.add_messages([HumanMessage("look it up"), calling])
    h.add_messages([HumanMessage("never mind, just answer")])
    h.add_messages([AIMessage("ok")])
    assert h.messages == [
        HumanMessage("look it up"),
        calling,
        HumanMessage("never mind, just answer"),
        AIMessage("ok"),
    ]


def test_one_add_of_many_messages_is_one_append(recorded: tuple[Client, RpcRecorder]) -> None:
    client, rpcs = recorded
    h = history(client)
    h.add_messages(CONVERSATION[:1])
    rpcs.methods.clear()
    # Several messages, a tool call and its results among them: one unary Append, all or
    # nothing, rather than one per message (or a stream, which may split into transactions).
    h.add_messages(CONVERSATION[1:])
    assert rpcs.writes() == ["Append"]
    assert h.messages == CONVERSATION


def test_async_methods(client: Client) -> None:
    h = history(client)

    async def scenario() -> list:
        await h.aadd_messages(CONVERSATION[:3])
        await h.aadd_messages(CONVERSATION[3:5])
        first = await h.aget_messages()
        await h.aclear()
        return [first, await h.aget_messages()]

    first, cleared = asyncio.run(scenario())
    assert first == CONVERSATION[:5]
    assert cleared == []


def test_a_wrong_address_fails_at_first_use() -> None:
    h = CtxdChatMessageHistory("x", address="127.0.0.1:1")
    try:
        with pytest.raises(Unavailable, match="127.0.0.1:1"):
            h.messages  # noqa: B018
    finally:
        h.close()


def test_a_wrong_key_says_so(ctxd_bin: Path, tmp_path: Path) -> None:
    keyed = Server(ctxd_bin, tmp_path, "--api-keys-file", str(write_keys(tmp_path)))
    try:
        h = CtxdChatMessageHistory("keyed", address=keyed.address)
        with pytest.raises(Unauthenticated, match="missing API key"):
            h.add_messages([HumanMessage("hi")])
        h.close()
        ok = CtxdChatMessageHistory("keyed", address=keyed.address, api_key=KEY)
        ok.add_messages([HumanMessage("hi")])
        assert ok.messages == [HumanMessage("hi")]
        ok.close()
    finally:
        keyed.stop()
