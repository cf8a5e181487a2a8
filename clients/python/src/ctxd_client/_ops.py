"""Every exchange with the server, written once for `Client` and `AsyncClient`.

An exchange is a generator: it yields `(rpc, request)` for each unary call it needs, receives the
response, and returns the typed answer. The clients only run it (`Client` blocking, `AsyncClient`
awaiting each call), so each request is built, each answer converted and each page followed in
one place, and the two clients cannot drift apart. The streaming RPCs (AppendStream,
ImportSession, ExportSession, Watch) share their request builders and converters from here too;
only their I/O loops are written per client.

`bind` turns an exchange into a client method with the exchange's signature and docstring.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, Any, Literal, TypeVar

import grpc

from ._proto import ctxd_pb2 as pb
from .errors import CtxdError
from .types import (
    AppendBatch,
    Appended,
    Backup,
    Branch,
    BudgetLike,
    Compaction,
    CompactionEvent,
    ContextReport,
    DeletedSession,
    ExportChunk,
    Exported,
    GarbageCollection,
    GatewayCall,
    GatewayCallPage,
    Node,
    Outcome,
    Recalled,
    RecallToolDefinitions,
    RenderResult,
    Session,
    SessionPage,
    Summaries,
    SummaryRecord,
    UncarriedPart,
    WatchEvent,
    budget_pb,
    ledger_or_none,
    neutral_message,
    summary_kind,
)

T = TypeVar("T")
R = TypeVar("R")

Exchange = Generator[tuple[str, Any], Any, R]
"""Yields `(rpc, request)`, is sent each response, returns the answer."""

SessionRef = Session | str
"""A `Session` or its id."""

Format = Literal["openai", "anthropic", "neutral"]
Expose = Literal["io", "full", "none"]
Callers = Literal["all", "none"]
Reasoning = Literal["keep", "drop"]
"""A render policy's `reasoning`, for a model that binds its thinking to its prefix: `keep` (the
default) takes steps as the provider's own edit, `drop` leaves out the thinking a step
invalidated. The enum (`pb.REASONING_KEEP`, `pb.REASONING_DROP`) is taken too."""
RequestForm = Literal["cache_sharing", "range"]
ImportFormat = Literal[
    "auto", "ctxd_jsonl", "neutral_jsonl", "claude_code_jsonl", "openai_messages"
]
ExportFormat = Literal["ctxd_jsonl", "openai_messages", "claude_code_jsonl"]
ToolCallLike = Mapping[str, Any]
"""`{"id", "name", "arguments"}` (arguments a dict or a JSON string), or an OpenAI tool call
`{"id", "type": "function", "function": {"name", "arguments"}}` as a model returned it."""

ImportSource = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes] | Iterable[bytes]
"""What `import_session` reads: the file's bytes, a path (str or PathLike, as `open` takes), a
binary file open for reading, or an iterable of byte chunks."""

_FORMATS: dict[str, pb.Format] = {
    "neutral": pb.FORMAT_NEUTRAL,
    "openai": pb.FORMAT_OPENAI_CHAT,
    "anthropic": pb.FORMAT_ANTHROPIC_MESSAGES,
}
_EXPOSE: dict[str, pb.Expose] = {"io": pb.EXPOSE_IO, "full": pb.EXPOSE_FULL, "none": pb.EXPOSE_NONE}
_CALLERS: dict[str, pb.Callers] = {"all": pb.CALLERS_ALL, "none": pb.CALLERS_NONE}
_REASONING: dict[str, pb.Reasoning] = {"keep": pb.REASONING_KEEP, "drop": pb.REASONING_DROP}
_REQUEST_FORMS: dict[str, pb.SummaryRequestForm] = {
    "cache_sharing": pb.SUMMARY_REQUEST_FORM_CACHE_SHARING,
    "range": pb.SUMMARY_REQUEST_FORM_RANGE,
}
_IMPORT_FORMATS: dict[str, pb.ImportFormat] = {
    "auto": pb.IMPORT_FORMAT_UNSPECIFIED,
    "ctxd_jsonl": pb.IMPORT_FORMAT_CTXD_JSONL,
    "neutral_jsonl": pb.IMPORT_FORMAT_NEUTRAL_JSONL,
    "claude_code_jsonl": pb.IMPORT_FORMAT_CLAUDE_CODE_JSONL,
    "openai_messages": pb.IMPORT_FORMAT_OPENAI_MESSAGES,
}
EXPORT_FORMATS: dict[str, pb.ExportFormat] = {
    "ctxd_jsonl": pb.EXPORT_FORMAT_CTXD_JSONL,
    "openai_messages": pb.EXPORT_FORMAT_OPENAI_MESSAGES,
    "claude_code_jsonl": pb.EXPORT_FORMAT_CLAUDE_CODE_JSONL,
}

# Well under gRPC's 4 MiB message limit, large enough that a big file is few messages.
IMPORT_CHUNK_BYTES = 256 * 1024


def choice(table: Mapping[str, T], value: str, what: str) -> T:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {', '.join(table)}, not {value!r}") from None


def session_id(session: SessionRef) -> str:
    return session.id if isinstance(session, Session) else session


def bind(exchange: Callable[..., Any], method: Callable[..., Any], owner: str) -> Any:
    """`method` (which runs `exchange`) dressed as the method `owner.<name>`: the exchange's
    name (less an `fn_` prefix), docstring and signature, its first parameter `self` for an
    `fn_` exchange (which takes the `FunctionScope`), else `self` in front; for `help()`."""
    name = exchange.__name__.removeprefix("fn_")
    method.__name__ = name
    method.__qualname__ = f"{owner}.{name}"
    method.__doc__ = exchange.__doc__
    method.__module__ = exchange.__module__
    signature = inspect.signature(exchange)
    parameters = list(signature.parameters.values())
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if exchange.__name__.startswith("fn_"):
        parameters[0] = self_parameter
    else:
        parameters.insert(0, self_parameter)
    answer = signature.return_annotation
    if isinstance(answer, str) and answer.startswith("Exchange[") and answer.endswith("]"):
        answer = answer[len("Exchange[") : -1]  # what the method returns (or its coroutine gives)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=answer
    )
    return method


# ---------------------------------------------------------------- node builders


def _text(text: str) -> list[pb.ContentPart]:
    # An empty text is no part at all: an assistant turn that only calls tools has no text.
    return [pb.ContentPart(text=text)] if text else []


def user_message(text: str, *, pinned: bool = False) -> pb.NodeInput:
    """A user message node, for `Client.append` batches; `pinned=True` pins it on append."""
    return pb.NodeInput(message=pb.Message(role=pb.ROLE_USER, parts=_text(text)), pinned=pinned)


def system_message(text: str, *, pinned: bool = False) -> pb.NodeInput:
    """A system message node, for `Client.append` batches; `pinned=True` pins it on append."""
    return pb.NodeInput(message=pb.Message(role=pb.ROLE_SYSTEM, parts=_text(text)), pinned=pinned)


def tool_call(call: ToolCallLike) -> pb.ToolCall:
    """One tool call from a dict; dict arguments are encoded as JSON (the server requires JSON)."""
    if "function" in call:  # OpenAI's shape
        name, arguments = call["function"]["name"], call["function"].get("arguments")
    else:
        name, arguments = call["name"], call.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return pb.ToolCall(call_id=call["id"], name=name, arguments_json=arguments)


def assistant_message(
    text: str = "", tool_calls: Sequence[ToolCallLike] | None = None, *, pinned: bool = False
) -> pb.NodeInput:
    """An assistant message node, with its tool calls, for `Client.append` batches."""
    return pb.NodeInput(
        message=pb.Message(
            role=pb.ROLE_ASSISTANT,
            parts=_text(text),
            tool_calls=[tool_call(c) for c in tool_calls or ()],
        ),
        pinned=pinned,
    )


def tool_result(
    call_id: str, text: str, is_error: bool = False, *, pinned: bool = False
) -> pb.NodeInput:
    """A tool result node answering `call_id`; the server fills in the tool's name."""
    return pb.NodeInput(
        tool_result=pb.ToolResult(call_id=call_id, parts=_text(text), is_error=is_error),
        pinned=pinned,
    )


def _pinned(nodes: Sequence[pb.NodeInput], pinned: bool) -> list[pb.NodeInput]:
    """The nodes, each pinned if `pinned` (copies: the caller's messages stay as they were)."""
    if not pinned:
        return list(nodes)
    copies = []
    for node in nodes:
        copy = pb.NodeInput()
        copy.CopyFrom(node)
        copy.pinned = True
        copies.append(copy)
    return copies


def append_request(
    session_id: str,
    nodes: Sequence[pb.NodeInput],
    branch: str,
    function_id: str | None,
    expected_head_id: str | None,
    idempotency_key: str,
    pinned: bool,
) -> pb.AppendRequest:
    """One AppendRequest, the same for `append` and each request of `append_many`."""
    request = pb.AppendRequest(
        session_id=session_id,
        branch="" if function_id else branch,
        function_id=function_id or "",
        idempotency_key=idempotency_key,
        nodes=_pinned(nodes, pinned),
    )
    if expected_head_id is not None:
        request.expected_head_id = expected_head_id
    return request


def batch_request(
    session_id: str,
    batch: Sequence[pb.NodeInput] | AppendBatch,
    branch: str,
    function_id: str | None,
) -> pb.AppendRequest:
    """The AppendRequest of one batch of `append_many`."""
    if isinstance(batch, AppendBatch):
        return append_request(
            session_id,
            batch.nodes,
            branch,
            function_id,
            batch.expected_head_id,
            batch.idempotency_key,
            batch.pinned,
        )
    if isinstance(batch, pb.NodeInput):
        # A lone node would otherwise fail deep in protobuf with a message naming nothing.
        raise TypeError("each batch of append_many is a list of nodes (or an AppendBatch)")
    return append_request(session_id, batch, branch, function_id, None, "", False)


def appended(r: pb.AppendResponse) -> Appended:
    return Appended(list(r.node_ids), r.head_id, r.head_hash)


class AppendStreamAnswers:
    """What an AppendStream acknowledged so far, checked for order as the responses come."""

    def __init__(self) -> None:
        self.acknowledged: list[Appended] = []

    def add(self, response: pb.AppendStreamResponse) -> None:
        if response.first != len(self.acknowledged):
            raise CtxdError(
                grpc.StatusCode.INTERNAL,
                f"AppendStream acknowledged from request {response.first}, "
                f"after {len(self.acknowledged)} acknowledged",
                self.acknowledged,
            )
        self.acknowledged.extend(appended(a) for a in response.appends)


def note_stored(exc: BaseException, stored: int) -> None:
    """Tells, on an exception raised by the caller's batches, what append_many stored."""
    if hasattr(exc, "add_note"):
        exc.add_note(
            f"ctxd: append_many stored the {stored} batch{'es' * (stored != 1)} yielded before it"
        )


# ---------------------------------------------------------------- request helpers


def _policy(policy: Mapping[str, Any] | None, reactive: bool) -> pb.RenderPolicy:
    fields = dict(policy or {})
    # `reasoning` by its short name, as every other enum here; the enum's values pass as they
    # are (the server refuses one it does not know, naming `policy.reasoning`).
    reasoning = fields.get("reasoning")
    if isinstance(reasoning, str):
        fields["reasoning"] = choice(_REASONING, reasoning, "policy.reasoning")
    p = pb.RenderPolicy(**fields)
    if reactive:
        p.reactive = True
    return p


def _target(request: Any, branch: str, node_id: str | None, function_id: str | None) -> None:
    if function_id:
        request.function_id = function_id
    elif node_id:
        request.node_id = node_id
    else:
        request.branch = branch


def _document(text: str, rpc: str, field: str) -> Any:
    # An empty field for a provider format means a server that predates provider formats:
    # failing loudly beats handing a model an empty conversation.
    if not text:
        raise CtxdError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{rpc} answered no {field}; the server does not support provider formats",
        )
    return json.loads(text)


def _compaction_id(compaction: Compaction | str) -> str:
    return compaction.compaction_id if isinstance(compaction, Compaction) else compaction


# ---------------------------------------------------------------- sessions


def create_session(
    metadata: Mapping[str, str] | None = None, *, idempotency_key: str = ""
) -> Exchange[Session]:
    """A new session with an empty `main` branch.

    With `idempotency_key`, a retry (after a lost answer, say) returns the session the first
    call created instead of a second one.
    """
    request = pb.CreateSessionRequest(metadata=metadata or {}, idempotency_key=idempotency_key)
    return Session.from_pb((yield "CreateSession", request))


def get_session(session: SessionRef) -> Exchange[Session]:
    """The session as stored now (branches, heads, compaction count, gateway usage)."""
    return Session.from_pb(
        (yield "GetSession", pb.GetSessionRequest(session_id=session_id(session)))
    )


def list_sessions(
    page_size: int = 0,
    page_token: str = "",
    *,
    id_prefix: str = "",
    metadata: Mapping[str, str] | None = None,
) -> Exchange[SessionPage]:
    """One page of the sessions (the caller's tenant's), newest first: `page_size` of them (0:
    the server's default, 50; at most 1000). Pass the page's `next_page_token` for the next one;
    it is empty on the last page.

    The filters keep the sessions matching all of them: `id_prefix`, those whose id starts with
    it (`0193f2a1-7`; upper-case hex is accepted, a prefix no UUID can start with raises
    `InvalidArgument`); `metadata`, those whose metadata holds every one of its pairs exactly (at
    most 16). Ask for the next page with the same filter."""
    request = pb.ListSessionsRequest(
        page_size=page_size, page_token=page_token, id_prefix=id_prefix, metadata=metadata or {}
    )
    r = yield "ListSessions", request
    return SessionPage([Session.from_pb(s) for s in r.sessions], r.next_page_token)


def list_gateway_calls(
    session: SessionRef, page_size: int = 0, page_token: str = ""
) -> Exchange[GatewayCallPage]:
    """One page of the model gateway's calls of the session, in the order they were made (newest
    last): `page_size` of them (0: the server's default, 100; at most 1000). Pass the page's
    `next_page_token` for the next one; it is empty on the last page. Each call says what the
    client sent and what was forwarded, what the provider's cache read and wrote, how much of the
    forwarded request was kept from the previous one (`kept_tokens`) and why it changed
    (`change`), and flags an `unexplained_miss`. A session the gateway never served has none; an
    unknown session raises `NotFound`, a bad `page_token` `InvalidArgument`."""
    request = pb.ListGatewayCallsRequest(
        session_id=session_id(session), page_size=page_size, page_token=page_token
    )
    r = yield "ListGatewayCalls", request
    return GatewayCallPage([GatewayCall.from_pb(c) for c in r.calls], r.next_page_token)


def delete_session(session: SessionRef) -> Exchange[DeletedSession]:
    """Deletes the session for good: its nodes, branches, summaries, pins and events, and every
    content blob no other session refers to. Returns its tombstone (who, when, how many nodes);
    deleting it again returns the same tombstone with `already_deleted=True`. An unknown session
    (or another tenant's) raises `NotFound`; a compaction open on it ends `stale`."""
    r = yield "DeleteSession", pb.DeleteSessionRequest(session_id=session_id(session))
    return DeletedSession.from_pb(r)


# ---------------------------------------------------------------- appends


def append(
    session: SessionRef,
    nodes: Sequence[pb.NodeInput],
    branch: str = "main",
    *,
    function_id: str | None = None,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """Appends nodes atomically and in order, to `branch` or into a running function's chain.

    `expected_head_id` makes the append a compare-and-swap (`""`: the target has no head yet;
    a lost race raises `Conflict`); a retry with the same `idempotency_key` returns the first
    answer and writes nothing. `pinned=True` pins every node of the batch (a node built with
    `pinned=True` is pinned either way): see `pin`.
    """
    request = append_request(
        session_id(session), nodes, branch, function_id, expected_head_id, idempotency_key, pinned
    )
    return appended((yield "Append", request))


def append_user(
    session: SessionRef,
    text: str,
    branch: str = "main",
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """Appends a user message (`expected_head_id`, `idempotency_key`, `pinned`: see `append`)."""
    return (
        yield from append(
            session,
            [user_message(text, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )


def append_assistant(
    session: SessionRef,
    text: str = "",
    tool_calls: Sequence[ToolCallLike] | None = None,
    branch: str = "main",
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """Appends an assistant message; until each tool call is answered, nothing else fits."""
    return (
        yield from append(
            session,
            [assistant_message(text, tool_calls, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )


def append_tool_result(
    session: SessionRef,
    call_id: str,
    text: str,
    is_error: bool = False,
    branch: str = "main",
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """Answers one pending tool call of the latest assistant message."""
    return (
        yield from append(
            session,
            [tool_result(call_id, text, is_error, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )


# ---------------------------------------------------------------- reading


def get_nodes(session: SessionRef, *node_ids: str) -> Exchange[list[Node]]:
    """The nodes with these ids, in the order asked (function chains' nodes too). An id the
    session does not have raises `NotFound`."""
    request = pb.GetNodesRequest(session_id=session_id(session), node_ids=list(node_ids))
    return [Node.from_pb(n) for n in (yield "GetNodes", request).nodes]


def log(
    session: SessionRef,
    branch: str = "main",
    *,
    node_id: str | None = None,
    limit: int = 100,
) -> Exchange[list[Node]]:
    """Up to `limit` nodes walking parent links from the branch head (or `node_id`), newest
    first, like `git log`; pages are followed for you."""
    nodes: list[Node] = []
    token = ""
    while len(nodes) < limit:
        request = pb.LogRequest(
            session_id=session_id(session),
            branch="" if node_id else branch,
            node_id=node_id or "",
            limit=min(limit - len(nodes), 1000),
            page_token=token,
        )
        r = yield "Log", request
        nodes.extend(Node.from_pb(n) for n in r.nodes)
        token = r.next_page_token
        if not token or not r.nodes:
            break
    return nodes


# ---------------------------------------------------------------- branches


def create_branch(
    session: SessionRef, name: str, from_node_id: str | None = None
) -> Exchange[Branch]:
    """A new branch at `from_node_id` (None: a branch with no head). Forking never copies."""
    request = pb.CreateBranchRequest(
        session_id=session_id(session), name=name, from_node_id=from_node_id or ""
    )
    return Branch.from_pb((yield "CreateBranch", request))


def list_branches(session: SessionRef) -> Exchange[list[Branch]]:
    """Every branch of the session with its head."""
    r = yield "ListBranches", pb.ListBranchesRequest(session_id=session_id(session))
    return [Branch.from_pb(b) for b in r.branches]


def delete_branch(session: SessionRef, name: str) -> Exchange[None]:
    """Removes the branch (the ref only: its nodes stay, reachable by id and from other
    branches). An unknown branch raises `NotFound`."""
    yield "DeleteBranch", pb.DeleteBranchRequest(session_id=session_id(session), name=name)


def reset_branch(
    session: SessionRef,
    name: str,
    to_node_id: str | None,
    *,
    expected_head_id: str | None = None,
) -> Exchange[Branch]:
    """Moves branch `name` to `to_node_id` (a top-level node; None: no head), like
    `git reset`: no node changes. With `expected_head_id` (`""`: none), only if the head is
    still that one, else `Conflict`."""
    request = pb.ResetBranchRequest(
        session_id=session_id(session), name=name, to_node_id=to_node_id or ""
    )
    if expected_head_id is not None:
        request.expected_head_id = expected_head_id
    return Branch.from_pb((yield "ResetBranch", request))


# ---------------------------------------------------------------- pins


def pin(session: SessionRef, *node_ids: str) -> Exchange[list[str]]:
    """Pins nodes: no render step ever reduces them, and a summary covering one shows it
    verbatim right after the summary. Idempotent; nodes stay immutable. Returns every
    pinned node of the session after the call, oldest pin first."""
    request = pb.PinRequest(session_id=session_id(session), node_ids=list(node_ids))
    return list((yield "Pin", request).pinned_ids)


def unpin(session: SessionRef, *node_ids: str) -> Exchange[list[str]]:
    """Unpins nodes; returns every node of the session still pinned."""
    request = pb.PinRequest(session_id=session_id(session), node_ids=list(node_ids))
    return list((yield "Unpin", request).pinned_ids)


# ---------------------------------------------------------------- rendering


def render(
    session: SessionRef,
    budget: BudgetLike | None = None,
    tokenizer: str = "heuristic",
    format: Format = "openai",
    branch: str = "main",
    policy: Mapping[str, Any] | None = None,
    reactive: bool = False,
    *,
    node_id: str | None = None,
    function_id: str | None = None,
    callers: Callers = "all",
    now_unix_ms: int = 0,
    last_call_unix_ms: int = 0,
    strict_format: bool = False,
    model: str = "",
) -> Exchange[RenderResult]:
    """The context of the next model request, fitted to `budget`, with a report.

    `budget` is a context window (int) or a dict of the five budget parts; None renders
    everything untouched. `policy` holds `RenderPolicy` fields; `reactive=True` is for a
    provider that just refused the request as too long. The target is `branch` unless
    `node_id` or `function_id` (a running sub-agent's chain) is given. A media part the
    format cannot carry where it stands is sent as `[<mime> attachment]` text and listed in
    `uncarried`; with `strict_format=True` the render is refused instead (`InvalidArgument`
    naming the node). `last_call_unix_ms` is when the host last sent this context to the model:
    a render more than the cache's lifetime (5 minutes) after it takes a step, which is free then.

    `model` is the model the context is for (`"claude-opus-5-5"`, `"gpt-5"`, ...): its cache
    prices and lifetime weigh every step (`policy` may set `cache_read_price` and
    `cache_write_price` itself, each between 0 and 100), and the report's `priced_by` names the
    model table's entry. For a model that binds its thinking to its prefix (Anthropic's current
    models) an Anthropic document never holds a thinking block after content the render changed:
    with `policy={"reasoning": "keep"}` (the default) a step is the provider's own edit, in the
    document's `context_management` (sent with the `anthropic-beta` values of `betas`; the
    report's `edit_clear` and `edit_keep`); with `"drop"` the thinking a step invalidated is left
    out (the report's `thinking_dropped`).
    """
    request = pb.RenderRequest(
        session_id=session_id(session),
        tokenizer=tokenizer,
        callers=choice(_CALLERS, callers, "callers"),
        policy=_policy(policy, reactive),
        now_unix_ms=now_unix_ms,
        last_call_unix_ms=last_call_unix_ms,
        format=choice(_FORMATS, format, "format"),
        strict_format=strict_format,
        model=model,
    )
    _target(request, branch, node_id, function_id)
    if budget is not None:
        request.budget.CopyFrom(budget_pb(budget))
    r = yield "Render", request
    if format == "neutral":
        messages: Any = [neutral_message(m) for m in r.messages]
    else:
        messages = _document(r.messages_json, "Render", "messages_json")
    return RenderResult(
        messages=messages,
        report=ContextReport.from_pb(r.report),
        format=format,
        head_id=r.head_id,
        head_hash=r.head_hash,
        total_tokens=r.total_tokens,
        tokenizer=r.tokenizer,
        uncarried=[UncarriedPart(u.node_id, u.part_index, u.mime_type) for u in r.uncarried],
        betas=list(r.betas),
        raw=r,
    )


def context_stats(
    session: SessionRef,
    budget: BudgetLike | None = None,
    tokenizer: str = "heuristic",
    branch: str = "main",
    policy: Mapping[str, Any] | None = None,
    reactive: bool = False,
    *,
    node_id: str | None = None,
    function_id: str | None = None,
    callers: Callers = "all",
    now_unix_ms: int = 0,
    last_call_unix_ms: int = 0,
    model: str = "",
) -> Exchange[ContextReport]:
    """The report `render` would give, without the messages: for a context panel. `model` as
    for `render`."""
    request = pb.ContextStatsRequest(
        session_id=session_id(session),
        tokenizer=tokenizer,
        callers=choice(_CALLERS, callers, "callers"),
        policy=_policy(policy, reactive),
        now_unix_ms=now_unix_ms,
        last_call_unix_ms=last_call_unix_ms,
        model=model,
    )
    _target(request, branch, node_id, function_id)
    if budget is not None:
        request.budget.CopyFrom(budget_pb(budget))
    return ContextReport.from_pb((yield "ContextStats", request))


# ---------------------------------------------------------------- recall


def recall(session: SessionRef, reference: str, max_chars: int | None = None) -> Exchange[Recalled]:
    """The original content of what a render cleared, cut or stubbed, by the reference its
    placeholder names (the 12 hexadecimal characters after `recall`, e.g.
    `[cleared to save context: recall 3f9a2c1b7d04]`).

    A tool result's text comes back exactly. Content longer than `max_chars` (server default
    20,000, at most 200,000) comes back as its head, with `truncated=True`. A reference no node
    of this session has (another session's included) raises `NotFound`; a malformed one
    `InvalidArgument` naming `reference`. To answer a model's call of the recall tool, see
    `handle_recall`.
    """
    request = pb.RecallRequest(
        session_id=session_id(session), reference=reference, max_chars=max_chars or 0
    )
    return Recalled.from_pb((yield "Recall", request))


def recall_tool() -> Exchange[RecallToolDefinitions]:
    """The recall tool's definition in the three API shapes, as the server gives it. The same
    definition is a constant of this package (`recall_tool_definition`), so registering the
    tool needs no call."""
    r = yield "RecallTool", pb.RecallToolRequest()
    return RecallToolDefinitions(
        name=r.name,
        anthropic=json.loads(r.anthropic_json),
        openai=json.loads(r.openai_json),
        responses=json.loads(r.responses_json),
        raw=r,
    )


# ---------------------------------------------------------------- summaries


def prepare_compaction(
    session: SessionRef,
    budget: BudgetLike,
    branch: str = "main",
    *,
    tokenizer: str = "heuristic",
    retain_turns: int = 0,
    instructions: str = "",
    max_tool_result_chars: int = 0,
    format: Format = "openai",
    from_node_id: str | None = None,
    to_node_id: str | None = None,
    cache_sharing_request: bool = False,
    policy: Mapping[str, Any] | None = None,
) -> Exchange[Compaction]:
    """Plans a summary that would make the branch fit `budget`, and returns what a
    summarizer should read (in `format`). Zeros mean the server's defaults.

    With `from_node_id` and `to_node_id` (both or neither) it plans a *segment* summary
    instead: exactly the nodes from one to the other, inclusive, on the branch's path. The
    segment must be whole (no tool call apart from its result) and may contain earlier
    summaries whole but not overlap one partly; else `InvalidArgument` naming the field.

    With `cache_sharing_request=True` (rolling summaries), the plan also carries
    `summary_request`: the context exactly as `render` gives it with `policy` (the
    `RenderPolicy` fields of your renders), then one user message asking for the summary, so
    the summarizing call reads your cached prefix instead of writing the range anew.
    """
    request = pb.PrepareCompactionRequest(
        session_id=session_id(session),
        branch=branch,
        budget=budget_pb(budget),
        tokenizer=tokenizer,
        retain_turns=retain_turns,
        instructions=instructions,
        max_tool_result_chars=max_tool_result_chars,
        format=choice(_FORMATS, format, "format"),
        from_node_id=from_node_id or "",
        to_node_id=to_node_id or "",
        cache_sharing_request=cache_sharing_request,
    )
    if policy is not None:
        request.policy.CopyFrom(_policy(policy, False))
    r = yield "PrepareCompaction", request
    if format == "neutral":
        summary_input: Any = [neutral_message(m) for m in r.summary_input]
    elif r.needed or r.summary_input_json:
        summary_input = _document(r.summary_input_json, "PrepareCompaction", "summary_input_json")
    else:
        summary_input = []
    summary_request: Any = None
    if format == "neutral" and r.summary_request:
        summary_request = [neutral_message(m) for m in r.summary_request]
    elif r.summary_request_json:
        summary_request = json.loads(r.summary_request_json)
    return Compaction(
        needed=r.needed,
        compaction_id=r.compaction_id,
        base_head_id=r.base_head_id,
        covers_ids=list(r.covers_ids),
        prior_summary_id=r.prior_summary_id,
        summary_input=summary_input,
        tokens_before=r.tokens_before,
        input_tokens=r.input_tokens,
        reason=r.reason,
        history_budget=r.history_budget,
        retained_turns=r.retained_turns,
        format=format,
        kind=summary_kind(r.kind),
        rolls_over_ids=list(r.rolls_over_ids),
        ledger=ledger_or_none(r),
        ledger_text=r.ledger_text,
        raw=r,
        summary_request=summary_request,
    )


def commit_summary(compaction: Compaction | str, text: str, model: str) -> Exchange[Outcome]:
    """Lays the summary over the prepared range if that strictly shrinks the context; a
    summary that would not is answered (`applied=False`, `reason`), not raised."""
    request = pb.CommitSummaryRequest(
        compaction_id=_compaction_id(compaction), text=text, model=model
    )
    return Outcome.from_pb((yield "CommitSummary", request))


def cancel_compaction(compaction: Compaction | str, reason: str = "") -> Exchange[None]:
    """Records that a prepared compaction will not be committed."""
    yield (
        "CancelCompaction",
        pb.CancelCompactionRequest(compaction_id=_compaction_id(compaction), reason=reason),
    )


def compact(
    session: SessionRef,
    budget: BudgetLike,
    branch: str = "main",
    *,
    tokenizer: str = "heuristic",
    retain_turns: int = 0,
    instructions: str = "",
    max_tool_result_chars: int = 0,
    from_node_id: str | None = None,
    to_node_id: str | None = None,
    request_form: RequestForm | None = None,
    policy: Mapping[str, Any] | None = None,
) -> Exchange[Outcome]:
    """Prepare, the server's own summarizer, and commit in one call; needs a server started
    with `--summarizer-url` (else `FailedPrecondition`). `from_node_id` and `to_node_id`
    make a segment summary, as in `prepare_compaction`.

    `request_form` is how the summarizer is asked: `"cache_sharing"` (the context as your
    renders give it with `policy`, then the instruction) or `"range"` (the covered range
    alone). None: the server's choice (cache sharing for a rolling summary that fits the
    summarizer's window)."""
    request = pb.CompactRequest(
        session_id=session_id(session),
        branch=branch,
        budget=budget_pb(budget),
        tokenizer=tokenizer,
        retain_turns=retain_turns,
        instructions=instructions,
        max_tool_result_chars=max_tool_result_chars,
        from_node_id=from_node_id or "",
        to_node_id=to_node_id or "",
    )
    if request_form is not None:
        request.request_form = choice(_REQUEST_FORMS, request_form, "request_form")
    if policy is not None:
        request.policy.CopyFrom(_policy(policy, False))
    return Outcome.from_pb((yield "Compact", request))


def list_summaries(session: SessionRef, branch: str = "main") -> Exchange[Summaries]:
    """Every summary of the session and every compaction event: the audit trail."""
    r = yield (
        "ListSummaries",
        pb.ListSummariesRequest(session_id=session_id(session), branch=branch),
    )
    return Summaries(
        summaries=[SummaryRecord.from_pb(s) for s in r.summaries],
        events=[CompactionEvent.from_pb(e) for e in r.events],
    )


# ---------------------------------------------------------------- admin


def backup_database(to: str | os.PathLike[str]) -> Exchange[Backup]:
    """Admin: copies the server's SQLite database online, consistent at one moment, into a new
    file `to`: an absolute path on the server's machine that must not exist yet (else
    `AlreadyExists`), in a directory that does. On a server with keys, a key without `admin`
    raises a `CtxdError` with code PERMISSION_DENIED (as does `collect_garbage`)."""
    r = yield "BackupDatabase", pb.BackupDatabaseRequest(to=os.fspath(to))
    return Backup(path=r.path, bytes=r.bytes, took_ms=r.took_ms)


def collect_garbage() -> Exchange[GarbageCollection]:
    """Admin: gives the space deleted sessions left back to the operating system, and reports
    the store's size (sessions, tombstones, database and free bytes, bytes released)."""
    r = yield "CollectGarbage", pb.CollectGarbageRequest()
    return GarbageCollection(
        sessions=r.sessions,
        tombstones=r.tombstones,
        database_bytes=r.database_bytes,
        free_bytes=r.free_bytes,
        released_bytes=r.released_bytes,
    )


# ---------------------------------------------------------------- import and export


def export_request(
    session: SessionRef, format: ExportFormat, branch: str
) -> pb.ExportSessionRequest:
    return pb.ExportSessionRequest(
        session_id=session_id(session),
        format=choice(EXPORT_FORMATS, format, "format"),
        branch=branch,
    )


@contextmanager
def import_data(source: ImportSource) -> Iterator[Iterator[bytes]]:
    """The bytes of an import source as chunks; a path is opened here (so a missing file fails
    before any call) and closed on leaving."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        yield (data[i : i + IMPORT_CHUNK_BYTES] for i in range(0, len(data), IMPORT_CHUNK_BYTES))
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            yield iter(lambda: file.read(IMPORT_CHUNK_BYTES), b"")
    elif hasattr(source, "read"):
        yield iter(lambda: source.read(IMPORT_CHUNK_BYTES), b"")  # type: ignore[union-attr]
    else:
        yield iter(source)


class ImportFeed:
    """The ImportChunks of a file, for the request stream of ImportSession.

    The format, metadata and key ride on the first chunk only (the server reads them there); it
    is built at once, so a bad `format` fails before any call, and sent even for an empty file
    so the server answers it. An exception raised while reading the file is kept and re-raised
    into gRPC, which cancels the call (the server writes nothing); `raise_failure` then gives
    the caller that exception instead of the CANCELLED it caused.
    """

    def __init__(
        self,
        data: Iterable[bytes],
        format: ImportFormat,
        metadata: Mapping[str, str] | None,
        idempotency_key: str,
    ) -> None:
        self._data = data
        self._first = pb.ImportChunk(
            format=choice(_IMPORT_FORMATS, format, "format"),
            metadata=metadata or {},
            idempotency_key=idempotency_key,
        )
        self.failure: Exception | None = None

    def __iter__(self) -> Iterator[pb.ImportChunk]:
        first: pb.ImportChunk | None = self._first
        try:
            for piece in self._data:
                if not isinstance(piece, (bytes, bytearray, memoryview)):
                    raise TypeError(f"import data must be bytes, not {type(piece).__name__}")
                if first is not None:
                    first.data = bytes(piece)
                    yield first
                    first = None
                elif piece:
                    yield pb.ImportChunk(data=bytes(piece))
        except Exception as e:
            self.failure = e
            raise
        if first is not None:
            yield first

    def raise_failure(self) -> None:
        """Raises the exception reading the file raised, if it did."""
        if self.failure is not None:
            raise self.failure


class ExportWriter:
    """Writes an export's chunks to `to`: a path, whole or not at all (the chunks go to a
    temporary file beside it, renamed over it when the export ends, removed if it fails), or a
    binary file open for writing (left open)."""

    def __init__(self, to: str | os.PathLike[str] | IO[bytes], format: str) -> None:
        self._to = to
        self._format = format
        self._path: str | None = None
        self._partial = ""
        self._file: IO[bytes] | None = None
        self._first: ExportChunk | None = None
        self._bytes = 0

    def __enter__(self) -> ExportWriter:
        if isinstance(self._to, (str, os.PathLike)):
            self._path = os.fspath(self._to)
            directory = os.path.dirname(os.path.abspath(self._path))
            fd, self._partial = tempfile.mkstemp(prefix=".ctxd-export-", dir=directory)
            self._file = os.fdopen(fd, "wb")
        return self

    def write(self, chunk: ExportChunk) -> None:
        if self._first is None:
            self._first = chunk
        (self._file or self._to).write(chunk.data)  # type: ignore[union-attr]
        self._bytes += len(chunk.data)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if self._file is None:
            return
        self._file.close()
        if exc_type is None:
            os.replace(self._partial, self._path)  # type: ignore[arg-type]
        else:
            os.unlink(self._partial)

    def exported(self) -> Exported:
        first = self._first
        return Exported(
            path=self._path,
            bytes=self._bytes,
            format=self._format,
            branches=first.branches if first else [],
            warnings=first.warnings if first else [],
        )


# ---------------------------------------------------------------- watch


# Codes after which a watch resumes from its cursor: the connection dropped or the server went
# away (UNAVAILABLE, its shutdown included), or the server ended a watcher that fell behind
# (RESOURCE_EXHAUSTED names the cursor to resume from). Any other code is the caller's to see.
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


class WatchState:
    """Where a watch is, so that a new call resumes it with no gap and no duplicate.

    Each event passed on moves the cursor; a new call asks for what follows it. The server opens
    every stream, resumed ones too, with a `started` event at the cursor already passed on:
    after a resume that one is not news and is dropped, so the caller sees one stream.
    """

    def __init__(
        self,
        session: SessionRef,
        branch: str,
        after_cursor: str,
        after_node_id: str,
        reconnect_attempts: int,
    ) -> None:
        self.first = pb.WatchRequest(
            session_id=session_id(session),
            branch=branch,
            after_cursor=after_cursor,
            after_node_id=after_node_id,
        )
        self.cursor = ""
        self.reconnect_attempts = reconnect_attempts
        self.failures = 0
        """Calls failed since an event was last passed on."""
        self.resumes = 0
        self._drop_started = False

    def request(self) -> pb.WatchRequest:
        """The request for the next call: the first one, or a resume after the cursor."""
        if not self.cursor:
            return self.first
        self._drop_started = True
        return pb.WatchRequest(
            session_id=self.first.session_id, branch=self.first.branch, after_cursor=self.cursor
        )

    def accept(self, response: pb.WatchEvent) -> WatchEvent | None:
        """The event to pass on, or None for a resumed stream's `started`."""
        resumed_start = self._drop_started and response.WhichOneof("event") == "started"
        self._drop_started = False
        if resumed_start:
            return None
        self.cursor = response.cursor
        self.failures = 0
        return WatchEvent.from_pb(response)

    def retry_after(self, error: CtxdError) -> float | None:
        """Seconds to wait before resuming after `error`, or None to raise it."""
        if error.code not in RESUMABLE or self.failures >= self.reconnect_attempts:
            return None
        self.failures += 1
        self.resumes += 1
        # The first retry is at once (a dropped connection is usually back); then doubling,
        # capped, so a restarting server is waited for without a busy loop.
        return 0.0 if self.failures == 1 else min(0.1 * 2 ** (self.failures - 2), 5.0)


# ---------------------------------------------------------------- connection


def channel_credentials(
    has_channel: bool,
    tls: bool,
    root_certificates: bytes | None,
    private_key: bytes | None,
    certificate_chain: bytes | None,
) -> grpc.ChannelCredentials | None:
    """The TLS credentials the options ask for (None: plaintext), after checking they agree."""
    secure = tls or any(
        pem is not None for pem in (root_certificates, private_key, certificate_chain)
    )
    if has_channel and secure:
        raise ValueError("pass either a channel or TLS options, not both")
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("private_key and certificate_chain go together")
    if not secure:
        return None
    return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)


def bearer_header(api_key: str) -> tuple[str, str]:
    """The `authorization` header carrying `api_key`."""
    # A key travels in an HTTP header: visible ASCII, no spaces.
    if not api_key or not all(33 <= ord(c) <= 126 for c in api_key):
        raise ValueError("api_key must be non-empty visible ASCII")
    return ("authorization", f"Bearer {api_key}")


# ---------------------------------------------------------------- sub-agent calls


class FunctionScope:
    """The state of a sub-agent (function) call, shared by `FunctionCall` and
    `AsyncFunctionCall`; the `fn_*` exchanges below act on it."""

    def __init__(
        self,
        client: Any,
        session_id: str,
        call_id: str,
        input: str,
        expose: Expose = "io",
        *,
        branch: str = "main",
        parent_function_id: str | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.call_id = call_id
        self.input = input
        self.expose = choice(_EXPOSE, expose, "expose")
        self.branch = branch
        self.parent_function_id = parent_function_id
        self.function_id = ""
        """The function_call node's id, set on entering: render it with `function_id=`."""
        self.output = ""
        """Set it before the block ends: what the caller sees as the call's result."""
        self.result: Appended | None = None
        """After the block: the append of the function_result."""


def _append_caller(scope: FunctionScope, node: pb.NodeInput) -> Exchange[Appended]:
    # The call and its result go on the caller's chain: a branch, or the enclosing function.
    return (
        yield from append(
            scope.session_id, [node], scope.branch, function_id=scope.parent_function_id
        )
    )


def fn_open(scope: FunctionScope) -> Exchange[None]:
    """Appends the function_call on the caller's chain."""
    call = pb.FunctionCall(call_id=scope.call_id, input=scope.input, expose=scope.expose)
    scope.function_id = (yield from _append_caller(scope, pb.NodeInput(function_call=call))).node_id


def _close(scope: FunctionScope, status: pb.FunctionStatus, output: str) -> Exchange[None]:
    result = pb.FunctionResult(call_id=scope.call_id, output=output, status=status)
    scope.result = yield from _append_caller(scope, pb.NodeInput(function_result=result))


def fn_close(scope: FunctionScope, failure: str | None) -> Exchange[None]:
    """Appends the function_result: completed, or (`failure` given) an error, after answering
    the calls the sub-agent left pending."""
    if failure is None:
        # A clean exit with unanswered calls inside is a bug in the caller: let the server's
        # FailedPrecondition say so.
        yield from _close(scope, pb.FUNCTION_STATUS_COMPLETED, scope.output)
        return
    # A sub-agent that dies mid-tool-call leaves calls unanswered, and the server will not
    # close a function over them; left open, the caller's session could never go on.
    text = f"not run: the sub-agent stopped ({failure})"
    chain = (
        yield from render(
            scope.session_id, function_id=scope.function_id, callers="none", format="neutral"
        )
    ).messages
    answered: set[str] = set()
    pending: list[str] = []
    for m in reversed([m for m in chain if m.get("function_id") == scope.function_id]):
        if m["role"] == "tool":
            answered.add(m["tool_call_id"])
            continue
        if m["role"] == "assistant":
            pending = [c["id"] for c in m.get("tool_calls", []) if c["id"] not in answered]
        break
    if pending:
        yield from fn_append(
            scope, [tool_result(call_id, text, is_error=True) for call_id in pending]
        )
    yield from _close(scope, pb.FUNCTION_STATUS_ERROR, scope.output or failure)


def fn_append(
    scope: FunctionScope,
    nodes: Sequence[pb.NodeInput],
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """Appends nodes to this function's own chain (see `Client.append`)."""
    if not scope.function_id:
        raise RuntimeError("the function call has not started: use it in a `with` block")
    return (
        yield from append(
            scope.session_id,
            nodes,
            function_id=scope.function_id,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
            pinned=pinned,
        )
    )


def fn_append_user(
    scope: FunctionScope,
    text: str,
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """A user message in the function's chain (typically the sub-agent's task)."""
    return (
        yield from fn_append(
            scope,
            [user_message(text, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )


def fn_append_assistant(
    scope: FunctionScope,
    text: str = "",
    tool_calls: Sequence[ToolCallLike] | None = None,
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """An assistant message in the function's chain."""
    return (
        yield from fn_append(
            scope,
            [assistant_message(text, tool_calls, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )


def fn_append_tool_result(
    scope: FunctionScope,
    call_id: str,
    text: str,
    is_error: bool = False,
    *,
    expected_head_id: str | None = None,
    idempotency_key: str = "",
    pinned: bool = False,
) -> Exchange[Appended]:
    """A tool result in the function's chain."""
    return (
        yield from fn_append(
            scope,
            [tool_result(call_id, text, is_error, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )
    )
