"""A framework's conversation items as ctxd nodes: the shared core of the adapters.

A framework (the OpenAI Agents SDK, LangChain) keeps a conversation as a list of JSON items and
wants them back exactly. ctxd keeps a DAG of typed nodes with pairing rules (a tool call's result
must follow the assistant message that made it, and nothing else may come while it is pending).
This module maps one to the other:

- Each item becomes one node of its natural kind (`Codec.piece` says which): a message, an
  assistant message carrying tool calls (the Agents SDK's consecutive `function_call` items share
  one such node, as a model's parallel calls do), a tool result, or, for anything ctxd has no kind
  for, an *opaque* assistant message whose only part is the item's JSON.
- When the node alone does not give the item back exactly (ids, statuses, extra fields), the node
  also gets one text part per item: `codec.marker` followed by the item's JSON, with the texts and
  tool-call arguments the node already holds replaced by small references. The proto has no
  per-node metadata, so these parts are rendered like any other text; an item the node does give
  back exactly (a plain `{"role": "user", "content": "hi"}`, a string tool output) has none.
- A call group is written natural only when its results follow it in the same write or the write
  ends with it (the results may come in the next one). When a later write would break the pairing
  rules (something other than the awaited results arrives), the still-open group and the new items
  are written again from the group's parent on a scratch branch, calls without their results as
  opaque nodes, and the branch is moved there with a compare-and-swap reset.

No node is ever changed: pops and rewrites move the branch (`ResetBranch`), and the nodes they
leave behind stay in the session, reachable from nothing.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from ._proto import ctxd_pb2 as pb
from .client import Client
from .errors import AlreadyExists, Conflict, CtxdError

SENTINEL = "$ctxd"
"""The key of a reference in an item's stored JSON: `{"$ctxd": 0}` is the node's first natural
text part, `{"$ctxd": "arguments"}` the arguments of the tool call with the item's call id."""

CAS_ATTEMPTS = 16
"""How often a write re-reads the branch and retries after losing a compare-and-swap."""


@dataclass
class Piece:
    """What one item becomes. `kind` is `message`, `call`, `output` or `opaque`."""

    kind: str
    skeleton: Any = None
    """The item with its natural texts (indices into `texts`) and arguments replaced."""
    role: int = pb.ROLE_ASSISTANT
    texts: list[str] = field(default_factory=list)
    calls: list[pb.ToolCall] = field(default_factory=list)
    call_id: str = ""
    is_error: bool = False
    merge: bool = False
    """Consecutive `call` pieces with `merge` share one assistant node (parallel calls)."""


class Codec(Protocol):
    marker: str

    def piece(self, item: Any) -> Piece:
        """The node kind and content of an item (texts starting with `marker` are the codec's to
        avoid: `take_text` does)."""
        ...

    def natural_items(self, node: pb.NodeInput) -> list[Any]:
        """The items a node without marker parts stands for (a node written by someone else)."""
        ...


def take_text(text: Any, texts: list[str], marker: str) -> Any:
    """Moves a non-empty string into `texts` and returns its reference; anything else (and a
    text that would read as a marker) stays in the skeleton as it is."""
    if isinstance(text, str) and text and not text.startswith(marker):
        texts.append(text)
        return {SENTINEL: len(texts) - 1}
    return text


def _shift(value: Any, offset: int) -> Any:
    if not offset:
        return value
    if isinstance(value, dict):
        if set(value) == {SENTINEL} and isinstance(value[SENTINEL], int):
            return {SENTINEL: value[SENTINEL] + offset}
        return {k: _shift(v, offset) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift(v, offset) for v in value]
    return value


def _fill(value: Any, texts: list[str], arguments: str | None) -> Any:
    if isinstance(value, dict):
        if set(value) == {SENTINEL}:
            ref = value[SENTINEL]
            if isinstance(ref, int) and 0 <= ref < len(texts):
                return texts[ref]
            if ref == "arguments" and arguments is not None:
                return arguments
        return {k: _fill(v, texts, arguments) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, texts, arguments) for v in value]
    return value


def _parts_of(node: pb.NodeInput) -> list[pb.ContentPart]:
    kind = node.WhichOneof("kind")
    if kind == "message":
        return list(node.message.parts)
    if kind == "tool_result":
        return list(node.tool_result.parts)
    return []


def decode(node: pb.NodeInput, codec: Codec, loads: Callable[[str], Any] = json.loads) -> list:
    """The items a node stands for, oldest first."""
    texts: list[str] = []
    markers: list[str] = []
    for p in _parts_of(node):
        if p.WhichOneof("part") != "text":
            continue
        (markers if p.text.startswith(codec.marker) else texts).append(p.text)
    if not markers:
        return codec.natural_items(node)
    calls = {c.call_id: c.arguments_json for c in node.message.tool_calls}
    items = []
    for m in markers:
        skeleton = loads(m[len(codec.marker) :])
        call_id = skeleton.get("call_id") if isinstance(skeleton, dict) else None
        arguments = calls.get(call_id) if isinstance(call_id, str) else None
        if arguments is None and isinstance(skeleton, dict) and isinstance(skeleton.get("id"), str):
            arguments = calls.get(skeleton["id"])  # LangChain's tool calls are keyed by `id`
        items.append(_fill(skeleton, texts, arguments))
    return items


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _node(codec: Codec, kind: str, pieces: list[Piece], items: list[Any]) -> pb.NodeInput:
    """The node for pieces of one kind, with marker parts if it needs them."""
    texts: list[str] = []
    skeletons = []
    for p in pieces:
        skeletons.append(_shift(p.skeleton, len(texts)))
        texts.extend(p.texts)
    parts = [pb.ContentPart(text=t) for t in texts]
    first = pieces[0]
    if kind == "output":
        node = pb.NodeInput(
            tool_result=pb.ToolResult(call_id=first.call_id, parts=parts, is_error=first.is_error)
        )
    elif kind == "call":
        calls = [c for p in pieces for c in p.calls]
        node = pb.NodeInput(
            message=pb.Message(role=pb.ROLE_ASSISTANT, parts=parts, tool_calls=calls)
        )
    elif kind == "message":
        node = pb.NodeInput(message=pb.Message(role=first.role, parts=parts))
    else:  # opaque: the JSON is the whole content
        node = pb.NodeInput(message=pb.Message(role=pb.ROLE_ASSISTANT))
        skeletons = list(items)
    empty = not _parts_of(node) and not node.message.tool_calls
    if kind == "opaque" or empty or codec.natural_items(node) != list(items):
        target = node.tool_result.parts if kind == "output" else node.message.parts
        target.extend(pb.ContentPart(text=codec.marker + _dumps(s)) for s in skeletons)
    return node


def plan(
    codec: Codec, items: Sequence[Any], pending: set[str]
) -> list[tuple[pb.NodeInput, list[Any]]] | None:
    """The nodes for `items` on a tail whose calls `pending` still wait for results, each with
    the items it holds; None if the items cannot follow that tail (something other than the
    awaited results comes first)."""
    pieces = [codec.piece(it) for it in items]
    out: list[tuple[pb.NodeInput, list[Any]]] = []
    pending = set(pending)
    n = len(pieces)
    i = 0
    while i < n:
        p = pieces[i]
        if p.kind == "output" and p.call_id in pending:
            out.append((_node(codec, "output", [p], [items[i]]), [items[i]]))
            pending.discard(p.call_id)
            i += 1
            continue
        if pending:
            return None
        if p.kind == "call":
            j = i + 1
            if p.merge:
                while j < n and pieces[j].kind == "call" and pieces[j].merge:
                    j += 1
            ids = [c.call_id for q in pieces[i:j] for c in q.calls]
            answered: set[str] = set()
            k = j
            while (
                k < n
                and pieces[k].kind == "output"
                and pieces[k].call_id in ids
                and pieces[k].call_id not in answered
            ):
                answered.add(pieces[k].call_id)
                k += 1
            valid = all(ids) and len(set(ids)) == len(ids)
            if valid and (answered == set(ids) or k == n):
                group = list(items[i:j])
                out.append((_node(codec, "call", pieces[i:j], group), group))
                pending = set(ids)
            else:  # results missing or out of place: the calls cannot stand as calls
                out.extend(
                    (_node(codec, "opaque", [q], [items[x]]), [items[x]])
                    for x, q in zip(range(i, j), pieces[i:j], strict=True)
                )
            i = j
            continue
        kind = "message" if p.kind == "message" else "opaque"
        out.append((_node(codec, kind, [p], [items[i]]), [items[i]]))
        i += 1
    return out


@dataclass
class _Tail:
    head: pb.Node | None
    pending: set[str]
    group: list[pb.Node]
    """The latest message node and the nodes after it, oldest first."""


class ItemLog:
    """Items on one branch of one ctxd session, through a codec. Synchronous; the adapters call
    it from worker threads."""

    def __init__(
        self,
        client: Client,
        codec: Codec,
        *,
        metadata: dict[str, str],
        idempotency_key: str,
        branch: str = "main",
    ) -> None:
        self.client = client
        self.codec = codec
        self.branch = branch
        self._metadata = metadata
        self._idempotency_key = idempotency_key
        self._session_id: str | None = None

    @property
    def session_id(self) -> str:
        """The ctxd session, created on first use; the idempotency key makes every process that
        names the same conversation land on the same session."""
        if self._session_id is None:
            session = self.client.create_session(
                self._metadata, idempotency_key=self._idempotency_key
            )
            if session.branch(self.branch) is None:
                try:
                    self.client.create_branch(session, self.branch)
                except AlreadyExists:
                    pass
            self._session_id = session.id
        return self._session_id

    # ------------------------------------------------------------ reading

    def _log(self, limit: int) -> list[pb.Node]:
        return [n.raw for n in self.client.log(self.session_id, self.branch, limit=limit)]

    def items(self, limit: int | None = None) -> list[Any]:
        """All items, or the latest `limit`, oldest first (0: none; negative: all)."""
        if limit == 0:
            return []
        if limit is None or limit < 0:
            return self._decode_newest_first(self._log(sys.maxsize))
        window = limit
        while True:
            nodes = self._log(window)
            items = self._decode_newest_first(nodes)
            if len(items) >= limit or len(nodes) < window:
                return items[-limit:]
            window *= 2

    def _decode_newest_first(self, nodes: list[pb.Node]) -> list[Any]:
        items: list[Any] = []
        for node in reversed(nodes):
            items.extend(decode(node.content, self.codec))
        return items

    def _tail(self) -> _Tail:
        window = 16
        while True:
            nodes = self._log(window)
            if not nodes:
                return _Tail(None, set(), [])
            for i, node in enumerate(nodes):
                if node.content.WhichOneof("kind") == "message":
                    group = list(reversed(nodes[: i + 1]))
                    calls = [c.call_id for c in node.content.message.tool_calls]
                    answered = set()
                    for later in group[1:]:
                        kind = later.content.WhichOneof("kind")
                        if kind in ("tool_result", "function_result"):
                            answered.add(getattr(later.content, kind).call_id)
                    return _Tail(nodes[0], {c for c in calls if c not in answered}, group)
            if len(nodes) < window:
                return _Tail(nodes[0], set(), [])
            window *= 4

    # ------------------------------------------------------------ writing

    def add(self, items: Sequence[Any]) -> None:
        """Appends items in order, in one atomic append (or one rewrite of the open tail)."""
        items = list(items)
        if not items:
            return
        for _ in range(CAS_ATTEMPTS):
            tail = self._tail()
            head_id = tail.head.node_id if tail.head is not None else ""
            nodes = plan(self.codec, items, tail.pending)
            try:
                if nodes is not None:
                    self.client.append(
                        self.session_id,
                        [n for n, _ in nodes],
                        self.branch,
                        expected_head_id=head_id,
                    )
                else:
                    # The open call group cannot take these items: write it again, calls
                    # without results as opaque nodes, followed by the items.
                    kept = [it for n in tail.group for it in decode(n.content, self.codec)]
                    replan = plan(self.codec, kept + items, set())
                    assert replan is not None  # nothing is pending at a message's parent
                    self._rewrite(tail.group[0].parent_id, replan, head_id)
                return
            except Conflict:
                continue
        raise self._gave_up()

    def pop(self) -> Any | None:
        """Removes and returns the latest item (None if there is none), by moving the branch."""
        for _ in range(CAS_ATTEMPTS):
            nodes = self._log(1)
            if not nodes:
                return None
            head = nodes[0]
            items = decode(head.content, self.codec)
            try:
                if len(items) <= 1:
                    self.client.reset_branch(
                        self.session_id,
                        self.branch,
                        head.parent_id or None,
                        expected_head_id=head.node_id,
                    )
                    if not items:  # a node that stands for no item: drop it and look again
                        continue
                else:
                    # One node holding several items (parallel calls): the same node less its
                    # last item, written on the head's parent.
                    rest = plan(self.codec, items[:-1], set())
                    assert rest is not None
                    self._rewrite(head.parent_id, rest, head.node_id)
                return items[-1]
            except Conflict:
                continue
        raise self._gave_up()

    def _gave_up(self) -> Conflict:
        return Conflict(
            grpc.StatusCode.ABORTED,
            f"branch {self.branch!r} kept moving: gave up after {CAS_ATTEMPTS} attempts",
        )

    def clear(self) -> None:
        """Points the branch at no node; every node stays in the session."""
        self.client.reset_branch(self.session_id, self.branch, None)

    def _rewrite(
        self, base_id: str, nodes: list[tuple[pb.NodeInput, list[Any]]], expected_head_id: str
    ) -> None:
        """Moves the branch from `expected_head_id` to `nodes` written on `base_id` (compare and
        swap): the nodes go on a scratch branch first, so the move is one atomic reset."""
        if not nodes:
            self.client.reset_branch(
                self.session_id, self.branch, base_id or None, expected_head_id=expected_head_id
            )
            return
        scratch = f"ctxd-rewrite-{uuid.uuid4().hex}"
        self.client.create_branch(self.session_id, scratch, base_id or None)
        try:
            written = self.client.append(
                self.session_id, [n for n, _ in nodes], scratch, expected_head_id=base_id
            )
            self.client.reset_branch(
                self.session_id, self.branch, written.head_id, expected_head_id=expected_head_id
            )
        finally:
            try:
                self.client._call(
                    "DeleteBranch",
                    pb.DeleteBranchRequest(session_id=self.session_id, name=scratch),
                )
            except CtxdError:
                pass  # a leftover scratch branch points at nothing anyone reads

    # ------------------------------------------------------------ rendering

    def rendered(self, render: Callable[[str], Any]) -> list[tuple[pb.RenderedMessage, list]]:
        """Each message of a neutral render with the items it stands for when the render kept it
        whole (one node, its text unchanged), else with an empty list."""
        result = render(self.session_id)
        messages = list(result.raw.messages)
        ids = list(dict.fromkeys(i for m in messages for i in m.node_ids))
        nodes: dict[str, pb.Node] = {}
        if ids:
            got = self.client._call(
                "GetNodes", pb.GetNodesRequest(session_id=self.session_id, node_ids=ids)
            )
            nodes = {n.node_id: n for n in got.nodes}
        out = []
        for m in messages:
            whole: list[Any] = []
            if len(m.node_ids) == 1 and not (m.truncated or m.cleared or m.inputs_stubbed):
                node = nodes.get(m.node_ids[0])
                if node is not None and _same_text(m.parts, _parts_of(node.content)):
                    calls = [c.call_id for c in node.content.message.tool_calls]
                    if [c.call_id for c in m.tool_calls] == calls:
                        whole = decode(node.content, self.codec)
            out.append((m, whole))
        return out


def _same_text(rendered: Sequence[pb.ContentPart], stored: Sequence[pb.ContentPart]) -> bool:
    def texts(parts: Sequence[pb.ContentPart]) -> list[str]:
        return [p.text for p in parts if p.WhichOneof("part") == "text"]

    return texts(rendered) == texts(stored)


def rendered_text(message: pb.RenderedMessage, marker: str) -> str:
    """A rendered message's text without marker parts."""
    return "\n".join(
        p.text
        for p in message.parts
        if p.WhichOneof("part") == "text" and not p.text.startswith(marker)
    )


def open_log(
    framework: str,
    session_id: str,
    client: Client | None,
    codec: Codec,
    *,
    address: str,
    api_key: str | None,
    branch: str,
) -> tuple[Client, bool, ItemLog]:
    """An adapter's log of `framework`'s session `session_id`: the client (its own unless one is
    passed, hence the flag), and the ctxd session named by `{framework}.session_id` metadata and
    a creation key derived from the id, so every process using the id lands on one session."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    owns = client is None
    client = client or Client(address, api_key=api_key, timeout=30)
    digest = hashlib.sha256(session_id.encode()).hexdigest()
    log = ItemLog(
        client,
        codec,
        metadata={f"{framework.replace('-', '_')}.session_id": session_id},
        idempotency_key=f"{framework}/{digest}",
        branch=branch,
    )
    return client, owns, log
