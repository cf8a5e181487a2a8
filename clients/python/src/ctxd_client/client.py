"""A thin, typed wrapper over the `ctxd.v1.ContextStore` gRPC service.

The wrapper adds only what every agent host would otherwise write itself: plain arguments instead
of protobuf messages, provider documents parsed from JSON, dataclasses for answers, exceptions
that keep the server's message, and a context manager that closes a sub-agent call even when the
sub-agent fails. Anything it does not cover is one call away on `Client.stub`.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import grpc

from ._proto import ctxd_pb2 as pb
from ._proto import ctxd_pb2_grpc as pb_grpc
from .errors import CtxdError, from_rpc_error
from .types import (
    AppendBatch,
    Appended,
    Branch,
    BudgetLike,
    Compaction,
    CompactionEvent,
    ContextReport,
    Node,
    Outcome,
    Recalled,
    RecallToolDefinitions,
    RenderResult,
    UncarriedPart,
    Session,
    Summaries,
    SummaryRecord,
    budget_pb,
    ledger_or_none,
    neutral_message,
    summary_kind,
)

T = TypeVar("T")

SessionRef = Session | str
"""A `Session` or its id."""

Format = Literal["openai", "anthropic", "neutral"]
Expose = Literal["io", "full", "none"]
Callers = Literal["all", "none"]
ToolCallLike = Mapping[str, Any]
"""`{"id", "name", "arguments"}` (arguments a dict or a JSON string), or an OpenAI tool call
`{"id", "type": "function", "function": {"name", "arguments"}}` as a model returned it."""

_FORMATS: dict[str, pb.Format] = {
    "neutral": pb.FORMAT_NEUTRAL,
    "openai": pb.FORMAT_OPENAI_CHAT,
    "anthropic": pb.FORMAT_ANTHROPIC_MESSAGES,
}
_EXPOSE: dict[str, pb.Expose] = {"io": pb.EXPOSE_IO, "full": pb.EXPOSE_FULL, "none": pb.EXPOSE_NONE}
_CALLERS: dict[str, pb.Callers] = {"all": pb.CALLERS_ALL, "none": pb.CALLERS_NONE}
RequestForm = Literal["cache_sharing", "range"]
_REQUEST_FORMS: dict[str, pb.SummaryRequestForm] = {
    "cache_sharing": pb.SUMMARY_REQUEST_FORM_CACHE_SHARING,
    "range": pb.SUMMARY_REQUEST_FORM_RANGE,
}


def _choice(table: Mapping[str, T], value: str, what: str) -> T:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {', '.join(table)}, not {value!r}") from None


def _session_id(session: SessionRef) -> str:
    return session.id if isinstance(session, Session) else session


def _text(text: str) -> list[pb.ContentPart]:
    # An empty text is no part at all: an assistant turn that only calls tools has no text.
    return [pb.ContentPart(text=text)] if text else []


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _BearerKey(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <key>` to every call, whatever its kind."""

    def __init__(self, api_key: str) -> None:
        # A key travels in an HTTP header: visible ASCII, no spaces.
        if not api_key or not all(33 <= ord(c) <= 126 for c in api_key):
            raise ValueError("api_key must be non-empty visible ASCII")
        self._header = ("authorization", f"Bearer {api_key}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._header],
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Any, details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(
        self, continuation: Any, details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(
        self, continuation: Any, details: grpc.ClientCallDetails, requests: Any
    ) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(
        self, continuation: Any, details: grpc.ClientCallDetails, requests: Any
    ) -> Any:
        return continuation(self._details(details), requests)


# ---------------------------------------------------------------- node builders


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


def _append_request(
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


def _batch_request(
    session_id: str,
    batch: Sequence[pb.NodeInput] | AppendBatch,
    branch: str,
    function_id: str | None,
) -> pb.AppendRequest:
    if isinstance(batch, AppendBatch):
        return _append_request(
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
    return _append_request(session_id, batch, branch, function_id, None, "", False)


def _appended(r: pb.AppendResponse) -> Appended:
    return Appended(list(r.node_ids), r.head_id, r.head_hash)


# ---------------------------------------------------------------- the client


class Client:
    """A connection to a ctxd server. Use it as a context manager so the channel gets closed.

    `timeout` is the deadline in seconds for each call (None: no deadline). `api_key` is sent as
    `authorization: Bearer <key>` with every call, the generated `stub`'s included. TLS is on
    when `tls=True` or any of `root_certificates` (PEM bytes of the CA to trust; the system's
    roots without it), `private_key` and `certificate_chain` (PEM bytes of a client certificate,
    for a server that requires one) is given. Pass `channel` to use a channel you configured
    yourself; the client then leaves closing it to you (`api_key` still applies).
    """

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        secure = tls or any(
            pem is not None for pem in (root_certificates, private_key, certificate_chain)
        )
        if channel is not None and secure:
            raise ValueError("pass either a channel or TLS options, not both")
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("private_key and certificate_chain go together")
        bearer = _BearerKey(api_key) if api_key is not None else None
        self._owns_channel = channel is None
        if channel is None:
            if secure:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates, private_key, certificate_chain
                )
                channel = grpc.secure_channel(address, credentials)
            else:
                channel = grpc.insecure_channel(address)
        self._channel = channel
        if bearer is not None:
            channel = grpc.intercept_channel(channel, bearer)
        self.stub = pb_grpc.ContextStoreStub(channel)
        """The generated stub, for the RPCs this wrapper does not cover (ImportSession, ...)."""

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, rpc: str, request: Any) -> Any:
        try:
            return getattr(self.stub, rpc)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    # ------------------------------------------------------------ sessions and appends

    def create_session(
        self, metadata: Mapping[str, str] | None = None, *, idempotency_key: str = ""
    ) -> Session:
        """A new session with an empty `main` branch.

        With `idempotency_key`, a retry (after a lost answer, say) returns the session the
        first call created instead of a second one.
        """
        request = pb.CreateSessionRequest(metadata=metadata or {}, idempotency_key=idempotency_key)
        return Session.from_pb(self._call("CreateSession", request))

    def get_session(self, session: SessionRef) -> Session:
        """The session as stored now (branches, heads, compaction count)."""
        return Session.from_pb(
            self._call("GetSession", pb.GetSessionRequest(session_id=_session_id(session)))
        )

    def append(
        self,
        session: SessionRef,
        nodes: Sequence[pb.NodeInput],
        branch: str = "main",
        *,
        function_id: str | None = None,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """Appends nodes atomically and in order, to `branch` or into a running function's chain.

        `expected_head_id` makes the append a compare-and-swap (`""`: the target has no head yet;
        a lost race raises `Conflict`); a retry with the same `idempotency_key` returns the first
        answer and writes nothing. `pinned=True` pins every node of the batch (a node built with
        `pinned=True` is pinned either way): see `pin`.
        """
        request = _append_request(
            _session_id(session),
            nodes,
            branch,
            function_id,
            expected_head_id,
            idempotency_key,
            pinned,
        )
        return _appended(self._call("Append", request))

    def append_many(
        self,
        session: SessionRef,
        batches: Iterable[Sequence[pb.NodeInput] | AppendBatch],
        branch: str = "main",
        *,
        function_id: str | None = None,
    ) -> list[Appended]:
        """Many appends over one stream (`AppendStream`), for imports and bulk writes: the
        requests the server finds waiting together are written in one transaction and answered
        at once, instead of one round trip and one commit per `append`.

        Each batch is one request, checked exactly as `append` checks one (its nodes atomically,
        the pairing rules, compare-and-swap, idempotency key), in order, after the batches
        before it: a list of nodes, or an `AppendBatch` carrying its own `expected_head_id`,
        `idempotency_key` and `pinned`. All go to `branch`, or into the chain of the running
        function `function_id`. Returns one `Appended` per batch, in order. Batches written
        together are still separate appends: for several that must stand or fall together, use
        one `append`.

        `batches` may be a generator: it is read as the stream sends (on gRPC's sending thread),
        so a large import is never held whole, and answers are taken as they come.

        The first refused batch raises its error as `append` would (`Conflict`,
        `FailedPrecondition`, ...), the server's message naming it `requests[N]` (N from 0);
        nothing after it is written, the batches before it stay written, and the error's
        `acknowledged` lists their `Appended`. Any other failure (the server shutting down,
        the client's `timeout`, which bounds the whole stream) raises the same way, with
        `acknowledged` what is known stored: batches after those may or may not be, so give
        batches idempotency keys to send them again safely. An exception raised by `batches`
        itself ends the stream after the batches it did yield (they are written) and
        propagates as it is.
        """
        session_id = _session_id(session)
        failure: list[Exception] = []

        def requests() -> Iterator[pb.AppendRequest]:
            # gRPC would log the caller's exception and cancel the call, writing an arbitrary
            # prefix of what was sent: ending the stream instead writes exactly the batches
            # yielded, and the exception is raised from here, not lost in gRPC's thread.
            try:
                for batch in batches:
                    yield _batch_request(session_id, batch, branch, function_id)
            except Exception as e:
                failure.append(e)

        acknowledged: list[Appended] = []
        call = self.stub.AppendStream(requests(), timeout=self.timeout)
        try:
            for response in call:
                if response.first != len(acknowledged):
                    raise CtxdError(
                        grpc.StatusCode.INTERNAL,
                        f"AppendStream acknowledged from request {response.first}, "
                        f"after {len(acknowledged)} acknowledged",
                        acknowledged,
                    )
                acknowledged.extend(_appended(a) for a in response.appends)
        except grpc.RpcError as e:
            raise from_rpc_error(e, acknowledged) from e
        finally:
            # A no-op once the stream has ended; on a way out through an exception (an
            # interrupt, the check above) it stops the sending.
            call.cancel()
        if failure:
            exc = failure[0]
            if hasattr(exc, "add_note"):
                stored = len(acknowledged)
                exc.add_note(
                    f"ctxd: append_many stored the {stored} batch{'es' * (stored != 1)} "
                    "yielded before it"
                )
            raise exc
        return acknowledged

    def append_user(
        self,
        session: SessionRef,
        text: str,
        branch: str = "main",
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """Appends a user message (`expected_head_id`, `idempotency_key`, `pinned`: see
        `append`)."""
        return self.append(
            session,
            [user_message(text, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def append_assistant(
        self,
        session: SessionRef,
        text: str = "",
        tool_calls: Sequence[ToolCallLike] | None = None,
        branch: str = "main",
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """Appends an assistant message; until each tool call is answered, nothing else fits."""
        return self.append(
            session,
            [assistant_message(text, tool_calls, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def append_tool_result(
        self,
        session: SessionRef,
        call_id: str,
        text: str,
        is_error: bool = False,
        branch: str = "main",
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """Answers one pending tool call of the latest assistant message."""
        return self.append(
            session,
            [tool_result(call_id, text, is_error, pinned=pinned)],
            branch,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def function(
        self,
        session: SessionRef,
        call_id: str,
        input: str,
        expose: Expose = "io",
        branch: str = "main",
    ) -> FunctionCall:
        """A sub-agent call answering the pending tool call `call_id`, as a context manager.

        Entering appends the function_call and yields a handle whose `append_*` methods write
        into the function's own chain; leaving appends the function_result with `handle.output`,
        or with status `error` if an exception escaped (the exception is re-raised).

            with client.function(session, "call_1", "find the bug") as fn:
                fn.append_user("find the bug")
                ...
                fn.output = "it is in parse()"
        """
        return FunctionCall(self, _session_id(session), call_id, input, expose, branch=branch)

    def create_branch(
        self, session: SessionRef, name: str, from_node_id: str | None = None
    ) -> Branch:
        """A new branch at `from_node_id` (None: a branch with no head). Forking never copies."""
        request = pb.CreateBranchRequest(
            session_id=_session_id(session), name=name, from_node_id=from_node_id or ""
        )
        return Branch.from_pb(self._call("CreateBranch", request))

    def reset_branch(
        self,
        session: SessionRef,
        name: str,
        to_node_id: str | None,
        *,
        expected_head_id: str | None = None,
    ) -> Branch:
        """Moves branch `name` to `to_node_id` (a top-level node; None: no head), like
        `git reset`: no node changes. With `expected_head_id` (`""`: none), only if the head is
        still that one, else `Conflict`."""
        request = pb.ResetBranchRequest(
            session_id=_session_id(session), name=name, to_node_id=to_node_id or ""
        )
        if expected_head_id is not None:
            request.expected_head_id = expected_head_id
        return Branch.from_pb(self._call("ResetBranch", request))

    def log(
        self,
        session: SessionRef,
        branch: str = "main",
        *,
        node_id: str | None = None,
        limit: int = 100,
    ) -> list[Node]:
        """Up to `limit` nodes walking parent links from the branch head (or `node_id`), newest
        first, like `git log`; pages are followed for you."""
        nodes: list[Node] = []
        token = ""
        while len(nodes) < limit:
            request = pb.LogRequest(
                session_id=_session_id(session),
                branch="" if node_id else branch,
                node_id=node_id or "",
                limit=min(limit - len(nodes), 1000),
                page_token=token,
            )
            r = self._call("Log", request)
            nodes.extend(Node.from_pb(n) for n in r.nodes)
            token = r.next_page_token
            if not token or not r.nodes:
                break
        return nodes

    def pin(self, session: SessionRef, *node_ids: str) -> list[str]:
        """Pins nodes: no render step ever reduces them, and a summary covering one shows it
        verbatim right after the summary. Idempotent; nodes stay immutable. Returns every
        pinned node of the session after the call, oldest pin first."""
        request = pb.PinRequest(session_id=_session_id(session), node_ids=list(node_ids))
        return list(self._call("Pin", request).pinned_ids)

    def unpin(self, session: SessionRef, *node_ids: str) -> list[str]:
        """Unpins nodes; returns every node of the session still pinned."""
        request = pb.PinRequest(session_id=_session_id(session), node_ids=list(node_ids))
        return list(self._call("Unpin", request).pinned_ids)

    # ------------------------------------------------------------ rendering

    def render(
        self,
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
        strict_format: bool = False,
    ) -> RenderResult:
        """The context of the next model request, fitted to `budget`, with a report.

        `budget` is a context window (int) or a dict of the five budget parts; None renders
        everything untouched. `policy` holds `RenderPolicy` fields; `reactive=True` is for a
        provider that just refused the request as too long. The target is `branch` unless
        `node_id` or `function_id` (a running sub-agent's chain) is given. A media part the
        format cannot carry where it stands is sent as `[<mime> attachment]` text and listed in
        `uncarried`; with `strict_format=True` the render is refused instead (`InvalidArgument`
        naming the node).
        """
        request = pb.RenderRequest(
            session_id=_session_id(session),
            tokenizer=tokenizer,
            callers=_choice(_CALLERS, callers, "callers"),
            policy=self._policy(policy, reactive),
            now_unix_ms=now_unix_ms,
            format=_choice(_FORMATS, format, "format"),
            strict_format=strict_format,
        )
        self._target(request, branch, node_id, function_id)
        if budget is not None:
            request.budget.CopyFrom(budget_pb(budget))
        r = self._call("Render", request)
        if format == "neutral":
            messages: Any = [neutral_message(m) for m in r.messages]
        else:
            messages = self._document(r.messages_json, "Render", "messages_json")
        return RenderResult(
            messages=messages,
            report=ContextReport.from_pb(r.report),
            format=format,
            head_id=r.head_id,
            head_hash=r.head_hash,
            total_tokens=r.total_tokens,
            tokenizer=r.tokenizer,
            uncarried=[UncarriedPart(u.node_id, u.part_index, u.mime_type) for u in r.uncarried],
            raw=r,
        )

    def context_stats(
        self,
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
    ) -> ContextReport:
        """The report `render` would give, without the messages: for a context panel."""
        request = pb.ContextStatsRequest(
            session_id=_session_id(session),
            tokenizer=tokenizer,
            callers=_choice(_CALLERS, callers, "callers"),
            policy=self._policy(policy, reactive),
            now_unix_ms=now_unix_ms,
        )
        self._target(request, branch, node_id, function_id)
        if budget is not None:
            request.budget.CopyFrom(budget_pb(budget))
        return ContextReport.from_pb(self._call("ContextStats", request))

    # ------------------------------------------------------------ recall

    def recall(self, session: SessionRef, reference: str, max_chars: int | None = None) -> Recalled:
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
            session_id=_session_id(session), reference=reference, max_chars=max_chars or 0
        )
        return Recalled.from_pb(self._call("Recall", request))

    def recall_tool(self) -> RecallToolDefinitions:
        """The recall tool's definition in the three API shapes, as the server gives it. The same
        definition is a constant of this package (`recall_tool_definition`), so registering the
        tool needs no call."""
        r = self._call("RecallTool", pb.RecallToolRequest())
        return RecallToolDefinitions(
            name=r.name,
            anthropic=json.loads(r.anthropic_json),
            openai=json.loads(r.openai_json),
            responses=json.loads(r.responses_json),
            raw=r,
        )

    @staticmethod
    def _policy(policy: Mapping[str, Any] | None, reactive: bool) -> pb.RenderPolicy:
        p = pb.RenderPolicy(**(policy or {}))
        if reactive:
            p.reactive = True
        return p

    @staticmethod
    def _target(request: Any, branch: str, node_id: str | None, function_id: str | None) -> None:
        if function_id:
            request.function_id = function_id
        elif node_id:
            request.node_id = node_id
        else:
            request.branch = branch

    @staticmethod
    def _document(text: str, rpc: str, field: str) -> Any:
        # An empty field for a provider format means a server that predates provider formats:
        # failing loudly beats handing a model an empty conversation.
        if not text:
            raise CtxdError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{rpc} answered no {field}; the server does not support provider formats",
            )
        return json.loads(text)

    # ------------------------------------------------------------ summaries

    def prepare_compaction(
        self,
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
    ) -> Compaction:
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
            session_id=_session_id(session),
            branch=branch,
            budget=budget_pb(budget),
            tokenizer=tokenizer,
            retain_turns=retain_turns,
            instructions=instructions,
            max_tool_result_chars=max_tool_result_chars,
            format=_choice(_FORMATS, format, "format"),
            from_node_id=from_node_id or "",
            to_node_id=to_node_id or "",
            cache_sharing_request=cache_sharing_request,
        )
        if policy is not None:
            request.policy.CopyFrom(self._policy(policy, False))
        r = self._call("PrepareCompaction", request)
        if format == "neutral":
            summary_input: Any = [neutral_message(m) for m in r.summary_input]
        elif r.needed or r.summary_input_json:
            summary_input = self._document(
                r.summary_input_json, "PrepareCompaction", "summary_input_json"
            )
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

    def commit_summary(self, compaction: Compaction | str, text: str, model: str) -> Outcome:
        """Lays the summary over the prepared range if that strictly shrinks the context; a
        summary that would not is answered (`applied=False`, `reason`), not raised."""
        request = pb.CommitSummaryRequest(
            compaction_id=_compaction_id(compaction), text=text, model=model
        )
        return Outcome.from_pb(self._call("CommitSummary", request))

    def cancel_compaction(self, compaction: Compaction | str, reason: str = "") -> None:
        """Records that a prepared compaction will not be committed."""
        self._call(
            "CancelCompaction",
            pb.CancelCompactionRequest(compaction_id=_compaction_id(compaction), reason=reason),
        )

    def compact(
        self,
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
    ) -> Outcome:
        """Prepare, the server's own summarizer, and commit in one call; needs a server started
        with `--summarizer-url` (else `FailedPrecondition`). `from_node_id` and `to_node_id`
        make a segment summary, as in `prepare_compaction`.

        `request_form` is how the summarizer is asked: `"cache_sharing"` (the context as your
        renders give it with `policy`, then the instruction) or `"range"` (the covered range
        alone). None: the server's choice (cache sharing for a rolling summary that fits the
        summarizer's window)."""
        request = pb.CompactRequest(
            session_id=_session_id(session),
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
            request.request_form = _choice(_REQUEST_FORMS, request_form, "request_form")
        if policy is not None:
            request.policy.CopyFrom(self._policy(policy, False))
        return Outcome.from_pb(self._call("Compact", request))

    def list_summaries(self, session: SessionRef, branch: str = "main") -> Summaries:
        """Every summary of the session and every compaction event: the audit trail."""
        r = self._call(
            "ListSummaries", pb.ListSummariesRequest(session_id=_session_id(session), branch=branch)
        )
        return Summaries(
            summaries=[SummaryRecord.from_pb(s) for s in r.summaries],
            events=[CompactionEvent.from_pb(e) for e in r.events],
        )


def _compaction_id(compaction: Compaction | str) -> str:
    return compaction.compaction_id if isinstance(compaction, Compaction) else compaction


class FunctionCall:
    """A running sub-agent (function) call; see `Client.function`.

    Set `output` before the block ends: it is what the caller sees as the call's result. After
    the block, `result` is the append of the function_result.
    """

    def __init__(
        self,
        client: Client,
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
        self.expose = _choice(_EXPOSE, expose, "expose")
        self.branch = branch
        self.parent_function_id = parent_function_id
        self.function_id = ""
        """The function_call node's id, set on entering: render it with `function_id=`."""
        self.output = ""
        self.result: Appended | None = None

    def _append_caller(self, node: pb.NodeInput) -> Appended:
        # The call and its result go on the caller's chain: a branch, or the enclosing function.
        return self.client.append(
            self.session_id, [node], self.branch, function_id=self.parent_function_id
        )

    def __enter__(self) -> FunctionCall:
        call = pb.FunctionCall(call_id=self.call_id, input=self.input, expose=self.expose)
        self.function_id = self._append_caller(pb.NodeInput(function_call=call)).node_id
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc is None:
            # A clean exit with unanswered calls inside is a bug in the caller: let the server's
            # FailedPrecondition say so.
            self._close(pb.FUNCTION_STATUS_COMPLETED, self.output)
            return False
        failure = f"{type(exc).__name__}: {exc}"
        try:
            # A sub-agent that dies mid-tool-call leaves calls unanswered, and the server will not
            # close a function over them; left open, the caller's session could never go on.
            self._answer_pending(f"not run: the sub-agent stopped ({failure})")
            self._close(pb.FUNCTION_STATUS_ERROR, self.output or failure)
        except CtxdError as err:
            # The sub-agent's own exception is the one that matters; keep it and say what else
            # went wrong rather than replacing it.
            if hasattr(exc, "add_note"):
                exc.add_note(f"ctxd: the function call could not be closed: {err}")
        return False

    def _close(self, status: pb.FunctionStatus, output: str) -> None:
        result = pb.FunctionResult(call_id=self.call_id, output=output, status=status)
        self.result = self._append_caller(pb.NodeInput(function_result=result))

    def _answer_pending(self, text: str) -> None:
        """Answers the calls of the chain's latest assistant message that have no result yet."""
        chain = self.client.render(
            self.session_id, function_id=self.function_id, callers="none", format="neutral"
        ).messages
        answered: set[str] = set()
        pending: list[str] = []
        for m in reversed([m for m in chain if m.get("function_id") == self.function_id]):
            if m["role"] == "tool":
                answered.add(m["tool_call_id"])
                continue
            if m["role"] == "assistant":
                pending = [c["id"] for c in m.get("tool_calls", []) if c["id"] not in answered]
            break
        if pending:
            self.append([tool_result(call_id, text, is_error=True) for call_id in pending])

    def append(
        self,
        nodes: Sequence[pb.NodeInput],
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """Appends nodes to this function's own chain (see `Client.append`)."""
        if not self.function_id:
            raise RuntimeError("the function call has not started: use it in a `with` block")
        return self.client.append(
            self.session_id,
            nodes,
            function_id=self.function_id,
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
            pinned=pinned,
        )

    def append_user(
        self,
        text: str,
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """A user message in the function's chain (typically the sub-agent's task)."""
        return self.append(
            [user_message(text, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def append_assistant(
        self,
        text: str = "",
        tool_calls: Sequence[ToolCallLike] | None = None,
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """An assistant message in the function's chain."""
        return self.append(
            [assistant_message(text, tool_calls, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def append_tool_result(
        self,
        call_id: str,
        text: str,
        is_error: bool = False,
        *,
        expected_head_id: str | None = None,
        idempotency_key: str = "",
        pinned: bool = False,
    ) -> Appended:
        """A tool result in the function's chain."""
        return self.append(
            [tool_result(call_id, text, is_error, pinned=pinned)],
            expected_head_id=expected_head_id,
            idempotency_key=idempotency_key,
        )

    def function(self, call_id: str, input: str, expose: Expose = "io") -> FunctionCall:
        """A nested sub-agent call answering a pending tool call of this function's chain."""
        return FunctionCall(
            self.client,
            self.session_id,
            call_id,
            input,
            expose,
            parent_function_id=self.function_id,
        )
