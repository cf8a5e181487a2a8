"""A thin, typed wrapper over the `ctxd.v1.ContextStore` gRPC service (blocking calls; see
`AsyncClient` in `ctxd_client.aio` for asyncio).

The wrapper adds only what every agent host would otherwise write itself: plain arguments instead
of protobuf messages, provider documents parsed from JSON, dataclasses for answers, exceptions
that keep the server's message, a context manager that closes a sub-agent call even when the
sub-agent fails, exports written to a file, and a watch that resumes after a dropped connection.
Every RPC has a method; the generated stub is still one attribute away, `Client.stub`.

The requests and answers of the unary RPCs are built in `_ops`, shared with `AsyncClient`; this
module only runs them.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import IO, Any, Concatenate, Literal, ParamSpec, TypeVar

import grpc

from . import _ops as ops
from ._ops import (
    Callers,
    ExportFormat,
    Expose,
    Format,
    FunctionScope,
    ImportFormat,
    ImportSource,
    Reasoning,
    RequestForm,
    SessionRef,
    ToolCallLike,
    assistant_message,
    system_message,
    tool_call,
    tool_result,
    user_message,
)
from ._proto import ctxd_pb2 as pb
from ._proto import ctxd_pb2_grpc as pb_grpc
from .errors import CtxdError, from_rpc_error
from .types import (
    AppendBatch,
    Appended,
    ExportChunk,
    Exported,
    Imported,
    WatchEvent,
)

__all__ = [
    "Callers",
    "Client",
    "ExportFormat",
    "Expose",
    "Format",
    "FunctionCall",
    "ImportFormat",
    "ImportSource",
    "Reasoning",
    "RequestForm",
    "SessionRef",
    "ToolCallLike",
    "assistant_message",
    "system_message",
    "tool_call",
    "tool_result",
    "user_message",
]

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(exchange: Callable[P, ops.Exchange[R]]) -> Callable[Concatenate[Client, P], R]:
    """A `Client` method running `exchange`, one blocking call per request it yields."""

    def method(self: Client, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(exchange(*args, **kwargs))

    return ops.bind(exchange, method, "Client")  # type: ignore[no-any-return]


def _blocking_in(
    exchange: Callable[Concatenate[FunctionScope, P], ops.Exchange[R]],
) -> Callable[Concatenate[FunctionCall, P], R]:
    """A `FunctionCall` method running `exchange` on the handle, through its client."""

    def method(self: FunctionCall, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.client._run(exchange(self, *args, **kwargs))

    return ops.bind(exchange, method, "FunctionCall")  # type: ignore[no-any-return]


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
        self._header = ops.bearer_header(api_key)

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


# ---------------------------------------------------------------- the client


class Client:
    """A connection to a ctxd server. Use it as a context manager so the channel gets closed.

    `timeout` is the deadline in seconds for each call (None: no deadline; a `watch` has none).
    `api_key` is sent as `authorization: Bearer <key>` with every call, the generated `stub`'s
    included. TLS is on when `tls=True` or any of `root_certificates` (PEM bytes of the CA to
    trust; the system's roots without it), `private_key` and `certificate_chain` (PEM bytes of a
    client certificate, for a server that requires one) is given. Pass `channel` to use a
    channel you configured yourself; the client then leaves closing it to you (`api_key` still
    applies).
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
        credentials = ops.channel_credentials(
            channel is not None, tls, root_certificates, private_key, certificate_chain
        )
        bearer = _BearerKey(api_key) if api_key is not None else None
        self._owns_channel = channel is None
        if channel is None:
            if credentials is not None:
                channel = grpc.secure_channel(address, credentials)
            else:
                channel = grpc.insecure_channel(address)
        self._channel = channel
        if bearer is not None:
            channel = grpc.intercept_channel(channel, bearer)
        self.stub = pb_grpc.ContextStoreStub(channel)
        """The generated stub, for what the methods do not cover."""

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

    def _run(self, exchange: ops.Exchange[R]) -> R:
        """Makes each call `exchange` asks for and returns its answer."""
        try:
            rpc, request = next(exchange)
            while True:
                rpc, request = exchange.send(self._call(rpc, request))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # ------------------------------------------------------------ sessions

    create_session = _blocking(ops.create_session)
    get_session = _blocking(ops.get_session)
    list_sessions = _blocking(ops.list_sessions)
    list_gateway_calls = _blocking(ops.list_gateway_calls)
    delete_session = _blocking(ops.delete_session)

    # ------------------------------------------------------------ appends

    append = _blocking(ops.append)
    append_user = _blocking(ops.append_user)
    append_assistant = _blocking(ops.append_assistant)
    append_tool_result = _blocking(ops.append_tool_result)

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
        session_id = ops.session_id(session)
        failure: list[Exception] = []

        def requests() -> Iterator[pb.AppendRequest]:
            # gRPC would log the caller's exception and cancel the call, writing an arbitrary
            # prefix of what was sent: ending the stream instead writes exactly the batches
            # yielded, and the exception is raised from here, not lost in gRPC's thread.
            try:
                for batch in batches:
                    yield ops.batch_request(session_id, batch, branch, function_id)
            except Exception as e:
                failure.append(e)

        answers = ops.AppendStreamAnswers()
        call = self.stub.AppendStream(requests(), timeout=self.timeout)
        try:
            for response in call:
                answers.add(response)
        except grpc.RpcError as e:
            raise from_rpc_error(e, answers.acknowledged) from e
        finally:
            # A no-op once the stream has ended; on a way out through an exception (an
            # interrupt, the check above) it stops the sending.
            call.cancel()
        if failure:
            ops.note_stored(failure[0], len(answers.acknowledged))
            raise failure[0]
        return answers.acknowledged

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
        return FunctionCall(self, ops.session_id(session), call_id, input, expose, branch=branch)

    # ------------------------------------------------------------ reading and branches

    get_nodes = _blocking(ops.get_nodes)
    log = _blocking(ops.log)
    create_branch = _blocking(ops.create_branch)
    list_branches = _blocking(ops.list_branches)
    delete_branch = _blocking(ops.delete_branch)
    reset_branch = _blocking(ops.reset_branch)
    pin = _blocking(ops.pin)
    unpin = _blocking(ops.unpin)

    # ------------------------------------------------------------ rendering and recall

    render = _blocking(ops.render)
    context_stats = _blocking(ops.context_stats)
    recall = _blocking(ops.recall)
    recall_tool = _blocking(ops.recall_tool)

    # ------------------------------------------------------------ summaries

    prepare_compaction = _blocking(ops.prepare_compaction)
    commit_summary = _blocking(ops.commit_summary)
    cancel_compaction = _blocking(ops.cancel_compaction)
    compact = _blocking(ops.compact)
    list_summaries = _blocking(ops.list_summaries)

    # ------------------------------------------------------------ import and export

    def import_session(
        self,
        source: ImportSource,
        format: ImportFormat = "auto",
        *,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str = "",
    ) -> Imported:
        """Imports a session file into a new session, in one transaction, streamed in chunks:
        `source` is the file's bytes, a path (str or PathLike), a binary file, or an iterable of
        byte chunks. `format` is `ctxd_jsonl` (what `export_session` writes: every branch,
        function chain, summary and pin), `neutral_jsonl`, `claude_code_jsonl`,
        `openai_messages`, or `auto` (detected from the first line). A malformed file raises
        `InvalidArgument` naming the line and field, and leaves nothing behind. A retry with the
        same `idempotency_key` returns the session the first import created."""
        with ops.import_data(source) as data:
            feed = ops.ImportFeed(data, format, metadata, idempotency_key)
            try:
                response = self.stub.ImportSession(iter(feed), timeout=self.timeout)
            except grpc.RpcError as e:
                feed.raise_failure()
                raise from_rpc_error(e) from e
        return Imported.from_pb(response)

    def export_session(
        self, session: SessionRef, format: ExportFormat = "ctxd_jsonl", branch: str = "main"
    ) -> Iterator[ExportChunk]:
        """The session streamed out at one consistent head, as chunks to concatenate:
        `ctxd_jsonl` (the whole session: every branch, function chain, summary and pin, which
        `import_session` reads back), or one `branch` as `openai_messages` (a chat-completions
        `messages` array) or `claude_code_jsonl`. The first chunk carries the heads and the
        warnings (what the format could not carry). Leaving the loop early cancels the call."""
        # Built before the first chunk is asked for, so that a bad format fails here.
        request = ops.export_request(session, format, branch)
        return self._export(request)

    def _export(self, request: pb.ExportSessionRequest) -> Iterator[ExportChunk]:
        call = self.stub.ExportSession(request, timeout=self.timeout)
        try:
            for chunk in call:
                yield ExportChunk.from_pb(chunk)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        finally:
            call.cancel()

    def export_session_to(
        self,
        session: SessionRef,
        to: str | os.PathLike[str] | IO[bytes],
        format: ExportFormat = "ctxd_jsonl",
        branch: str = "main",
    ) -> Exported:
        """`export_session` written to `to`: a path (written whole or not at all: the chunks go
        to a temporary file beside it, renamed over it at the end) or a binary file open for
        writing (left open)."""
        with ops.ExportWriter(to, format) as writer:
            for chunk in self.export_session(session, format, branch):
                writer.write(chunk)
        return writer.exported()

    # ------------------------------------------------------------ watch

    def watch(
        self,
        session: SessionRef,
        branch: str = "",
        *,
        after_cursor: str = "",
        after_node_id: str = "",
        reconnect_attempts: int = 8,
    ) -> Iterator[WatchEvent]:
        """Follows the session (or one `branch`) as it changes, as an endless iterator of
        `WatchEvent`s: first `started`, then new nodes, head moves, branches created and
        deleted, and compaction events, in commit order per branch; `deleted` ends it.

        A dropped connection (or a server restarting, or one that ended a watcher that fell
        behind) is resumed from the last event's cursor, so no event is lost or repeated; up to
        `reconnect_attempts` calls in a row may fail before the error is raised (0: never
        resume). Resume a watch you stopped with `after_cursor` (an event's `cursor`), or a
        one-branch watch with `after_node_id`. The client's `timeout` does not apply: leave the
        loop (or close the iterator) to stop, which cancels the call."""
        state = ops.WatchState(session, branch, after_cursor, after_node_id, reconnect_attempts)
        while True:
            call = self.stub.Watch(state.request())
            try:
                for response in call:
                    event = state.accept(response)
                    if event is not None:
                        yield event
                return
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                delay = state.retry_after(error)
                if delay is None:
                    raise error from e
            finally:
                call.cancel()
            time.sleep(delay)

    # ------------------------------------------------------------ admin

    backup_database = _blocking(ops.backup_database)
    collect_garbage = _blocking(ops.collect_garbage)


class FunctionCall(FunctionScope):
    """A running sub-agent (function) call; see `Client.function`.

    Set `output` before the block ends: it is what the caller sees as the call's result. After
    the block, `result` is the append of the function_result.
    """

    client: Client

    def __enter__(self) -> FunctionCall:
        self.client._run(ops.fn_open(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc is None:
            self.client._run(ops.fn_close(self, None))
            return False
        try:
            self.client._run(ops.fn_close(self, f"{type(exc).__name__}: {exc}"))
        except CtxdError as err:
            # The sub-agent's own exception is the one that matters; keep it and say what else
            # went wrong rather than replacing it.
            if hasattr(exc, "add_note"):
                exc.add_note(f"ctxd: the function call could not be closed: {err}")
        return False

    append = _blocking_in(ops.fn_append)
    append_user = _blocking_in(ops.fn_append_user)
    append_assistant = _blocking_in(ops.fn_append_assistant)
    append_tool_result = _blocking_in(ops.fn_append_tool_result)

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
