"""A LangChain chat message history stored in ctxd: `pip install 'ctxd-client[langchain]'`.

    from ctxd_client.langchain import CtxdChatMessageHistory

    history = CtxdChatMessageHistory("user-42", address="127.0.0.1:50051")
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    history.messages   # [HumanMessage("hi"), AIMessage("hello")]

HumanMessage, SystemMessage and AIMessage are ctxd messages (an AIMessage's `tool_calls` become
the node's tool calls), ToolMessage is a tool result (`status="error"` is `is_error`), and any
other message type is an assistant message whose text is its JSON after `MARKER`. A message the
node alone does not give back exactly (ids, metadata, content blocks) also carries its
`message_to_dict` JSON in a marked text part, so `messages` returns what was added.

`recall_tool(history)` is the recall tool as a LangChain `StructuredTool` bound to the session:
bind it to a chat model whose context ctxd renders, and it reads back what a render cleared or
shortened (`llm.bind_tools([recall_tool(history), ...])`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.tools import StructuredTool, ToolException

from ._itemlog import Piece, open_log, take_text
from ._proto import ctxd_pb2 as pb
from .client import Client
from .recall import (
    RECALL_TOOL_DESCRIPTION,
    RECALL_TOOL_NAME,
    RECALL_TOOL_PARAMETERS,
    handle_recall,
)
from .types import Session

__all__ = ["MARKER", "CtxdChatMessageHistory", "recall_tool"]

MARKER = "ctxd:langchain-message "
"""The start of a text part holding a message's `message_to_dict` JSON."""


_ROLES = {"human": pb.ROLE_USER, "system": pb.ROLE_SYSTEM}


def _hollow(content: Any, texts: list[str]) -> Any:
    if isinstance(content, str):
        return take_text(content, texts, MARKER)
    if isinstance(content, list):
        out = []
        for block in content:
            if isinstance(block, str):
                block = take_text(block, texts, MARKER)
            elif isinstance(block, dict) and block.get("type") == "text":
                block = {**block, "text": take_text(block.get("text"), texts, MARKER)}
            out.append(block)
        return out
    return content


class _Codec:
    marker = MARKER

    def piece(self, item: Any) -> Piece:
        kind, data = item.get("type"), item.get("data")
        if not isinstance(data, dict):
            return Piece("opaque")
        texts: list[str] = []
        skeleton = {**item, "data": {**data, "content": _hollow(data.get("content"), texts)}}
        if kind in _ROLES:
            return Piece("message", skeleton, _ROLES[kind], texts)
        if kind == "ai":
            calls = data.get("tool_calls") or []
            if not calls:
                return Piece("message", skeleton, pb.ROLE_ASSISTANT, texts)
            try:
                tool_calls = [
                    pb.ToolCall(
                        call_id=c["id"], name=c["name"], arguments_json=json.dumps(c["args"])
                    )
                    for c in calls
                ]
            except (KeyError, TypeError, ValueError):
                return Piece("opaque")
            return Piece("call", skeleton, texts=texts, calls=tool_calls)
        if kind == "tool" and isinstance(data.get("tool_call_id"), str):
            return Piece(
                "output",
                skeleton,
                texts=texts,
                call_id=data["tool_call_id"],
                is_error=data.get("status") == "error",
            )
        return Piece("opaque")

    def natural_items(self, node: pb.NodeInput) -> list[Any]:
        kind = node.WhichOneof("kind")
        message: BaseMessage
        if kind == "message":
            m = node.message
            text = "\n".join(p.text for p in m.parts if p.WhichOneof("part") == "text")
            if m.role == pb.ROLE_USER:
                message = HumanMessage(content=text)
            elif m.role in (pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER):
                message = SystemMessage(content=text)
            else:
                calls = [
                    {"name": c.name, "args": _args(c.arguments_json), "id": c.call_id}
                    for c in m.tool_calls
                ]
                message = AIMessage(content=text, tool_calls=calls)
        elif kind == "tool_result":
            r = node.tool_result
            text = "\n".join(p.text for p in r.parts if p.WhichOneof("part") == "text")
            status = "error" if r.is_error else "success"
            message = ToolMessage(content=text, tool_call_id=r.call_id, status=status)
        elif kind == "function_result":
            r = node.function_result
            message = ToolMessage(content=r.output, tool_call_id=r.call_id)
        else:
            return []
        return [message_to_dict(message)]


def _args(arguments_json: str) -> dict[str, Any]:
    value = json.loads(arguments_json or "{}")
    return value if isinstance(value, dict) else {"value": value}


class CtxdChatMessageHistory(BaseChatMessageHistory):
    """Chat history on a branch of a ctxd session (created on first use, with `session_id` in
    its metadata and an idempotency key derived from it, so processes sharing the id share the
    history). Pass a `client`, or an `address` (and `api_key`) to open one (`close()` closes it).

    `clear()` points the branch at no node: ctxd never deletes or changes a node. The async
    methods run the synchronous gRPC client in a worker thread.
    """

    def __init__(
        self,
        session_id: str,
        client: Client | None = None,
        *,
        address: str = "127.0.0.1:50051",
        api_key: str | None = None,
        branch: str = "main",
    ) -> None:
        self.client, self._owns_client, self._log = open_log(
            "langchain", session_id, client, _Codec(), address=address, api_key=api_key, branch=branch
        )
        self.session_id = session_id

    @property
    def ctxd_session_id(self) -> str:
        """The ctxd session's id (created on first use)."""
        return self._log.session_id

    def close(self) -> None:
        """Closes the client if this history opened it."""
        if self._owns_client:
            self.client.close()

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every message of the branch, oldest first."""
        return messages_from_dict(self._log.items())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Appends messages in order, atomically."""
        self._log.add([message_to_dict(m) for m in messages])

    def clear(self) -> None:
        self._log.clear()

    async def aget_messages(self) -> list[BaseMessage]:
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await asyncio.to_thread(self.add_messages, list(messages))

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)


def recall_tool(
    session: CtxdChatMessageHistory | Session | str,
    client: Client | None = None,
    *,
    max_chars: int | None = None,
) -> StructuredTool:
    """The recall tool as a `StructuredTool`: the model passes a placeholder's reference and
    reads back the original content from `session` (a `CtxdChatMessageHistory`, whose client it
    uses, or a ctxd session or its id with `client`).

    Its schema is ctxd's definition (`convert_to_openai_tool` gives exactly
    `recall_tool_definition("openai")`). An unknown or malformed reference raises
    `ToolException`, which the tool answers as text (`handle_tool_error=True`): invoked with a
    tool call, a `ToolMessage` with `status="error"`. Failures of the server itself raise.
    """
    if isinstance(session, CtxdChatMessageHistory):
        history = session
        client = client or session.client

        def session_id() -> Session | str:
            return history.ctxd_session_id

    else:
        if client is None:
            raise TypeError("recall_tool needs a client for a ctxd session id")
        ref = session

        # The client takes a session or its id as it is.
        def session_id() -> Session | str:
            return ref

    bound = client

    def run(**arguments: Any) -> str:
        result = handle_recall(bound, session_id(), arguments, max_chars=max_chars)
        if result.is_error:
            raise ToolException(result.text)
        return result.text

    async def arun(**arguments: Any) -> str:
        return await asyncio.to_thread(run, **arguments)

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=RECALL_TOOL_NAME,
        description=RECALL_TOOL_DESCRIPTION,
        args_schema=json.loads(json.dumps(RECALL_TOOL_PARAMETERS)),
        handle_tool_error=True,
    )
