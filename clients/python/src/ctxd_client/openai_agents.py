"""An OpenAI Agents SDK session stored in ctxd: `pip install 'ctxd-client[openai-agents]'`.

    from agents import Agent, Runner
    from ctxd_client import Client
    from ctxd_client.openai_agents import CtxdSession

    with Client("127.0.0.1:50051") as ctxd:
        session = CtxdSession("user-42", client=ctxd)
        result = await Runner.run(agent, "Hi!", session=session)

Each SDK item is one ctxd node (see `ctxd_client._itemlog`): input and output messages are
messages, `function_call` items are tool calls of an assistant message (consecutive ones share
one, as a model's parallel calls do), `function_call_output` items are tool results, and anything
else (reasoning, hosted tool calls, handoff bookkeeping, ...) is an assistant message whose text
is the item's JSON after `MARKER`. `get_items` gives every item back exactly as it was added.

`recall_tool(session)` is the recall tool as a `FunctionTool`, bound to the session, for an agent
whose context ctxd renders (it reads back what a render cleared or shortened):

    agent = Agent(name="assistant", tools=[recall_tool(session), ...])
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents.memory.session_settings import SessionSettings, resolve_session_limit
from agents.tool import FunctionTool
from agents.tool_context import ToolContext

from ._itemlog import Piece, open_log, rendered_text, take_text
from ._proto import ctxd_pb2 as pb
from .client import Client
from .recall import (
    RECALL_TOOL_DESCRIPTION,
    RECALL_TOOL_NAME,
    RECALL_TOOL_PARAMETERS,
    handle_recall,
)
from .types import BudgetLike, Session

__all__ = ["MARKER", "CtxdSession", "recall_tool"]

MARKER = "ctxd:openai-agents-item "
"""The start of a text part holding an item's JSON (with references to the node's own texts)."""


_ROLES = {
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
}
_ROLE_NAMES = {v: k for k, v in _ROLES.items()}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


def _hollow(content: Any, texts: list[str]) -> Any:
    """A message's (or tool output's) content with its texts moved into `texts`."""
    if isinstance(content, str):
        return take_text(content, texts, MARKER)
    if isinstance(content, list):
        out = []
        for part in content:
            key = _TEXT_PARTS.get(part.get("type")) if isinstance(part, dict) else None
            if key and isinstance(part.get(key), str):
                part = {**part, key: take_text(part[key], texts, MARKER)}
            out.append(part)
        return out
    return content


def _json_or_string(arguments: str) -> str:
    """The arguments as ctxd stores them (valid JSON): as they are, or as a JSON string."""
    try:
        json.loads(arguments)
        return arguments
    except ValueError:
        return json.dumps(arguments)


class _Codec:
    marker = MARKER

    def piece(self, item: Any) -> Piece:
        if not isinstance(item, dict):
            return Piece("opaque")
        kind = item.get("type")
        role = item.get("role")
        if kind in (None, "message") and role in _ROLES and "content" in item:
            texts: list[str] = []
            content = _hollow(item["content"], texts)
            return Piece("message", {**item, "content": content}, _ROLES[role], texts)
        if kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if all(isinstance(v, str) and v for v in (call_id, name)) and isinstance(
                arguments, str
            ):
                stored = _json_or_string(arguments)
                skeleton = dict(item)
                if stored == arguments:
                    skeleton["arguments"] = {"$ctxd": "arguments"}
                call = pb.ToolCall(call_id=call_id, name=name, arguments_json=stored)
                return Piece("call", skeleton, calls=[call], merge=True)
        if kind == "function_call_output" and isinstance(item.get("call_id"), str):
            texts = []
            output = _hollow(item.get("output"), texts)
            return Piece("output", {**item, "output": output}, texts=texts, call_id=item["call_id"])
        return Piece("opaque")

    def natural_items(self, node: pb.NodeInput) -> list[Any]:
        kind = node.WhichOneof("kind")
        if kind == "message":
            m = node.message
            text = "\n".join(p.text for p in m.parts if p.WhichOneof("part") == "text")
            role = _ROLE_NAMES.get(m.role, "assistant")
            items: list[Any] = []
            if text or not m.tool_calls:
                items.append({"role": role, "content": text})
            items.extend(
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments_json,
                }
                for c in m.tool_calls
            )
            return items
        if kind == "tool_result":
            r = node.tool_result
            text = "\n".join(p.text for p in r.parts if p.WhichOneof("part") == "text")
            return [{"type": "function_call_output", "call_id": r.call_id, "output": text}]
        if kind == "function_result":
            r = node.function_result
            return [{"type": "function_call_output", "call_id": r.call_id, "output": r.output}]
        return []


class CtxdSession:
    """An Agents SDK `Session` whose items live on a branch of a ctxd session.

    `session_id` is the SDK's id: the ctxd session is created on first use with it in its
    metadata (`openai_agents.session_id`) and with an idempotency key derived from it, so every
    process using the same id and server shares one ctxd session. Pass a `client`, or an
    `address` (and `api_key`) for the session to open its own (closed by `close()`).

    `get_items` returns the stored items exactly (the SDK's own semantics) unless `render_budget`
    is set: it then returns ctxd's rendered context of the branch under that budget (a context
    window, or a dict of budget parts), with items the render kept whole given back as stored and
    reduced ones (truncated or cleared tool results, summaries) rebuilt from the rendered text.
    `pop_item` and `clear_session` move the branch (compare-and-swap on its head); no node is
    ever changed or deleted.

    The gRPC client is synchronous, so each call runs in a worker thread (`asyncio.to_thread`):
    the calls are short, and one client serves sync and async code with the same key, TLS and
    error handling.
    """

    def __init__(
        self,
        session_id: str,
        client: Client | None = None,
        *,
        address: str = "127.0.0.1:50051",
        api_key: str | None = None,
        branch: str = "main",
        render_budget: BudgetLike | None = None,
        tokenizer: str = "heuristic",
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.client, self._owns_client, self._log = open_log(
            "openai-agents", session_id, client, _Codec(), address=address, api_key=api_key,
            branch=branch,
        )
        self.session_id = session_id
        self.session_settings = session_settings
        self.render_budget = render_budget
        self.tokenizer = tokenizer

    @property
    def ctxd_session_id(self) -> str:
        """The ctxd session's id (created on first use); blocking."""
        return self._log.session_id

    @property
    def branch(self) -> str:
        return self._log.branch

    def close(self) -> None:
        """Closes the client if this session opened it."""
        if self._owns_client:
            self.client.close()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The history, oldest first; with `limit`, its latest `limit` items."""
        limit = resolve_session_limit(limit, self.session_settings)
        if self.render_budget is None:
            return await asyncio.to_thread(self._log.items, limit)
        return await asyncio.to_thread(self._rendered_items, limit)

    async def add_items(self, items: list[Any]) -> None:
        """Appends items in order, atomically."""
        await asyncio.to_thread(self._log.add, items)

    async def pop_item(self) -> Any | None:
        """Removes and returns the latest item, or None if there is none."""
        return await asyncio.to_thread(self._log.pop)

    async def clear_session(self) -> None:
        """Points the branch at no node (the nodes stay in ctxd, reachable by id)."""
        await asyncio.to_thread(self._log.clear)

    def _rendered_items(self, limit: int | None) -> list[Any]:
        def render(session_id: str) -> Any:
            return self.client.render(
                session_id,
                budget=self.render_budget,
                tokenizer=self.tokenizer,
                format="neutral",
                branch=self.branch,
            )

        items: list[Any] = []
        for message, whole in self._log.rendered(render):
            if whole:
                items.extend(whole)
                continue
            text = rendered_text(message, MARKER)
            if message.role == pb.ROLE_TOOL:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": message.tool_call_id,
                        "output": text,
                    }
                )
                continue
            role = _ROLE_NAMES.get(message.role, "user")
            if text or not message.tool_calls:
                items.append({"role": role, "content": text})
            items.extend(
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments_json,
                }
                for c in message.tool_calls
            )
        if limit is not None and limit >= 0:
            return items[-limit:] if limit else []
        return items


def recall_tool(
    session: CtxdSession | Session | str,
    client: Client | None = None,
    *,
    max_chars: int | None = None,
) -> FunctionTool:
    """The recall tool, ready for `Agent(tools=[...])`: the model passes a placeholder's
    reference and reads back the original content from `session` (a `CtxdSession`, whose client
    it uses, or a ctxd session or its id with `client`).

    The definition is ctxd's (`ctxd_client.RECALL_TOOL_PARAMETERS`, strict). An unknown or
    malformed reference is answered as text starting `recall failed:` for the model to read;
    failures of the server itself raise, as any tool's would.
    """
    if isinstance(session, CtxdSession):
        agents_session = session
        client = client or session.client

        def session_id() -> Session | str:
            return agents_session.ctxd_session_id  # created on first use: blocking

    else:
        if client is None:
            raise TypeError("recall_tool needs a client for a ctxd session id")
        ref = session

        # The client takes a session or its id as it is.
        def session_id() -> Session | str:
            return ref

    bound = client

    def run(arguments: str) -> str:
        return handle_recall(bound, session_id(), arguments, max_chars=max_chars).text

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
        return await asyncio.to_thread(run, arguments)

    return FunctionTool(
        name=RECALL_TOOL_NAME,
        description=RECALL_TOOL_DESCRIPTION,
        params_json_schema=json.loads(json.dumps(RECALL_TOOL_PARAMETERS)),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=True,
    )
